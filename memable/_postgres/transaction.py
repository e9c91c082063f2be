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

#: A notice to the engines watching the store (``Transaction.notify``).
_NOTIFY = "SELECT pg_notify(%(channel)s, %(payload)s)"
#: What ``relax_commit`` sends with the ``COMMIT``: its flush is not waited for.
_RELAXED = "SELECT set_config('synchronous_commit', 'off', true)"


class PostgresTransaction:
    """A body's view of a transaction open on ``conn`` for ``owner``, notifying on ``channel``."""

    __slots__ = ("_channel", "_conn", "_opening", "_pending", "_sent", "owner")
    dialect: Dialect = POSTGRESQL

    def __init__(self, conn: psycopg.Connection[Any], owner: str, channel: str) -> None:
        self._conn = conn
        self.owner = owner
        self._channel = channel
        # The store's own operation's transaction (None: each statement is one).
        self._opening: Opening | None = getattr(conn, "opening", None)
        # Without one: notices asked for before the first statement, which go in its text
        # (its transaction), and whether a statement went (a notice after goes alone).
        self._pending: list[batch.Statement] = []
        self._sent = False

    def execute(self, template: str, params: Mapping[str, Any] | None = None) -> Cursor:
        opening = self._opening
        if opening is None:  # one statement (in a transaction of its own)
            return self._alone([(POSTGRESQL.spell(template), params or {})])[-1]
        return opening.execute(self._conn, POSTGRESQL.spell(template), params or {})

    def _alone(self, statements: list[batch.Statement]) -> list[batch.Read]:
        """Send ``statements`` as one text, after the notices that wait for them."""
        pending, self._pending, self._sent = self._pending, [], True
        return batch.send(self._conn, [*pending, *statements])[len(pending):]

    def execute_each(
        self, *statements: tuple[str, Mapping[str, Any]], last: bool = False
    ) -> list[list[Any]]:
        spelled: list[batch.Statement] = [
            (POSTGRESQL.spell(template), params) for template, params in statements]
        if self._opening is None:
            return [self._alone([statement])[0].rows for statement in spelled]
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
        notify = (_NOTIFY, {"channel": self._channel, "payload": text})
        if self._opening is not None:
            self._opening.at_commit.append(notify)
        elif self._sent:  # after the statement, in a transaction of its own
            batch.send(self._conn, [notify])
        else:  # in the text (the transaction) of the statement to come
            self._pending.append(notify)

    def relax_commit(self) -> None:
        if self._opening is not None:
            self._opening.at_commit.append((_RELAXED, None))
