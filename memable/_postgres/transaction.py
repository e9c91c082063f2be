"""The transaction interface (``memable._store.transaction``) on a PostgreSQL connection.

A body locks the rows it decides on (``FOR UPDATE``, ``FOR SHARE``), so
concurrent engines' transactions on one instance take turns. ``notify``
queues a NOTIFY on the store's channel, which the server sends to the other
engines' listeners when the transaction commits (``listener``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import psycopg

from .._store.transaction import LOCK_INSTANCE, POSTGRESQL, Cursor, Dialect
from .listener import payload


class PostgresTransaction:
    """One body's view of an open transaction on ``conn``, for ``owner``, telling other
    engines on ``channel``."""

    __slots__ = ("_channel", "_conn", "owner")
    dialect: Dialect = POSTGRESQL

    def __init__(self, conn: psycopg.Connection[Any], owner: str, channel: str) -> None:
        self._conn = conn
        self.owner = owner
        self._channel = channel

    def execute(self, template: str, params: Mapping[str, Any] | None = None) -> Cursor:
        return self._conn.execute(POSTGRESQL.spell(template), params)

    def executemany(self, template: str, params: Iterable[Mapping[str, Any]]) -> None:
        with self._conn.cursor() as cursor:
            cursor.executemany(POSTGRESQL.spell(template), params)

    def lock_instance(self, workflow: str, instance_id: str) -> tuple[str, str | None] | None:
        row = self.execute(LOCK_INSTANCE, {"workflow": workflow, "instance_id": instance_id})
        found = row.fetchone()
        return None if found is None else (found[0], found[1])

    def notify(self, kind: str, workflow: str | None, instance_id: str | None) -> None:
        text = payload(kind, self.owner, workflow, instance_id or "")
        self._conn.execute("SELECT pg_notify(%s, %s)", (self._channel, text))
