"""The storage interface: what a run needs (``RunStore``), and a whole store (``Store``: that
and ``memable._store.operator.OperatorStore``).

Each guarantee holds without SQLite's database-wide write lock (PostgreSQL uses row locks).
Failures below a store reach the engine as ``StorageError`` (naming workflow, instance and
key); a check inside a transaction raises the matching ``EngineError``, writing nothing.

Times passed to a store are ``float`` epoch seconds, UTC (``clock.wall()``), stored as
``_clock.iso_utc`` text or compared as numbers (deadlines, leases). Rows keep their stored
form both ways: ``InstanceRow`` times are ISO text; a value read and handed back (a
failure's ``failed_at``, a schedule's ``last`` tick) goes back as read."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Literal, Protocol

from .._records import StatusName
from .operator import OperatorStore
from .rows import (
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

#: How durable a commit is when the call that made it returns: "full" survives
#: a power cut (or a database server crash), "normal" an application crash.
Synchronous = Literal["full", "normal"]


class RunStore(Protocol):
    """What an engine needs from a store to carry its runs on, and what each guarantees.

    Every method is thread-safe; every write atomic (all committed before it returns, or none
    and it raises). "Owned": the instance's owner is this engine, checked in the write's
    transaction under a lock keeping its other writers out until commit (SQLite's write lock;
    row locks on a server). A write finding it not owned raises ``LostInstance`` and writes
    nothing: the fence that keeps a stalled engine from writing after a takeover."""

    #: This engine's id as an owner of instances (its row in ``owners``).
    owner: str

    def create_instance(self, row: InstanceRow, start_at: float | None = None) -> bool:
        """Insert ``row``, owned by this store's engine; False (nothing written) if it exists.
        With ``start_at``, a delayed start: stored suspended, nobody's, on a waiting timer step
        ``sql.instances.START_KEY`` due then, whose firing makes it ready."""

    def begin_run(
        self, workflow: str, instance_id: str, *, now: float, claim: Claim
    ) -> RunSnapshot | None:
        """Claim the instance for a run of this engine, as ``claim`` allows, at ``now``.

        Only if ``Claim``'s condition holds (a live owner other than this engine never loses
        an instance to it): mark it running and owned (a queue's: queued, keeping its place)
        and read its input and steps. None, nothing written, if unknown or not claimable."""

    def save_step(self, write: StepWrite) -> None:
        """Store one step outcome (completed or failed); only if owned, never over a completed
        row. A key stored as another kind (an early signal) raises ``InvalidKey``. Allowed on a
        cancelled instance: the step in flight stores its outcome."""

    def check_run(self, workflow: str, instance_id: str) -> StatusName:
        """The instance's status, read before a step executes; ``LostInstance`` if not owned.
        Answered without a read only while no other connection's commit can have changed
        status or owner (SQLite watches the WAL's commit counter)."""

    def set_status(self, workflow: str, instance_id: str, message: str) -> None:
        """Store the run's status message now; only if owned (else ``LostInstance``)."""

    def record_in_flight(self, steps: list[tuple[str, str, str, float]]) -> None:
        """Note, for operators, the step each run executes: (workflow, id, key, since).
        Written at heartbeats, for instances this engine owns and runs: an entry may outlive
        its step until the next one (readers compare it with the step's row)."""

    def read_step(self, workflow: str, instance_id: str, key: str) -> StoredStep | None:
        """The stored row of one key, or None."""

    def suspend(
        self, waiting: StepWrite, message: str, deadline: float | None, now: float
    ) -> Suspend:
        """End this engine's run at a suspend point, timer or retry backoff, in one transaction.

        Only if owned and running (cancelled: "stopped", nothing armed); a key stored as
        another kind raises ``InvalidKey``. Mark the key waiting (arming ``deadline`` once)
        and the instance suspended and unowned; but if the key has its outcome meanwhile (a
        signal, or ``deadline`` due at ``now``, fired here), the instance stays running and
        owned, and the steps to go on with are returned."""

    def deliver_signal(self, write: StepWrite, traceparent: str | None = None) -> None:
        """Store a signal payload as its key's value, and ``traceparent`` for the next run.

        Raise InstanceNotFound, InstanceFinished or SignalRejected (the key holds a value,
        timed out, or was reached as a step or timer). A key not reached yet is stored at
        ``UNREACHED`` until it is. Its armed deadline is dropped in the same transaction: of
        a signal and a deadline firing at once, exactly one wins."""

    def place_signal(self, workflow: str, instance_id: str, key: str, seq: int) -> None:
        """Store ``seq`` as the place of a signal stored at ``UNREACHED``, now that the run
        reached its key, before any later step; only if owned (else ``LostInstance``)."""

    def set_traceparent(self, workflow: str, instance_id: str, traceparent: str) -> None:
        """Store the trace context the instance's next run continues, if the instance exists."""

    def fire_due_timers(
        self, clock: Callable[[], float], at: float
    ) -> list[tuple[str, str, str, float]]:
        """Fire every timer due by ``clock`` at ``at``; return (workflow, id, key, deadline)s.

        Due is judged, as in ``time_out``, by a ``clock`` reading after the store read. Each
        timer is fired (its row deleted, a timer key completed, a suspend point without a
        signal timed out) by exactly one caller across every engine. A due retry backoff is
        deleted and returned; its step stays as it is."""

    def time_out(self, clock: Callable[[], float], at: float) -> list[TimedOut]:
        """Cancel (as ``cancel``) each unended instance whose workflow timeout passed by
        ``clock``, status "timed out after <duration>", at ``at``; return them (100 at most).

        Due is judged by a ``clock`` reading after the store read (``shared.time_out_due``),
        so one created after it by a clock since gone back is not timed out. Each is checked
        and cancelled in one transaction: one caller times it out, and a crash leaves it due."""

    def next_deadline(self) -> float | None:
        """The earliest armed timer deadline or workflow timeout, or None."""

    def finish(self, workflow: str, instance_id: str, end: RunEnd) -> Ended:
        """Record how this engine's run ended (only while owned and running), and release the
        instance. A child's terminal end settles its parent's step in the same transaction
        and, if the parent waited for that (the key, or its group's last child), names it to
        ``wake``."""

    def cancel(self, workflow: str, instance_id: str, *, now: float) -> Ended:
        """Mark the instance and its unended descendants Cancelled; drop their timers.

        Owners stay, so a run in flight can store its current step; later writes carrying a run
        on are refused. A cancelled child fails its parent's step (may name it to ``wake``).
        Raise InstanceNotFound, or InstanceFinished if Completed or Cancelled."""

    def claim_queued(
        self, queue: str, workflows: list[str], *, concurrency: int | None,
        per_process: int | None, rate: tuple[int, float] | None, clock: Callable[[], float],
        at: float, batch: int, per_key: int | None = None,
    ) -> Claimed:
        """Claim up to ``batch`` queued instances of ``queue`` (of ``workflows``).

        By priority, then by when runnable; at most ``concurrency`` running in all,
        ``per_process`` here, ``rate = (count, period)`` claims per ``period`` seconds (by the
        database's clock, else ``clock`` read in the transaction: starts recorded in commit
        order), ``per_key`` per ``concurrency_key`` (a key at its limit is skipped, not waited
        for). Count and claim are one transaction every claimer of the queue waits for,
        marking the claimed running and owned here; none while the queue is paused."""

    def queued(self, queue: str, workflows: list[str]) -> int:
        """How many instances of ``workflows`` wait in ``queue``: none while it is paused."""

    def start_children(self, waits: list[StepWrite], rows: list[InstanceRow]) -> list[str]:
        """Record a parent's child steps (``waits``) as waiting and create the children
        (``rows``, owned here); return the ids of those created. Only if the parent is owned
        and running (cancelled: ``RunCancelled``). An existing child id is left as it was: a
        parent that crashed after starting it makes no second."""

    def fork_instance(
        self, workflow: str, instance_id: str, new_id: str, from_key: str | None, now: float
    ) -> bool:
        """Create ``new_id``, a fork of the instance from ``from_key`` (see ``sql.forks``):
        its completed steps reached before that key (all when None) copied, ready to run.
        False if ``new_id`` exists; ``InstanceNotFound``, or ``StepNotFound`` for a key the
        source never reached. The source is only read."""

    def declare_schedules(self, schedules: list[ScheduleRow], at: float) -> list[ScheduleRow]:
        """Store this engine's schedule declarations; return the stored rows. A schedule new
        to the store, or whose cron or zone changed (no catch-up across a change), counts its
        ticks from ``at``; its workflow is the declaration's."""

    def fire_ticks(self, name: str, last: str | None, firing: TickFiring) -> TicksFired:
        """Record a firing of schedule ``name`` planned from its last tick ``last``.

        Only while the stored last tick is still ``last`` (else another engine fired these:
        ``won`` False, nothing written). The last tick becomes ``firing.last_tick``, missed
        ticks are counted, and each of ``firing.rows`` is created unless it exists, or
        ``firing.skip_overlap`` and an earlier tick's instance has not ended (skipped). A
        queued instance created tells the queue's consumers."""

    def register_owner(
        self, lease: float, now: float, declares: str | None = None
    ) -> float | None:
        """Record this engine as an owner, alive for ``lease`` seconds from ``now``, with what
        it ``declares`` it runs (``_queues.Declarations`` JSON). Return the store's clock as it
        wrote the row (same round trip) where leases are judged by it (PostgreSQL's server),
        else None (SQLite: judged by ``now``)."""

    def heartbeat(self, now: float) -> float | None:
        """Renew this engine's lease from ``now`` (and its owner row if someone reaped it);
        return as ``register_owner`` does."""

    def drop_owner(self) -> None:
        """Remove this engine's owner row (at stop); with the store unreachable, raise
        ``StorageError`` once the lease is known lost, leaving the row to expire."""

    def look_around(self, workflows: list[str], now: float) -> Look:
        """What other processes changed, for these workflows, judged at ``now``; owners in
        this PID namespace whose process is gone are reaped first, others by their lease."""

    def get_instance(self, workflow: str, instance_id: str) -> InstanceRow | None:
        """The instance's row, or None."""

    def listen(self, changed: Callable[[str, str | None, str | None], None] | None) -> None:
        """Tell ``changed(kind, workflow, instance_id)`` what other engines write, as they do:
        kind "signal", "cancel", "timer" (armed), or "poll" (workflow and id None). None stops.
        A store that cannot tell (SQLite) does nothing; the poll is the safety net."""

    def session(self) -> AbstractContextManager[None]:
        """Within (one run, on its thread), share one connection among the thread's operations.
        An operation meeting a lost connection is retried until the lease is known lost, then
        raises ``LeaseLost`` (PostgreSQL)."""

    def close(self) -> None:
        """Release the store; later calls raise ``StorageError``."""


class Store(RunStore, OperatorStore, Protocol):
    """A whole store: ``RunStore`` and ``OperatorStore``, as both stores implement them. Only
    what needs both (the engine, a queue's consumer reading the live engines' declarations,
    the command line's actions) holds a store as this."""
