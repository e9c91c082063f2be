"""The transaction interface (``memable._store.transaction``) on a SQLite connection.

SQLite serialises writers database-wide: a body inside the store's write transaction
(``group_commit``) sees no other writer between its read and its write, so locking a row is reading
it. No other engine listens here: ``notify`` sends nothing (they poll)."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Mapping
from typing import Any

from .._store.transaction import LOCK_INSTANCE, SQLITE, Cursor, Dialect


class SQLiteTransaction:
    """One body's view of the store's open transaction on ``conn``, for ``owner``."""

    __slots__ = ("_conn", "owner")
    dialect: Dialect = SQLITE

    def __init__(self, conn: sqlite3.Connection, owner: str) -> None:
        self._conn = conn
        self.owner = owner

    def execute(self, template: str, params: Mapping[str, Any] | None = None) -> Cursor:
        return self._conn.execute(SQLITE.spell(template), {} if params is None else params)

    def executemany(self, template: str, params: Iterable[Mapping[str, Any]]) -> None:
        self._conn.executemany(SQLITE.spell(template), params)

    def execute_each(
        self, *statements: tuple[str, Mapping[str, Any]], last: bool = False
    ) -> list[list[Any]]:
        return [self.execute(template, params).fetchall() for template, params in statements]

    def write(self, template: str, params: Mapping[str, Any]) -> None:
        self._conn.execute(SQLITE.spell(template), params)

    def lock_instance(self, workflow: str, instance_id: str) -> tuple[str, str | None] | None:
        row = self.execute(LOCK_INSTANCE, {"workflow": workflow, "instance_id": instance_id})
        found = row.fetchone()
        return None if found is None else (found[0], found[1])

    def notify(self, kind: str, workflow: str | None, instance_id: str | None) -> None:
        pass

    def relax_commit(self) -> None:
        pass  # the store's durability is the connection's (``synchronous``), for all
