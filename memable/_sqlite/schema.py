"""The tables of a memable store, their migrations, and opening a file safely.

Every table is named ``memable_*``; the schema version is the row of ``memable_schema``, so the
file may hold the application's tables too, never read or changed here (``PRAGMA user_version``
is the application's). A file that is not a SQLite database, or of a newer version, is refused,
left byte for byte as it was; an older store is migrated in one transaction. Versions up to 15
kept the version in ``user_version``, the tables unprefixed: such a file, memable's alone, has
its tables renamed and ``user_version`` set back to 0."""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable

import sqlite_utils

from .._errors import StorageError
from .._log import log
from .._store.protocol import Synchronous
from .._store.sql.instances import CONCURRENCY_KEY_INDEX, INSTANCE_COLUMNS, TIMEOUTS_INDEX

SCHEMA_VERSION = 16  # the version ``memable_schema`` holds
#: The last version kept in ``PRAGMA user_version``, with unprefixed tables.
LAST_USER_VERSION = 15
#: The tables of those versions, each with the version that made it.
_OLD_TABLES = {"instances": 1, "steps": 1, "timers": 2, "owners": 3, "queue_starts": 8,
               "schedules": 10, "queue_states": 12}
BUSY_TIMEOUT = 10.0  # seconds a statement waits for another process's lock
INCREMENTAL = 2  # the ``PRAGMA auto_vacuum`` that returns freed pages (retention)
INCREMENTAL_VACUUM_SINCE = 12  # an older file is switched once, on migration
RETURN_PAGES = 2000  # most free pages a purge batch returns (~8 MB of 4 KiB, some 0.1 s)

_LATER_INSTANCE_COLUMNS = ("waiting_for", "owner", "status_message", "step_key", "step_started",
    "traceback", "parent_workflow", "parent_id", "parent_key", "parent_group", "children_pending",
    "queue", "priority", "queued_at", "recoveries", "lost_owner", "lost_step", "schedule",
    "traceparent", "run_reason", "timeout", "timeout_at", "concurrency_key", "lost_by")
#: Columns every store has had since version 1: what a file must show before we migrate it.
V1_INSTANCE_COLUMNS = {
    c: t for c, t in INSTANCE_COLUMNS.items() if c not in _LATER_INSTANCE_COLUMNS}
STEP_COLUMNS: dict[str, type] = {
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
    "started_at": str,  # v4: when the execution that wrote the row began
    "traceback": str,  # v6
}
V1_STEP_COLUMNS = {c: t for c, t in STEP_COLUMNS.items() if c not in ("started_at", "traceback")}
TIMER_COLUMNS: dict[str, type] = {
    "workflow": str, "instance_id": str, "key": str, "deadline": float,
}
OWNER_COLUMNS: dict[str, type] = {
    "id": str,
    "host": str,
    "pid": int,
    "heartbeat": float,  # wall clock of the last heartbeat
    "lease": float,  # seconds the owner counts as alive after a heartbeat
    # ISO 8601 UTC; an older memable wrote local time with its offset. Nothing reads it.
    "started_at": str,
    # v5: where the pid is valid (see memable._store.liveness)
    "boot_id": str,
    "pid_ns": str,
    "proc_start": str,
    "declares": str,  # v9: ``_queues.Declarations`` JSON
}
V3_OWNER_COLUMNS = {c: t for c, t in OWNER_COLUMNS.items()
                    if c not in ("boot_id", "pid_ns", "proc_start", "declares")}


def migrate_to_1(db: sqlite_utils.Database) -> None:
    """Instances and their steps."""
    db["memable_instances"].create(  # type: ignore[union-attr]
        V1_INSTANCE_COLUMNS, pk=("workflow", "instance_id"),
        not_null={"status", "input", "created_at", "updated_at"})
    db["memable_instances"].create_index(  # type: ignore[union-attr]
        ["workflow", "created_at"], index_name="instances_by_workflow")
    db["memable_steps"].create(  # type: ignore[union-attr]
        V1_STEP_COLUMNS, pk=("workflow", "instance_id", "key"),
        not_null={"seq", "kind", "state", "attempts"})


def migrate_to_2(db: sqlite_utils.Database) -> None:
    """Timers, and the key a suspended instance waits on."""
    db["memable_instances"].add_column("waiting_for", str)  # type: ignore[union-attr]
    db["memable_instances"].create_index(  # type: ignore[union-attr]
        ["status"], index_name="instances_by_status")
    db["memable_timers"].create(  # type: ignore[union-attr]
        TIMER_COLUMNS, pk=("workflow", "instance_id", "key"), not_null={"deadline"})
    db["memable_timers"].create_index(  # type: ignore[union-attr]
        ["deadline"], index_name="timers_by_deadline")


def migrate_to_3(db: sqlite_utils.Database) -> None:
    """Owners with leases, and the owner of each running instance."""
    db["memable_instances"].add_column("owner", str)  # type: ignore[union-attr]
    db["memable_owners"].create(  # type: ignore[union-attr]
        V3_OWNER_COLUMNS, pk="id", not_null={"host", "pid", "heartbeat", "lease"})


def migrate_to_4(db: sqlite_utils.Database) -> None:
    """When each step's execution began."""
    db["memable_steps"].add_column("started_at", str)  # type: ignore[union-attr]


def migrate_to_5(db: sqlite_utils.Database) -> None:
    """Owners say which boot and PID namespace their pid belongs to."""
    for column in ("boot_id", "pid_ns", "proc_start"):
        db["memable_owners"].add_column(column, str)  # type: ignore[union-attr]


def migrate_to_6(db: sqlite_utils.Database) -> None:
    """What an operator sees: status message, step in flight, tracebacks."""
    for column in ("status_message", "step_key", "step_started", "traceback"):
        db["memable_instances"].add_column(column, str)  # type: ignore[union-attr]
    db["memable_steps"].add_column("traceback", str)  # type: ignore[union-attr]


def migrate_to_7(db: sqlite_utils.Database) -> None:
    """Child instances know their parent; a parent counts the children it waits for."""
    for column in ("parent_workflow", "parent_id", "parent_key", "parent_group"):
        db["memable_instances"].add_column(column, str)  # type: ignore[union-attr]
    db["memable_instances"].add_column("children_pending", int)  # type: ignore[union-attr]
    db["memable_instances"].create_index(  # type: ignore[union-attr]
        ["parent_workflow", "parent_id"], index_name="instances_by_parent")


def migrate_to_8(db: sqlite_utils.Database) -> None:
    """Queues: an instance's queue, priority and place; the starts a rate limit counts."""
    db["memable_instances"].add_column("queue", str)  # type: ignore[union-attr]
    db["memable_instances"].add_column("priority", int)  # type: ignore[union-attr]
    db["memable_instances"].add_column("queued_at", str)  # type: ignore[union-attr]
    db["memable_instances"].create_index(  # type: ignore[union-attr]
        ["queue", "status", "priority", "queued_at"], index_name="instances_by_queue")
    db["memable_queue_starts"].create(  # type: ignore[union-attr]
        {"queue": str, "at": float}, not_null={"queue", "at"})
    db["memable_queue_starts"].create_index(  # type: ignore[union-attr]
        ["queue", "at"], index_name="queue_starts_by_queue")


def migrate_to_9(db: sqlite_utils.Database) -> None:
    """Recoveries an instance went through; what each engine declares it runs."""
    db["memable_instances"].add_column("recoveries", int)  # type: ignore[union-attr]
    db["memable_instances"].add_column("lost_owner", str)  # type: ignore[union-attr]
    db["memable_instances"].add_column("lost_step", str)  # type: ignore[union-attr]
    db["memable_owners"].add_column("declares", str)  # type: ignore[union-attr]


def migrate_to_10(db: sqlite_utils.Database) -> None:
    """Schedules, and the schedule whose tick an instance is."""
    db["memable_instances"].add_column("schedule", str)  # type: ignore[union-attr]
    db["memable_instances"].create_index(  # type: ignore[union-attr]
        ["schedule", "status"], index_name="instances_by_schedule")
    db["memable_schedules"].create(  # type: ignore[union-attr]
        {"name": str, "cron": str, "timezone": str, "workflow": str, "last_tick": str,
         "since": str, "skipped": int, "missed": int},
        pk="name", not_null={"cron", "timezone", "workflow", "skipped", "missed"},
        defaults={"skipped": 0, "missed": 0})


def migrate_to_11(db: sqlite_utils.Database) -> None:
    """The trace context an instance's next run continues, and why it was claimed."""
    db["memable_instances"].add_column("traceparent", str)  # type: ignore[union-attr]
    db["memable_instances"].add_column("run_reason", str)  # type: ignore[union-attr]


def migrate_to_12(db: sqlite_utils.Database) -> None:
    """Indexes in a page's whole order (time, workflow, id), so a page of instances is a walk
    of one index with no sort, however deep (the last also counts by workflow and status);
    the queues' stored states; then (after the commit) incremental auto-vacuum."""
    for columns, name in (
        (["created_at", "workflow", "instance_id"], "instances_by_time"),
        (["status", "created_at", "workflow", "instance_id"], "instances_by_status_time"),
        (["workflow", "created_at", "instance_id"], "instances_by_workflow_time"),
        (["workflow", "status", "created_at", "instance_id"], "instances_by_workflow_status"),
    ):
        db["memable_instances"].create_index(columns, index_name=name)  # type: ignore[union-attr]
    db.execute("DROP INDEX IF EXISTS instances_by_status")
    db.execute("DROP INDEX IF EXISTS instances_by_workflow")
    # Retention's batches (and ``resume_failed``) read only what they take.
    db["memable_instances"].create_index(  # type: ignore[union-attr]
        ["status", "completed_at"], index_name="instances_by_completed")
    # A queue without a row was never paused.
    db["memable_queue_states"].create(  # type: ignore[union-attr]
        {"queue": str, "paused": int, "paused_at": str}, pk="queue", not_null={"paused"},
        defaults={"paused": 0})


def migrate_to_13(db: sqlite_utils.Database) -> None:
    """Workflow timeouts (indexed while unended) and per-key concurrency (indexed to count)."""
    db["memable_instances"].add_column("timeout", float)  # type: ignore[union-attr]
    db["memable_instances"].add_column("timeout_at", float)  # type: ignore[union-attr]
    db["memable_instances"].add_column("concurrency_key", str)  # type: ignore[union-attr]
    db.execute(TIMEOUTS_INDEX)
    db.execute(CONCURRENCY_KEY_INDEX)


def migrate_to_14(db: sqlite_utils.Database) -> None:
    """Whom the last recovery took an instance from, and how it was lost."""
    db["memable_instances"].add_column("lost_by", str)  # type: ignore[union-attr]


def migrate_to_15(db: sqlite_utils.Database) -> None:
    """The token of the call that created an instance (``instances.INSERT_INSTANCE``)."""
    db["memable_instances"].add_column("created_by", str)  # type: ignore[union-attr]


def migrate_to_16(db: sqlite_utils.Database) -> None:
    """The version in a table of its own (``_migrate`` renamed an older file's tables)."""
    db.execute("CREATE TABLE memable_schema (version INTEGER NOT NULL)")


#: Migration to version N is MIGRATIONS[N - 1]; all run in the opening transaction.
MIGRATIONS: list[Callable[[sqlite_utils.Database], None]] = [migrate_to_1, migrate_to_2,
    migrate_to_3, migrate_to_4, migrate_to_5, migrate_to_6, migrate_to_7, migrate_to_8,
    migrate_to_9, migrate_to_10, migrate_to_11, migrate_to_12, migrate_to_13, migrate_to_14,
    migrate_to_15, migrate_to_16]


def open_store(
    path: str | os.PathLike[str] | None, synchronous: Synchronous, *, create: bool = True
) -> tuple[sqlite3.Connection, sqlite_utils.Database, str]:
    """Open, check and migrate the store; return (connection, Database, its name).
    ``create=False`` (tools): a file without memable's tables is refused, untouched."""
    where = ":memory:" if path is None else os.fspath(path)
    try:
        conn = sqlite3.connect(where, timeout=BUSY_TIMEOUT, isolation_level=None,
            check_same_thread=False)
    except sqlite3.Error as exc:
        raise StorageError(f"cannot open {where} ({exc})") from exc
    db = sqlite_utils.Database(conn)
    try:
        _retry_while_busy(where, lambda: _prepare(conn, db, where, path is not None,
                                                  synchronous, create))
    except BaseException:
        conn.close()
        raise
    return conn, db, where


def _retry_while_busy(where: str, action: Callable[[], None]) -> None:
    # Processes opening a new file at once contend for the first write; each step may repeat.
    deadline = time.monotonic() + BUSY_TIMEOUT
    while True:
        try:
            return action()
        except sqlite3.Error as exc:
            busy = isinstance(exc, sqlite3.OperationalError) and (
                "locked" in str(exc) or "busy" in str(exc))
            if not busy or time.monotonic() > deadline:
                raise StorageError(f"cannot prepare the store {where} ({exc})") from exc
            time.sleep(0.01)


def _prepare(
    conn: sqlite3.Connection, db: sqlite_utils.Database, where: str, file_backed: bool,
    synchronous: Synchronous, create: bool,
) -> None:
    # Read-only checks first: a file we refuse must be left byte for byte.
    version, _, tables = _inspect(conn, where)
    _refuse_newer(version, where)
    if version == 0 and not create:
        raise StorageError(f"{where} is not a memable store (it has no memable tables)")
    if not tables:  # returns the pages purges free; must precede the first table and WAL
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
    if file_backed:
        conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
    if version < SCHEMA_VERSION:
        migrated_from = _migrate(conn, db, where)
        if 0 < migrated_from < INCREMENTAL_VACUUM_SINCE and file_backed:
            switch_to_incremental_vacuum(conn, where)


def _inspect(conn: sqlite3.Connection, where: str) -> tuple[int, bool, set[str]]:
    """The store's version (0: none), whether it is an earlier memable's (unprefixed tables,
    version in ``user_version``), and the file's tables."""
    try:
        # One statement, one snapshot: read apart, another process's migration could commit
        # between, showing some tables and not others.
        rows = conn.execute(
            "SELECT v.user_version, m.name FROM pragma_user_version AS v "
            "LEFT JOIN sqlite_master AS m ON m.type = 'table'"
        ).fetchall()
        tables = {name for _, name in rows if name is not None}
        if "memable_schema" in tables:  # made with its row, never dropped
            found = conn.execute("SELECT max(version) FROM memable_schema").fetchone()
            return int(found[0]), False, tables
        version = int(rows[0][0])
        old = 0 < version <= LAST_USER_VERSION and all(
            table in tables and set(columns) <= {c[1] for c in conn.execute(
                "SELECT * FROM pragma_table_info(?)", (table,))}
            for table, columns in (("instances", V1_INSTANCE_COLUMNS),
                                   ("steps", V1_STEP_COLUMNS)))
    except sqlite3.OperationalError:
        raise  # busy: the caller tries again
    except sqlite3.DatabaseError as exc:
        raise StorageError(f"{where} is not a SQLite database ({exc})") from exc
    return (version if old else 0), old, tables


def _refuse_newer(version: int, where: str) -> None:
    if version > SCHEMA_VERSION:
        raise StorageError(f"{where} has memable schema version {version}, newer than this "
                           f"memable understands ({SCHEMA_VERSION}); upgrade memable to open it")


def _migrate(conn: sqlite3.Connection, db: sqlite_utils.Database, where: str) -> int:
    """Migrate to ``SCHEMA_VERSION`` in one transaction; the version migrated from (the
    current one if another process migrated first: nothing to do)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Another process may have migrated while we waited for the lock.
        version, old, _ = _inspect(conn, where)
        _refuse_newer(version, where)
        if old:  # an earlier memable's file: only it had set user_version
            for table, since in _OLD_TABLES.items():
                if version >= since:
                    conn.execute(f"ALTER TABLE {table} RENAME TO memable_{table}")
            conn.execute("PRAGMA user_version = 0")
        if version < SCHEMA_VERSION:
            for step in MIGRATIONS[version:]:
                step(db)
            conn.execute("DELETE FROM memable_schema")
            conn.execute(f"INSERT INTO memable_schema (version) VALUES ({SCHEMA_VERSION})")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    return version


def switch_to_incremental_vacuum(conn: sqlite3.Connection, where: str) -> bool:
    """Switch an existing store to ``auto_vacuum = incremental``; whether it now is.

    That takes a ``VACUUM``, which rewrites the file outside any transaction: so once per file,
    by the opener that migrated it. If it fails (busy, no room for the copy) the store stays
    valid, its freed pages never returned, with a WARNING; the open goes on. A file that holds
    other tables than memable's is never vacuumed (INFO): the rewrite would take theirs too."""
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] == INCREMENTAL:
        return True
    others = sorted(name for (name,) in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")
        if not name.startswith(("memable_", "sqlite_")))
    if others:
        log.info("not switching %s to incremental auto-vacuum: the VACUUM would rewrite its "
                 "other tables (%s) too; purged instances' pages stay in the file for reuse",
                 where, ", ".join(others))
        return False
    began = time.monotonic()
    try:
        conn.execute("PRAGMA auto_vacuum = INCREMENTAL")
        conn.execute("VACUUM")
        # The rewrite went through the WAL: let the WAL file go too.
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    except sqlite3.Error as exc:
        log.warning(
            "could not switch %s to incremental auto-vacuum (%s): purged instances' "
            "pages stay in the file for reuse; to return them, stop the engines and run "
            "sqlite3 %s 'PRAGMA auto_vacuum = INCREMENTAL; VACUUM'", where, exc, where)
        return False
    log.info("switched %s to incremental auto-vacuum (VACUUM took %.1f s)",
             where, time.monotonic() - began)
    return True


def return_free_pages(conn: sqlite3.Connection, most: int = RETURN_PAGES) -> int:
    """Return up to ``most`` free pages to the file system in the caller's transaction
    (incremental auto-vacuum only); how many. One ``execute`` of ``PRAGMA incremental_vacuum``
    returns one page (Python's driver steps it once)."""
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] != INCREMENTAL:
        return 0
    free = min(int(conn.execute("PRAGMA freelist_count").fetchone()[0]), most)
    for _ in range(free):
        conn.execute("PRAGMA incremental_vacuum")
    return free
