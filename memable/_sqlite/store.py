"""The SQLite store: one connection per engine, shared by all threads behind one lock.

The connection is in driver autocommit mode (``isolation_level=None``); every write goes through
``group_commit.GroupCommit`` and returns after its commit (a busy database makes it wait, busy
timeout, rather than fail half way). Each write of a run checks, in the same statement or
transaction, that the instance is still its own (``memable_instances.owner``); SQLite serialises
writers database-wide, so no other writer comes between the check and the write."""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from .. import _clock
from .._errors import StorageError
from .._records import StatusName, StepRecord
from .._store import liveness as _liveness
from .._store.protocol import Synchronous
from .._store.rows import (
    Claim,
    Claimed,
    Ended,
    InstanceRow,
    Look,
    RunEnd,
    RunSnapshot,
    ScheduleRow,
    StepWrite,
    StoredStep,
    Suspend,
    TickFiring,
    TicksFired,
    TimedOut,
)
from .._store.sql import cancel as cancel_sql
from .._store.sql import claims, reads, signals, steps, suspensions, timers
from .._store.sql import forks as forks_sql
from .._store.sql import instances as shared
from .._store.sql import owners as owners_sql
from .._store.sql import queues as queue_sql
from .._store.sql import retention as retention_sql
from .._store.sql import schedules as schedules_sql
from .._store.sql.reads import OperatorReads
from .group_commit import GroupCommit
from .schema import open_store, return_free_pages
from .transaction import SQLiteTransaction
from .watch import run_checks

#: Longest pause between two purge batches, in seconds: SQLite's busy handler retries
#: a writer that has waited a while every 100 ms, so a gap this long lets one in.
PURGE_GAP = 0.1


class SQLiteStore(OperatorReads):
    """A memable store in one SQLite file, or in memory when ``path`` is None."""

    def __init__(
        self, path: str | os.PathLike[str] | None, synchronous: Synchronous, *,
        create: bool = True,
    ) -> None:
        conn, db, where = open_store(path, synchronous, create=create)
        self._where = where
        # _lock guards _conn, _db and _closed: every use of the connection, from any thread.
        self._lock = threading.Lock()
        self._conn = conn
        self._db = db
        self._closed = False
        # Used under _lock: which instances check_run may answer for unread.
        self._checks = run_checks(conn, in_memory=path is None)
        self._commits = GroupCommit(self._lock, where, self._connection, self._checks)
        self._grouped = self._commits.write
        #: This engine's id as an owner of instances.
        self.owner = _liveness.owner_id(_liveness.current())
        self._lease = 15.0
        self._declares: str | None = None  # what register_owner stored, for a re-register

    def _connection(self) -> sqlite3.Connection | None:  # the caller holds _lock
        return None if self._closed else self._conn

    @contextmanager
    def _using(
        self, what: str, workflow: str | None = None, instance_id: str | None = None,
        key: str | None = None,
    ) -> Iterator[sqlite3.Connection]:
        """Hold the connection; turn sqlite3 errors into StorageError naming the target."""
        with self._lock:
            if self._closed:
                raise StorageError(f"cannot {what}: the store {self._where} is closed",
                    workflow=workflow, instance_id=instance_id, key=key)
            try:
                yield self._conn
            except sqlite3.Error as exc:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                raise StorageError(f"cannot {what} in {self._where} ({exc})", workflow=workflow,
                    instance_id=instance_id, key=key) from exc

    def create_instance(self, row: InstanceRow, start_at: float | None = None) -> bool:
        def insert(conn: sqlite3.Connection) -> bool:
            created = claims.create(SQLiteTransaction(conn, self.owner), row, start_at)
            if created and row.status == "running" and self._checks is not None:
                self._checks.claimed(row.workflow, row.instance_id)
            return created

        where = (row.workflow, row.instance_id, None)
        return self._grouped("create the instance", *where, insert, single=start_at is None)

    def begin_run(
        self, workflow: str, instance_id: str, *, now: float, claim: Claim
    ) -> RunSnapshot | None:
        def claim_it(conn: sqlite3.Connection) -> RunSnapshot | None:
            snapshot = claims.begin_run(SQLiteTransaction(conn, self.owner), workflow,
                                        instance_id, now=now, claim=claim)
            if (snapshot is not None and snapshot.instance.status == "running"
                    and self._checks is not None):
                self._checks.claimed(workflow, instance_id)
            return snapshot

        return self._grouped("start a run", workflow, instance_id, None, claim_it)

    def save_step(self, write: StepWrite) -> None:
        def store(conn: sqlite3.Connection) -> None:
            steps.save(SQLiteTransaction(conn, self.owner), write)

        where = (write.workflow, write.instance_id, write.key)
        self._grouped("store the step", *where, store, single=True)

    def check_run(self, workflow: str, instance_id: str) -> StatusName:
        # Before every step: not _using (a generator per call); no statement if unchanged (watch).
        with self._lock:
            checks = self._checks
            if checks is not None and not self._closed and checks.known_running(
                workflow, instance_id
            ):
                return "running"
            try:
                if self._closed:
                    raise sqlite3.ProgrammingError("the store is closed")
                status = steps.check_run(SQLiteTransaction(self._conn, self.owner),
                                         workflow, instance_id)
            except sqlite3.Error as exc:
                raise StorageError(f"cannot check the run in {self._where} ({exc})",
                    workflow=workflow, instance_id=instance_id) from exc
            if checks is not None and status == "running":
                checks.saw_running(workflow, instance_id)
        return status

    def set_status(self, workflow: str, instance_id: str, message: str) -> None:
        def store(conn: sqlite3.Connection) -> None:
            steps.set_status(SQLiteTransaction(conn, self.owner), workflow, instance_id, message)

        self._grouped("store the status message", workflow, instance_id, None, store, single=True)

    def record_in_flight(self, steps_: list[tuple[str, str, str, float]]) -> None:
        if not steps_:
            return

        def store(conn: sqlite3.Connection) -> None:
            steps.record_in_flight(SQLiteTransaction(conn, self.owner), steps_)

        self._grouped("record the steps in flight", None, None, None, store)

    def read_step(self, workflow: str, instance_id: str, key: str) -> StoredStep | None:
        with self._using("read the step", workflow, instance_id, key) as conn:
            return steps.read(SQLiteTransaction(conn, self.owner), workflow, instance_id, key)

    def suspend(
        self, waiting: StepWrite, message: str, deadline: float | None, now: float
    ) -> Suspend:
        def record(conn: sqlite3.Connection) -> Suspend:
            return suspensions.suspend(SQLiteTransaction(conn, self.owner), waiting, message,
                                       deadline, now)

        return self._grouped("record the suspension", waiting.workflow, waiting.instance_id,
                             waiting.key, record)

    def finish(self, workflow: str, instance_id: str, end: RunEnd) -> Ended:
        def record(conn: sqlite3.Connection) -> Ended:
            # Its queue: this engine's queue thread looks when the run ends.
            return shared.finish(SQLiteTransaction(conn, self.owner), workflow, instance_id, end)

        return self._grouped(
            f"record the run as {end.status}", workflow, instance_id, None, record)

    def mark_resumable(self, workflow: str, instance_id: str, now: float) -> str:
        def mark(conn: sqlite3.Connection) -> str:
            return shared.mark_resumable(SQLiteTransaction(conn, self.owner), workflow,
                                         instance_id, now)

        return self._grouped("mark the instance to resume", workflow, instance_id, None, mark)

    def place_signal(self, workflow: str, instance_id: str, key: str, seq: int) -> None:
        def place(conn: sqlite3.Connection) -> None:
            signals.place(SQLiteTransaction(conn, self.owner), workflow, instance_id, key, seq)

        self._grouped("place the signal", workflow, instance_id, key, place, single=True)

    def resume_failure(self, workflow: str, instance_id: str, failed_at: str, now: float) -> bool:
        def resume(conn: sqlite3.Connection) -> bool:
            return shared.resume_failure(SQLiteTransaction(conn, self.owner), workflow,
                                         instance_id, failed_at, now)

        return self._grouped("resume the failed instance", workflow, instance_id, None, resume)

    def deliver_signal(self, write: StepWrite, traceparent: str | None = None) -> None:
        def deliver(conn: sqlite3.Connection) -> None:
            signals.deliver(SQLiteTransaction(conn, self.owner), write, traceparent)

        self._grouped("deliver the signal", write.workflow, write.instance_id, write.key, deliver)

    def fire_due_timers(
        self, clock: Callable[[], float], at: float
    ) -> list[tuple[str, str, str, float]]:
        # Most looks find nothing due: a read answers those, without the write lock.
        with self._using("look for due timers") as conn:
            due = timers.due(SQLiteTransaction(conn, self.owner), clock)
        if not due:
            return []

        def fire(conn: sqlite3.Connection) -> list[tuple[str, str, str, float]]:
            return timers.fire(SQLiteTransaction(conn, self.owner), due, at)

        return self._grouped("fire due timers", None, None, None, fire)

    def fork_instance(
        self, workflow: str, instance_id: str, new_id: str, from_key: str | None, now: float
    ) -> bool:
        def fork_it(conn: sqlite3.Connection) -> bool:
            return forks_sql.fork(SQLiteTransaction(conn, self.owner), workflow, instance_id,
                                  new_id, from_key, now)

        return self._grouped("fork the instance", workflow, instance_id, from_key, fork_it)

    def purge_batch(self, completed_before: float, limit: int, now: float) -> int:
        with self._using("look for finished instances to purge") as conn:
            # Most looks find nothing to purge: answer those without taking the write lock.
            tx = SQLiteTransaction(conn, self.owner)
            if not retention_sql.any_purgeable(tx, completed_before, now):
                return 0

        def purge_them(conn: sqlite3.Connection) -> int:
            tx = SQLiteTransaction(conn, self.owner)
            deleted = retention_sql.purge_batch(tx, completed_before, limit, now)
            if deleted:
                return_free_pages(conn)
            return deleted

        started = _clock.monotonic()
        deleted = self._grouped("purge a batch of finished instances", None, None, None,
                                purge_them)
        if deleted == limit:
            # Leave the file to other writers as long as this batch held it (``PURGE_GAP``).
            time.sleep(min(_clock.monotonic() - started, PURGE_GAP))
        return deleted

    def register_owner(
        self, lease: float, now: float, declares: str | None = None
    ) -> float | None:
        with self._using("register the engine as an owner") as conn:
            owners_sql.register(SQLiteTransaction(conn, self.owner), lease, now, declares)
        self._lease, self._declares = lease, declares
        return None  # leases are judged by the engines' clocks, ``now``

    def heartbeat(self, now: float) -> float | None:
        with self._using("renew the engine's lease") as conn:
            renewed = owners_sql.heartbeat(SQLiteTransaction(conn, self.owner), now)
        if renewed is None:  # reaped while stalled: come back (its runs are lost already)
            self.register_owner(self._lease, now, self._declares)
        return None

    def drop_owner(self) -> None:
        with self._using("remove the engine's owner row") as conn:
            owners_sql.drop(SQLiteTransaction(conn, self.owner))

    def look_around(self, workflows: list[str], now: float) -> Look:
        with self._using("look at the store") as conn:
            return owners_sql.look_around(SQLiteTransaction(conn, self.owner), workflows, now)

    def cancel(self, workflow: str, instance_id: str, *, now: float) -> Ended:
        def cancel_it(conn: sqlite3.Connection) -> Ended:
            return cancel_sql.cancel(SQLiteTransaction(conn, self.owner), workflow, instance_id,
                                     now)

        return self._commits.write("cancel the instance", workflow, instance_id, None, cancel_it)

    def time_out(self, clock: Callable[[], float], at: float) -> list[TimedOut]:
        with self._using("look for timed-out instances") as conn:
            # Most looks find none due: answer those without taking the write lock.
            if not shared.any_timeout_due(SQLiteTransaction(conn, self.owner), clock()):
                return []

        def time_them_out(conn: sqlite3.Connection) -> list[TimedOut]:
            return shared.time_out_due(SQLiteTransaction(conn, self.owner), clock, at)

        return self._commits.write("time out instances", None, None, None, time_them_out)

    def claim_queued(
        self, queue: str, workflows: list[str], *, concurrency: int | None,
        per_process: int | None, rate: tuple[int, float] | None, clock: Callable[[], float],
        at: float, batch: int, per_key: int | None = None,
    ) -> Claimed:
        if not workflows:
            return Claimed()
        with self._using("look at the queue") as conn:
            # Most looks find nothing queued: answer those without the write lock.
            if not queue_sql.any_queued(SQLiteTransaction(conn, self.owner), queue):
                return Claimed()

        def take(conn: sqlite3.Connection) -> Claimed:
            # The clock is read under the write lock: claims record their starts in order.
            claimed = queue_sql.claim(SQLiteTransaction(conn, self.owner), queue=queue,
                workflows=workflows, concurrency=concurrency, per_process=per_process, rate=rate,
                clock=clock, at=at, batch=batch, per_key=per_key)
            for snapshot in claimed.snapshots:
                if self._checks is not None:
                    self._checks.claimed(snapshot.instance.workflow, snapshot.instance.instance_id)
            return claimed

        # The claimed are known running from its commit (``watch``).
        return self._commits.write("claim queued instances", None, None, None, take)

    def queued(self, queue: str, workflows: list[str]) -> int:
        with self._using("count the queued instances") as conn:
            return queue_sql.queued(SQLiteTransaction(conn, self.owner), queue, workflows)

    def set_queue_paused(self, queue: str, paused: bool, at: float) -> bool:
        # One write transaction: a claim's, which reads the state, is before or after it.
        def store(conn: sqlite3.Connection) -> bool:
            return queue_sql.set_paused(SQLiteTransaction(conn, self.owner), queue, paused, at)

        what = f"{'pause' if paused else 'resume'} the queue {queue!r}"
        return self._grouped(what, None, None, None, store, single=True)

    def start_children(self, waits: list[StepWrite], rows: list[InstanceRow]) -> list[str]:
        if not rows:
            return []
        workflow, instance_id = waits[0].workflow, waits[0].instance_id

        def start(conn: sqlite3.Connection) -> list[str]:
            created = claims.start_children(SQLiteTransaction(conn, self.owner), waits, rows)
            if self._checks is not None:
                made = set(created)
                for row in rows:
                    if row.instance_id in made and row.status == "running":
                        self._checks.claimed(row.workflow, row.instance_id)
            return created

        return self._commits.write(
            "start the children", workflow, instance_id, waits[0].key, start)

    def set_traceparent(self, workflow: str, instance_id: str, traceparent: str) -> None:
        def store(conn: sqlite3.Connection) -> None:
            shared.set_traceparent(SQLiteTransaction(conn, self.owner), workflow, instance_id,
                                   traceparent)

        self._grouped("store the trace context", workflow, instance_id, None, store, single=True)

    def declare_schedules(self, schedules: list[ScheduleRow], at: float) -> list[ScheduleRow]:
        return self._grouped("declare the schedules", None, None, None,
            lambda conn: schedules_sql.declare(SQLiteTransaction(conn, self.owner), schedules, at))

    def fire_ticks(self, name: str, last: str | None, firing: TickFiring) -> TicksFired:
        def fire(conn: sqlite3.Connection) -> TicksFired:
            fired = schedules_sql.fire(SQLiteTransaction(conn, self.owner), name, last, firing)
            if self._checks is not None:
                created = set(fired.created)
                for row in firing.rows:
                    if row.instance_id in created and row.status == "running":
                        self._checks.claimed(row.workflow, row.instance_id)
            return fired

        return self._grouped(f"fire the schedule {name!r}", None, None, None, fire)

    def next_deadline(self) -> float | None:
        with self._using("read the next timer deadline") as conn:
            return timers.next_deadline(SQLiteTransaction(conn, self.owner))

    def get_instance(self, workflow: str, instance_id: str) -> InstanceRow | None:
        # Fixed SQL: Invocation.state and result() read this on every look.
        with self._using("read the instance", workflow, instance_id) as conn:
            return reads.get_instance(SQLiteTransaction(conn, self.owner), workflow, instance_id)

    def list_instances(self, workflow: str) -> list[InstanceRow]:
        with self._using("list instances", workflow) as conn:
            return reads.list_instances(SQLiteTransaction(conn, self.owner), workflow)

    def list_steps(self, workflow: str, instance_id: str) -> list[StepRecord]:
        with self._using("read the steps", workflow, instance_id) as conn:
            return reads.list_steps(SQLiteTransaction(conn, self.owner), workflow, instance_id)

    def read_rows(self, what: str, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Rows of one read-only query, as dicts (``memable._store.sql.reads``)."""
        with self._using(what) as conn:
            return reads.read_rows(SQLiteTransaction(conn, self.owner), sql, params)

    def listen(self, changed: Callable[[str, str | None, str | None], None] | None) -> None:
        """Nothing to listen to: engines on one file find each other's writes by the poll."""

    def session(self) -> AbstractContextManager[None]:
        return nullcontext()  # one connection for everything already

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._checks is not None:
                self._checks.close()
            self._conn.close()
