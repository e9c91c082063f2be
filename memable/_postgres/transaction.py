"""The transaction interface (``memable._store.transaction``) on a PostgreSQL connection.

A body locks the rows it decides on (``FOR UPDATE``, ``FOR SHARE``), so engines take turns on
an instance. ``notify`` and a relaxed durability go with the ``COMMIT`` (``Opening``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import psycopg

from .._store.transaction import LOCK_INSTANCE, POSTGRESQL, Cursor, Dialect
from . import batch
from .connections import Opening
from .listener import payload

#: What ``relax_commit`` sends with the ``COMMIT``: its flush is not waited for.
_RELAXED = "SELECT set_config('synchronous_commit', 'off', true)"


class PostgresTransaction:
    """A body's view of a transaction open on ``conn`` for ``owner``, notifying on ``channel``."""

    __slots__ = ("_channel", "_conn", "_opening", "owner")
    dialect: Dialect = POSTGRESQL

    def __init__(self, conn: psycopg.Connection[Any], owner: str, channel: str) -> None:
        self._conn = conn
        self.owner = owner
        self._channel = channel
        # The store's own operation's transaction (None: each statement is one).
        self._opening: Opening | None = getattr(conn, "opening", None)

    def execute(self, template: str, params: Mapping[str, Any] | None = None) -> Cursor:
        opening = self._opening
        if opening is None:  # one statement (in a transaction of its own)
            return batch.send(self._conn, [(POSTGRESQL.spell(template), params or {})])[0]
        return opening.execute(self._conn, POSTGRESQL.spell(template), params or {})

    def execute_each(
        self, *statements: tuple[str, Mapping[str, Any]], last: bool = False
    ) -> list[list[Any]]:
        spelled: list[batch.Statement] = [
            (POSTGRESQL.spell(template), params) for template, params in statements]
        if self._opening is None:
            return [batch.send(self._conn, [statement])[0].rows for statement in spelled]
        return self._opening.execute_each(self._conn, spelled, last=last)

    def write(self, template: str, params: Mapping[str, Any]) -> None:
        opening = self._opening
        if opening is None or not opening.begun:  # (the BEGIN goes with a statement now)
            self.execute(template, params)
        else:
            opening.later.append((POSTGRESQL.spell(template), params))

    def executemany(self, template: str, params: Iterable[Mapping[str, Any]]) -> None:
        opening = self._opening
        if opening is not None and (not opening.begun or opening.later):
            opening.flush(self._conn)  # the BEGIN, and what waits, go before the batch
        with self._conn.cursor() as cursor:
            cursor.executemany(POSTGRESQL.spell(template), params)

    def lock_instance(self, workflow: str, instance_id: str) -> tuple[str, str | None] | None:
        row = self.execute(LOCK_INSTANCE, {"workflow": workflow, "instance_id": instance_id})
        found = row.fetchone()
        return None if found is None else (found[0], found[1])

    def notify(self, kind: str, workflow: str | None, instance_id: str | None) -> None:
        text = payload(kind, self.owner, workflow, instance_id or "")
        notify = ("SELECT pg_notify(%s, %s)", (self._channel, text))
        if self._opening is None:
            self._conn.execute(*notify)
        else:
            self._opening.at_commit.append(notify)

    def relax_commit(self) -> None:
        if self._opening is not None:
            self._opening.at_commit.append((_RELAXED, None))
