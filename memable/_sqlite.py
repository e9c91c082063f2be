"""The SQLite store: schema, migrations and every statement memable runs.

One connection per engine, shared by all threads behind one lock. The
connection is in driver autocommit mode (``isolation_level=None``): a single
write statement is its own transaction and commits before ``execute``
returns; multi-statement writes take ``BEGIN IMMEDIATE`` explicitly.
sqlite-utils creates and migrates the tables and serves the reads people
make (metadata, listings); the per-step hot path uses fixed SQL on the
connection, because sqlite-utils introspects the schema on every call.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, Literal, TypeVar

import cattrs
import sqlite_utils

from ._errors import StorageError
from ._records import StatusName, StepRecord
from ._store import InstanceRow, RunSnapshot, StepWrite, StoredStep

#: The schema this code writes; ``PRAGMA user_version`` of every store.
SCHEMA_VERSION = 1
#: Seconds a statement waits for another process's lock before failing.
BUSY_TIMEOUT = 5.0

Synchronous = Literal["full", "normal"]

_INSTANCE_COLUMNS = {
    "workflow": str,
    "instance_id": str,
    "status": str,
    "message": str,
    "input": str,
    "input_type": str,
    "output": str,
    "output_type": str,
    "created_at": str,
    "updated_at": str,
    "completed_at": str,
}
_STEP_COLUMNS = {
    "workflow": str,
    "instance_id": str,
    "key": str,
    "seq": int,
    "kind": str,
    "state": str,
    "result": str,
    "result_type": str,
    "status": str,
    "error": str,
    "attempts": int,
    "completed_at": str,
}

_rows = cattrs.Converter()
_rows.register_structure_hook(datetime, lambda value, _: datetime.fromisoformat(value))

_INSERT_INSTANCE = (
    f"INSERT OR IGNORE INTO instances ({', '.join(_INSTANCE_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_INSTANCE_COLUMNS))})"
)
# A completed step is never overwritten: that is the exactly-once record.
_UPSERT_STEP = """
INSERT INTO steps (workflow, instance_id, key, seq, kind, state, result, result_type,
                   status, error, attempts, completed_at)
VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 1, ?)
ON CONFLICT (workflow, instance_id, key) DO UPDATE SET
    state = excluded.state, result = excluded.result, result_type = excluded.result_type,
    status = excluded.status, error = excluded.error, attempts = steps.attempts + 1,
    completed_at = excluded.completed_at
WHERE steps.state != 'completed'
"""
_SELECT_RUN_STEPS = (
    "SELECT key, seq, kind, state, result, result_type, status, attempts "
    "FROM steps WHERE workflow = ? AND instance_id = ?"
)

T = TypeVar("T")


def _migrate_to_1(db: sqlite_utils.Database) -> None:
    db["instances"].create(  # type: ignore[union-attr]
        _INSTANCE_COLUMNS,
        pk=("workflow", "instance_id"),
        not_null={"status", "input", "created_at", "updated_at"},
    )
    db["instances"].create_index(  # type: ignore[union-attr]
        ["workflow", "created_at"], index_name="instances_by_workflow"
    )
    db["steps"].create(  # type: ignore[union-attr]
        _STEP_COLUMNS,
        pk=("workflow", "instance_id", "key"),
        not_null={"seq", "kind", "state", "attempts"},
    )


#: Migration to version N is _MIGRATIONS[N - 1]; each runs in the opening transaction.
_MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_migrate_to_1]


class SQLiteStore:
    """A memable store in one SQLite file, or in memory when ``path`` is None."""

    def __init__(self, path: str | os.PathLike[str] | None, synchronous: Synchronous) -> None:
        self._where = ":memory:" if path is None else os.fspath(path)
        try:
            conn = sqlite3.connect(
                self._where,
                timeout=BUSY_TIMEOUT,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open {self._where} ({exc})") from exc
        # _lock guards _conn and _db: every use of the connection, from any thread.
        self._lock = threading.Lock()
        self._closed = False
        self._conn = conn
        self._db = sqlite_utils.Database(conn)
        try:
            self._check_and_migrate(file_backed=path is not None, synchronous=synchronous)
        except BaseException:
            conn.close()
            raise

    # ------------------------------------------------------------------ opening

    def _check_and_migrate(self, *, file_backed: bool, synchronous: Synchronous) -> None:
        # Read-only checks first: a file that is not ours must be left byte for byte.
        version, tables = self._inspect()
        if version > SCHEMA_VERSION:
            raise StorageError(
                f"{self._where} has schema version {version}, newer than this memable "
                f"understands ({SCHEMA_VERSION}); upgrade memable to open it"
            )
        if version == 0 and tables:
            raise StorageError(
                f"{self._where} is not a memable store (it has tables "
                f"{', '.join(sorted(tables))} and no memable schema version)"
            )
        if version > 0:
            self._check_columns(tables)
        try:
            if file_backed:
                self._conn.execute("PRAGMA journal_mode = WAL")
            self._conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
            if version < SCHEMA_VERSION:
                self._migrate()
        except sqlite3.Error as exc:
            raise StorageError(f"cannot prepare {self._where} ({exc})") from exc

    def _inspect(self) -> tuple[int, set[str]]:
        try:
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            tables = {
                row[0]
                for row in self._conn.execute(
                    "SELECT name FROM sqlite_master WHERE type = 'table'"
                )
            }
        except sqlite3.DatabaseError as exc:
            raise StorageError(f"{self._where} is not a SQLite database ({exc})") from exc
        return int(version), tables

    def _check_columns(self, tables: set[str]) -> None:
        for table, columns in (("instances", _INSTANCE_COLUMNS), ("steps", _STEP_COLUMNS)):
            have = (
                {c.name for c in self._db[table].columns} if table in tables else set()
            )
            if not set(columns) <= have:
                raise StorageError(
                    f"{self._where} is not a memable store (table {table!r} is missing "
                    f"or lacks columns {', '.join(sorted(set(columns) - have))})"
                )

    def _migrate(self) -> None:
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            # Another process may have migrated while we waited for the lock.
            version = self._conn.execute("PRAGMA user_version").fetchone()[0]
            for step in _MIGRATIONS[version:]:
                step(self._db)
            self._conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise

    # ------------------------------------------------------------------ plumbing

    @contextmanager
    def _using(
        self, what: str, workflow: str | None = None, instance_id: str | None = None,
        key: str | None = None,
    ) -> Iterator[sqlite3.Connection]:
        """Hold the connection; turn sqlite3 errors into StorageError naming the target."""
        with self._lock:
            if self._closed:
                raise StorageError(
                    f"cannot {what}: the store {self._where} is closed",
                    workflow=workflow, instance_id=instance_id, key=key,
                )
            try:
                yield self._conn
            except sqlite3.Error as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise StorageError(
                    f"cannot {what} in {self._where} ({exc})",
                    workflow=workflow, instance_id=instance_id, key=key,
                ) from exc

    # ------------------------------------------------------------------ writes

    def create_instance(self, row: InstanceRow) -> bool:
        values = tuple(_rows.unstructure(row).values())
        with self._using("create the instance", row.workflow, row.instance_id) as conn:
            return conn.execute(_INSERT_INSTANCE, values).rowcount == 1

    def begin_run(self, workflow: str, instance_id: str, *, now: str) -> RunSnapshot | None:
        with self._using("start a run", workflow, instance_id) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                found = conn.execute(
                    "UPDATE instances SET status = 'running', message = NULL, "
                    "updated_at = ?, completed_at = NULL "
                    "WHERE workflow = ? AND instance_id = ? RETURNING *",
                    (now, workflow, instance_id),
                ).fetchone()
                steps = conn.execute(_SELECT_RUN_STEPS, (workflow, instance_id)).fetchall()
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        if found is None:
            return None
        instance = InstanceRow(*found)
        return RunSnapshot(instance, {s[0]: StoredStep(*s) for s in steps})

    def save_step(self, write: StepWrite) -> None:
        completed_at = write.at if write.state == "completed" else None
        with self._using("store the step", write.workflow, write.instance_id, write.key) as conn:
            conn.execute(
                _UPSERT_STEP,
                (
                    write.workflow, write.instance_id, write.key, write.seq, write.kind,
                    write.state, write.result, write.result_type, write.status, write.error,
                    completed_at,
                ),
            )

    def finish(
        self,
        workflow: str,
        instance_id: str,
        *,
        status: StatusName,
        message: str | None,
        output: tuple[str, str | None] | None,
        now: str,
    ) -> None:
        terminal = status in ("completed", "failed", "cancelled")
        text, tag = output if output is not None else (None, None)
        with self._using(f"record the run as {status}", workflow, instance_id) as conn:
            conn.execute(
                "UPDATE instances SET status = ?, message = ?, output = ?, output_type = ?, "
                "updated_at = ?, completed_at = ? WHERE workflow = ? AND instance_id = ?",
                (status, message, text, tag, now, now if terminal else None, workflow,
                 instance_id),
            )

    # ------------------------------------------------------------------ reads

    def get_instance(self, workflow: str, instance_id: str) -> InstanceRow | None:
        with self._using("read the instance", workflow, instance_id):
            rows = list(
                self._db["instances"].rows_where(
                    "workflow = ? AND instance_id = ?", [workflow, instance_id]
                )
            )
        return _rows.structure(rows[0], InstanceRow) if rows else None

    def list_instances(self, workflow: str) -> list[InstanceRow]:
        with self._using("list instances", workflow):
            rows = list(
                self._db["instances"].rows_where(
                    "workflow = ?", [workflow], order_by="created_at, instance_id"
                )
            )
        return [_rows.structure(row, InstanceRow) for row in rows]

    def list_steps(self, workflow: str, instance_id: str) -> list[StepRecord]:
        with self._using("read the steps", workflow, instance_id):
            rows = list(
                self._db["steps"].rows_where(
                    "workflow = ? AND instance_id = ?", [workflow, instance_id], order_by="seq"
                )
            )
        return [_step_record(row) for row in rows]

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._conn.close()


def _step_record(row: dict[str, Any]) -> StepRecord:
    row = dict(row)
    row["result"] = json.loads(row["result"]) if row["state"] == "completed" else None
    return _rows.structure(row, StepRecord)
