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

from ._errors import InstanceFinished, InstanceNotFound, SignalRejected, StorageError
from ._records import StatusName, StepRecord
from ._store import InstanceRow, RunSnapshot, StepWrite, StoredStep

#: The schema this code writes; ``PRAGMA user_version`` of every store.
SCHEMA_VERSION = 2
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
    "waiting_for": str,  # v2: the signal or timer key a suspended instance waits on
}
#: Columns every memable store has had since version 1: what a file must show
#: before we migrate it.
_V1_INSTANCE_COLUMNS = {c: t for c, t in _INSTANCE_COLUMNS.items() if c != "waiting_for"}
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

_TIMER_COLUMNS = {"workflow": str, "instance_id": str, "key": str, "deadline": float}

_rows = cattrs.Converter()
_rows.register_structure_hook(datetime, lambda value, _: datetime.fromisoformat(value))

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
_SELECT_STEP = _SELECT_RUN_STEPS + " AND key = ?"
# A waiting row marks a suspend point or timer reached; it never replaces a row.
_INSERT_WAITING = """
INSERT INTO steps (workflow, instance_id, key, seq, kind, state, status, attempts)
VALUES (?, ?, ?, ?, ?, 'waiting', ?, 0)
ON CONFLICT (workflow, instance_id, key) DO NOTHING
"""
_INSTANCE_RETURNING = ", ".join(_INSTANCE_COLUMNS)

T = TypeVar("T")


def _migrate_to_1(db: sqlite_utils.Database) -> None:
    db["instances"].create(  # type: ignore[union-attr]
        _V1_INSTANCE_COLUMNS,
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


def _migrate_to_2(db: sqlite_utils.Database) -> None:
    db["instances"].add_column("waiting_for", str)  # type: ignore[union-attr]
    db["instances"].create_index(  # type: ignore[union-attr]
        ["status"], index_name="instances_by_status"
    )
    db["timers"].create(  # type: ignore[union-attr]
        _TIMER_COLUMNS,
        pk=("workflow", "instance_id", "key"),
        not_null={"deadline"},
    )
    db["timers"].create_index(["deadline"], index_name="timers_by_deadline")  # type: ignore[union-attr]


#: Migration to version N is _MIGRATIONS[N - 1]; each runs in the opening transaction.
_MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [_migrate_to_1, _migrate_to_2]


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
        for table, columns in (("instances", _V1_INSTANCE_COLUMNS), ("steps", _STEP_COLUMNS)):
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

    @contextmanager
    def _atomic(
        self, what: str, workflow: str | None = None, instance_id: str | None = None,
        key: str | None = None,
    ) -> Iterator[sqlite3.Connection]:
        """``_using`` inside BEGIN IMMEDIATE ... COMMIT; any exception rolls back."""
        with self._using(what, workflow, instance_id, key) as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    # ------------------------------------------------------------------ writes

    def create_instance(self, row: InstanceRow) -> bool:
        values = _rows.unstructure(row)
        sql = (
            f"INSERT OR IGNORE INTO instances ({', '.join(values)}) "
            f"VALUES ({', '.join('?' * len(values))})"
        )
        with self._using("create the instance", row.workflow, row.instance_id) as conn:
            return conn.execute(sql, tuple(values.values())).rowcount == 1

    def begin_run(
        self, workflow: str, instance_id: str, *, now: str, only_if_suspended: bool
    ) -> RunSnapshot | None:
        claim = " AND status = 'suspended'" if only_if_suspended else ""
        with self._atomic("start a run", workflow, instance_id) as conn:
            found = conn.execute(
                "UPDATE instances SET status = 'running', message = NULL, waiting_for = NULL, "
                "updated_at = ?, completed_at = NULL "
                f"WHERE workflow = ? AND instance_id = ?{claim} RETURNING {_INSTANCE_RETURNING}",
                (now, workflow, instance_id),
            ).fetchone()
            steps = (
                conn.execute(_SELECT_RUN_STEPS, (workflow, instance_id)).fetchall()
                if found is not None
                else []
            )
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

    def await_signal(self, write: StepWrite) -> StoredStep | None:
        where = (write.workflow, write.instance_id, write.key)
        with self._atomic("wait for a signal", *where) as conn:
            done = self._completed_step(conn, write)
            if done is None:
                self._insert_waiting(conn, write)
        return done

    def arm_timer(self, write: StepWrite, deadline: float) -> float | None:
        with self._atomic("arm the timer", write.workflow, write.instance_id, write.key) as conn:
            if self._completed_step(conn, write) is not None:
                return None
            self._insert_waiting(conn, write)
            # The first arming sets the deadline; runs after it do not move it.
            conn.execute(
                "INSERT OR IGNORE INTO timers (workflow, instance_id, key, deadline) "
                "VALUES (?, ?, ?, ?)",
                (write.workflow, write.instance_id, write.key, deadline),
            )
            row = conn.execute(
                "SELECT deadline FROM timers WHERE workflow = ? AND instance_id = ? AND key = ?",
                (write.workflow, write.instance_id, write.key),
            ).fetchone()
        return float(row[0])

    def deliver_signal(self, write: StepWrite) -> None:
        workflow, instance_id, key = write.workflow, write.instance_id, write.key
        with self._atomic("deliver the signal", workflow, instance_id, key) as conn:
            row = conn.execute(
                "SELECT status FROM instances WHERE workflow = ? AND instance_id = ?",
                (workflow, instance_id),
            ).fetchone()
            if row is None:
                raise InstanceNotFound(workflow, instance_id)
            if row[0] in ("completed", "failed", "cancelled"):
                raise InstanceFinished(
                    workflow, instance_id,
                    f"it is {row[0]}" + ("; resume it instead" if row[0] == "failed" else ""),
                )
            stored = conn.execute(_SELECT_STEP, (workflow, instance_id, key)).fetchone()
            if stored is not None:
                step = StoredStep(*stored)
                if step.kind != "signal":
                    why = f"the key is a {step.kind}, not a suspend point"
                    raise SignalRejected(workflow, instance_id, key, why)
                if step.state == "completed":
                    why = "the key already holds a value"
                    raise SignalRejected(workflow, instance_id, key, why)
                seq = step.seq
            else:
                seq = conn.execute(
                    "SELECT COALESCE(MAX(seq), -1) + 1 FROM steps "
                    "WHERE workflow = ? AND instance_id = ?",
                    (workflow, instance_id),
                ).fetchone()[0]
            conn.execute(
                _UPSERT_STEP,
                (
                    workflow, instance_id, key, seq, "signal", "completed", write.result,
                    write.result_type, None, None, write.at,
                ),
            )

    def fire_due_timers(self, now: float, at: str) -> list[tuple[str, str, str]]:
        with self._using("look for due timers") as conn:
            # Most looks find nothing due: answer those without taking the write lock.
            any_due = conn.execute("SELECT 1 FROM timers WHERE deadline <= ? LIMIT 1", (now,))
            if any_due.fetchone() is None:
                return []
        with self._atomic("fire due timers") as conn:
            due = conn.execute(
                "DELETE FROM timers WHERE deadline <= ? RETURNING workflow, instance_id, key",
                (now,),
            ).fetchall()
            for workflow, instance_id, key in due:
                conn.execute(
                    "UPDATE steps SET state = 'completed', result = 'null', result_type = NULL, "
                    "attempts = attempts + 1, completed_at = ? "
                    "WHERE workflow = ? AND instance_id = ? AND key = ? AND state != 'completed'",
                    (at, workflow, instance_id, key),
                )
        return [(w, i, k) for w, i, k in due]

    def finish(
        self,
        workflow: str,
        instance_id: str,
        *,
        status: StatusName,
        message: str | None,
        output: tuple[str, str | None] | None = None,
        waiting_for: str | None = None,
        now: str,
    ) -> None:
        terminal = status in ("completed", "failed", "cancelled")
        text, tag = output if output is not None else (None, None)
        with self._using(f"record the run as {status}", workflow, instance_id) as conn:
            conn.execute(
                "UPDATE instances SET status = ?, message = ?, output = ?, output_type = ?, "
                "waiting_for = ?, updated_at = ?, completed_at = ? "
                "WHERE workflow = ? AND instance_id = ?",
                (status, message, text, tag, waiting_for, now, now if terminal else None,
                 workflow, instance_id),
            )

    @staticmethod
    def _completed_step(conn: sqlite3.Connection, write: StepWrite) -> StoredStep | None:
        row = conn.execute(_SELECT_STEP, (write.workflow, write.instance_id, write.key)).fetchone()
        step = None if row is None else StoredStep(*row)
        return step if step is not None and step.state == "completed" else None

    @staticmethod
    def _insert_waiting(conn: sqlite3.Connection, write: StepWrite) -> None:
        conn.execute(
            _INSERT_WAITING,
            (write.workflow, write.instance_id, write.key, write.seq, write.kind, write.status),
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

    def next_deadline(self) -> float | None:
        with self._using("read the next timer deadline") as conn:
            row = conn.execute("SELECT MIN(deadline) FROM timers").fetchone()
        return None if row[0] is None else float(row[0])

    def ready_to_resume(self, workflows: list[str]) -> list[tuple[str, str]]:
        if not workflows:
            return []
        marks = ", ".join("?" * len(workflows))
        with self._using("look for instances to resume") as conn:
            rows = conn.execute(
                "SELECT i.workflow, i.instance_id FROM instances AS i JOIN steps AS s "
                "ON s.workflow = i.workflow AND s.instance_id = i.instance_id "
                "AND s.key = i.waiting_for "
                "WHERE i.status = 'suspended' AND s.state = 'completed' "
                f"AND i.workflow IN ({marks})",
                workflows,
            ).fetchall()
        return [(w, i) for w, i in rows]

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
