"""The PostgreSQL store: several hosts on one database, with the file store's guarantees.

Each operation is one function run on a pooled connection by ``connections.Connections``, which
retries it across lost connections (a write whose commit outcome is unknown is decided there, by
one rule). Every write of a run is fenced by its instance row's lock (see ``sql``). Claims of due
timers, and wake-ups and recoveries of instances, skip rows another transaction holds. Leases are
judged by the server's clock. The transactions that store a signal, a cancel or a timer NOTIFY the
other engines (``listener``)."""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

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
from . import schema as schema_
from .connections import Connection, Connections
from .listener import Changed, Listener
from .transaction import PostgresTransaction


class PostgresStore(OperatorReads):
    """A memable store in one schema of a PostgreSQL database."""

    def __init__(
        self, url: str, synchronous: Synchronous, *, schema: str = "memable", create: bool = True,
        pool_size: int = 10,
    ) -> None:
        self.schema = schema_.check_schema_name(schema)
        self._db = Connections(url, synchronous, schema, create=create, pool_size=pool_size)
        self._run = self._db.run
        self.channel = schema_.channel(schema)
        # _listener_lock guards _listener: the thread LISTENing for this engine, if any.
        self._listener_lock = threading.Lock()
        self._listener: Listener | None = None
        #: This engine's id as an owner of instances.
        self.owner = _liveness.owner_id(_liveness.current())
        self._lease = 15.0
        self._declares: str | None = None  # what register_owner stored, for a re-register

    def __repr__(self) -> str:
        return f"<PostgresStore {self._db.where}>"

    def _probe(self, text: str) -> None:
        """NOTIFY ``text`` through the pool: how the listener checks that notices arrive."""
        self._run("probe the notification channel", lambda conn: conn.execute(
            "SELECT pg_notify(%s, %s)", (self.channel, text)), transaction=False)

    def listen(self, changed: Changed | None) -> None:
        with self._listener_lock:
            if self._listener is not None:
                self._listener.stop()
                self._listener = None
            if changed is not None and not self._db.closed:
                self._listener = Listener(
                    self._db.connect, self.channel, self.owner, changed, self._probe)
                self._listener.start()

    def create_instance(self, row: InstanceRow, start_at: float | None = None) -> bool:
        # A delayed start is a transaction (the row, its start's step and timer); else one
        # statement, which, run again after a lost answer, knows its row by this call's token.
        token = None if start_at is not None else secrets.token_hex(16)
        return self._run("create the instance",
                         lambda conn: claims.create(self._tx(conn), row, start_at, token),
                         row.workflow, row.instance_id, transaction=token is None)

    def begin_run(
        self, workflow: str, instance_id: str, *, now: float, claim: Claim
    ) -> RunSnapshot | None:
        return self._run("start a run", lambda conn: claims.begin_run(
            self._tx(conn), workflow, instance_id, now=now, claim=claim), workflow, instance_id)

    def _tx(self, conn: Connection) -> PostgresTransaction:
        return PostgresTransaction(conn, self.owner, self.channel)

    def save_step(self, write: StepWrite) -> None:
        # A completed step is one statement (run again, it finds its row); another outcome counts
        # an attempt, again if run again: a transaction, whose lost commit the server decides.
        self._run("store the step", lambda conn: steps.save(self._tx(conn), write), write.workflow,
            write.instance_id, write.key, transaction=write.state != "completed")

    def check_run(self, workflow: str, instance_id: str) -> StatusName:
        return self._run("check the run",
                         lambda conn: steps.check_run(self._tx(conn), workflow, instance_id),
                         workflow, instance_id, transaction=False)

    def set_status(self, workflow: str, instance_id: str, message: str) -> None:
        self._run("store the status message", lambda conn: steps.set_status(self._tx(conn),
            workflow, instance_id, message), workflow, instance_id, transaction=False)

    def record_in_flight(self, steps_: list[tuple[str, str, str, float]]) -> None:
        if steps_:
            self._run("record the steps in flight",
                      lambda conn: steps.record_in_flight(self._tx(conn), steps_))

    def read_step(self, workflow: str, instance_id: str, key: str) -> StoredStep | None:
        return self._run("read the step", lambda conn: steps.read(self._tx(conn), workflow,
            instance_id, key), workflow, instance_id, key, transaction=False)

    def suspend(
        self, waiting: StepWrite, message: str, deadline: float | None, now: float
    ) -> Suspend:
        return self._run("record the suspension", lambda conn: suspensions.suspend(self._tx(conn),
            waiting, message, deadline, now), waiting.workflow, waiting.instance_id, waiting.key)

    def finish(self, workflow: str, instance_id: str, end: RunEnd) -> Ended:
        return self._run(f"record the run as {end.status}", lambda conn: shared.finish(
            self._tx(conn), workflow, instance_id, end), workflow, instance_id)

    def mark_resumable(self, workflow: str, instance_id: str, now: float) -> str:
        return self._run("mark the instance to resume", lambda conn: shared.mark_resumable(
            self._tx(conn), workflow, instance_id, now), workflow, instance_id)

    def resume_failure(self, workflow: str, instance_id: str, failed_at: str, now: float) -> bool:
        return self._run("resume the failed instance", lambda conn: shared.resume_failure(
            self._tx(conn), workflow, instance_id, failed_at, now), workflow, instance_id)

    def fork_instance(
        self, workflow: str, instance_id: str, new_id: str, from_key: str | None, now: float
    ) -> bool:
        return self._run("fork the instance", lambda conn: forks_sql.fork(
            self._tx(conn), workflow, instance_id, new_id, from_key, now), workflow, instance_id)

    def place_signal(self, workflow: str, instance_id: str, key: str, seq: int) -> None:
        # One statement, which writes and answers alike if run again.
        self._run("place the signal", lambda conn: signals.place(self._tx(conn), workflow,
            instance_id, key, seq), workflow, instance_id, key, transaction=False)

    def deliver_signal(self, write: StepWrite, traceparent: str | None = None) -> None:
        self._run("deliver the signal",
                  lambda conn: signals.deliver(self._tx(conn), write, traceparent),
                  write.workflow, write.instance_id, write.key)

    def fire_due_timers(
        self, clock: Callable[[], float], at: float
    ) -> list[tuple[str, str, str, float]]:
        # Most looks find nothing due: a read answers those, without a transaction.
        due = self._run("look for due timers", lambda conn: timers.due(self._tx(conn), clock),
                        transaction=False)
        if not due:
            return []
        return self._run("fire due timers", lambda conn: timers.fire(self._tx(conn), due, at))

    def purge_batch(self, completed_before: float, limit: int, now: float) -> int:
        # Rows another transaction holds are skipped (``sql.retention``). A retry after a lost
        # commit purges the next batch, or finds this one gone: either is fine.
        def purge_them(conn: Connection) -> int:
            return retention_sql.purge_batch(self._tx(conn), completed_before, limit, now)

        return self._run("purge a batch of finished instances", purge_them)

    def register_owner(
        self, lease: float, now: float, declares: str | None = None
    ) -> float | None:
        sent = time.monotonic()  # the lease runs from no earlier than this
        server = self._run("register the engine as an owner",
            lambda conn: owners_sql.register(self._tx(conn), lease, now, declares),
            transaction=False)
        self._lease, self._declares = lease, declares
        self._db.renewed(sent, lease)
        return server

    def heartbeat(self, now: float) -> float | None:
        sent = time.monotonic()
        server = self._run("renew the engine's lease",
            lambda conn: owners_sql.heartbeat(self._tx(conn), now), transaction=False)
        if server is None:  # reaped while stalled: come back (its runs are lost already)
            return self.register_owner(self._lease, now, self._declares)
        self._db.renewed(sent, self._lease)
        return server

    def drop_owner(self) -> None:
        # Tried no longer than until the lease is known lost (Connections.run), so stop()
        # returns within the lease: an unreachable server leaves the row for the lease to expire.
        self._run("remove the engine's owner row", lambda conn: owners_sql.drop(self._tx(conn)),
            transaction=False, past_lease=0.0)
        self._db.renewed(None, self._lease)

    def look_around(self, workflows: list[str], now: float) -> Look:
        return self._run("look at the store",
            lambda conn: owners_sql.look_around(self._tx(conn), workflows, now), transaction=False)

    def cancel(self, workflow: str, instance_id: str, *, now: float) -> Ended:
        return self._run("cancel the instance", lambda conn: cancel_sql.cancel(
            self._tx(conn), workflow, instance_id, now), workflow, instance_id)

    def time_out(self, clock: Callable[[], float], at: float) -> list[TimedOut]:
        # Most looks find none due: one read answers those, outside a transaction.
        if not self._run("look for timed-out instances",
                lambda conn: shared.any_timeout_due(self._tx(conn), clock()), transaction=False):
            return []
        return self._run("time out instances",
                         lambda conn: shared.time_out_due(self._tx(conn), clock, at))

    def claim_queued(
        self, queue: str, workflows: list[str], *, concurrency: int | None,
        per_process: int | None, rate: tuple[int, float] | None, clock: Callable[[], float],
        at: float, batch: int, per_key: int | None = None,
    ) -> Claimed:
        if not workflows:
            return Claimed()
        # Most looks find nothing queued: one read answers those, outside a transaction.
        if not self._db.run("look at the queue",
                lambda conn: queue_sql.any_queued(self._tx(conn), queue), transaction=False):
            return Claimed()

        def take(conn: Connection) -> Claimed:
            return queue_sql.claim(self._tx(conn), queue=queue, workflows=workflows,
                concurrency=concurrency, per_process=per_process, rate=rate, clock=clock, at=at,
                batch=batch, per_key=per_key)

        return self._db.run("claim queued instances", take)

    def queued(self, queue: str, workflows: list[str]) -> int:
        return self._db.run("count the queued instances",
            lambda conn: queue_sql.queued(self._tx(conn), queue, workflows), transaction=False)

    def set_queue_paused(self, queue: str, paused: bool, at: float) -> bool:
        what = f"{'pause' if paused else 'resume'} the queue {queue!r}"
        return self._db.run(
            what, lambda conn: queue_sql.set_paused(self._tx(conn), queue, paused, at))

    def start_children(self, waits: list[StepWrite], rows: list[InstanceRow]) -> list[str]:
        if not rows:
            return []
        return self._db.run(
            "start the children", lambda conn: claims.start_children(self._tx(conn), waits, rows),
            waits[0].workflow, waits[0].instance_id, waits[0].key)

    def set_traceparent(self, workflow: str, instance_id: str, traceparent: str) -> None:
        self._run("store the trace context", lambda conn: shared.set_traceparent(self._tx(conn),
            workflow, instance_id, traceparent), workflow, instance_id, transaction=False)

    def declare_schedules(self, schedules: list[ScheduleRow], at: float) -> list[ScheduleRow]:
        return self._run("declare the schedules",
            lambda conn: schedules_sql.declare(self._tx(conn), schedules, at))

    def fire_ticks(self, name: str, last: str | None, firing: TickFiring) -> TicksFired:
        return self._run(f"fire the schedule {name!r}",
                         lambda conn: schedules_sql.fire(self._tx(conn), name, last, firing))

    def next_deadline(self) -> float | None:
        return self._run("read the next timer deadline",
                         lambda conn: timers.next_deadline(self._tx(conn)), transaction=False)

    def get_instance(self, workflow: str, instance_id: str) -> InstanceRow | None:
        return self._run("read the instance",
            lambda conn: reads.get_instance(self._tx(conn), workflow, instance_id), workflow,
            instance_id, transaction=False)

    def list_instances(self, workflow: str) -> list[InstanceRow]:
        return self._run("list instances",
                         lambda conn: reads.list_instances(self._tx(conn), workflow),
                         workflow, transaction=False)

    def list_steps(self, workflow: str, instance_id: str) -> list[StepRecord]:
        return self._run(
            "read the steps", lambda conn: reads.list_steps(self._tx(conn), workflow, instance_id),
            workflow, instance_id, transaction=False)

    def read_rows(self, what: str, sql_text: str, params: dict[str, Any]) -> list[dict[str, Any]]:
        """Rows of one read-only query with ``:name`` parameters, as dicts (``sql.reads``)."""
        return self._run(what, lambda conn: reads.read_rows(self._tx(conn), sql_text, params),
                         transaction=False)

    def session(self) -> AbstractContextManager[None]:
        return self._db.session()

    def close(self) -> None:
        self.listen(None)
        self._db.close()
