"""The storage interface the engine speaks to: what a run needs (``RunStore``), and the
whole of a store (``Store``: that and what an operator reads and does,
``memable._store.operator.OperatorStore``).

Two stores implement it: one SQLite file (``memable._sqlite``) and a
PostgreSQL schema (``memable._postgres``). Each operation states the guarantee
it gives atomically, without relying on SQLite's database-wide write lock
being the only lock, so the PostgreSQL store meets the same contract with row
locks. Only a
store speaks SQL. What goes wrong below it reaches the engine as
``StorageError`` (naming workflow, instance and key); the checks a store
makes inside a transaction (a signal to a finished instance, say) raise the
matching ``EngineError``, and the transaction writes nothing.

Every time a caller passes a store is a ``float``: epoch seconds, UTC (an
engine's ``clock.wall()``), named for what it is (``now``, ``at``, ``deadline``,
``started``). A store writes it as the stored text where a column holds ISO
8601 (``_clock.iso_utc``: the same text for the same time), and compares it
as a number where a column holds epoch seconds (deadlines, leases). Rows keep
their stored form both ways: an ``InstanceRow``'s times are ISO 8601 text, and
a value read from the store and handed back to it (a failure's ``failed_at``, a
schedule's ``last`` tick) is passed back as it was read.
"""

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
    """What an engine needs from a store to carry its runs on, and what each operation
    guarantees.

    Every method is thread-safe. Every write is atomic: all of it is
    committed before the method returns, or none of it is and the method
    raises. "Owned" means the instance's owner is this store's engine,
    checked in the same transaction as the write it guards, under a lock that
    keeps every other writer of that instance out until the commit (SQLite's
    database write lock; row locks on a server database). A write of a run
    that finds its instance not owned raises ``LostInstance`` and writes
    nothing: that is the fence that keeps a stalled engine from writing after
    another took over.
    """

    #: This engine's id as an owner of instances (its row in ``owners``).
    owner: str

    # Creating and claiming an instance.

    def create_instance(self, row: InstanceRow, start_at: float | None = None) -> bool:
        """Insert ``row``, owned by this store's engine; False (nothing written) if it exists.

        With ``start_at`` (epoch seconds), a delayed start, atomically with the row:
        the instance (stored suspended, nobody's, waiting on the key
        ``sql.instances.START_KEY``) gets that key as a waiting timer step and its
        timer, due then; its firing makes the instance ready, as any timer does.
        """

    def begin_run(
        self, workflow: str, instance_id: str, *, now: float, claim: Claim
    ) -> RunSnapshot | None:
        """Claim the instance for a run of this engine, as ``claim`` allows, at ``now``
        (epoch seconds, UTC).

        Atomically: only if the claim's condition holds (see ``Claim``; a
        live owner other than this engine never loses an instance to it),
        mark it running and owned and read its input and steps. An instance
        of a queue is marked queued instead (it waits for a slot; a queued
        one keeps its place), and its snapshot says so. None, and nothing
        written, if unknown or not claimable.
        """

    # A run's steps.

    def save_step(self, write: StepWrite) -> None:
        """Store one step outcome (completed or failed).

        Atomically, only if owned (else ``LostInstance``), and only over a row
        of the same kind that is not completed: a completed row is never
        overwritten, and a key stored as another kind (an early signal)
        raises ``InvalidKey`` naming it. Allowed on a cancelled instance: the
        step in flight at a cancel stores its outcome.
        """

    def check_run(self, workflow: str, instance_id: str) -> StatusName:
        """The instance's status, read before a step executes; ``LostInstance`` if not owned.

        A store may answer without reading while it knows that nothing can
        have changed the instance's status or owner since it last read them
        (the SQLite store watches the WAL's commit counter); never from
        knowledge older than the last commit of another connection.
        """

    def set_status(self, workflow: str, instance_id: str, message: str) -> None:
        """Store the run's status message now; only if owned (else ``LostInstance``)."""

    def record_in_flight(self, steps: list[tuple[str, str, str, float]]) -> None:
        """Note, for operators, the step each run is executing: (workflow, id, key, since),
        ``since`` in epoch seconds, UTC.

        Only for instances this engine owns and runs; written at heartbeats,
        so a step shows once it has run that long, and an entry may outlive
        its step until the next one (readers compare it with the step's row).
        """

    def read_step(self, workflow: str, instance_id: str, key: str) -> StoredStep | None:
        """The stored row of one key, or None."""

    # Waits: suspending, signals, timers and workflow timeouts.

    def suspend(
        self, waiting: StepWrite, message: str, deadline: float | None, now: float
    ) -> Suspend:
        """End this engine's run at a suspend point, timer or retry backoff, in one transaction
        (``deadline`` and ``now``: epoch seconds, UTC).

        Only if owned (else ``LostInstance``) and still running: a cancelled
        instance gets no waiting row and no timer ("stopped"). A key stored
        as another kind raises ``InvalidKey``. Mark the key waiting (arming
        the timer once, with ``deadline``) and the instance suspended and
        unowned. A suspend point's ``deadline`` is armed the same way. If the
        key has its outcome meanwhile (a signal arrived, or the timer or
        deadline is due at ``now``, which fires it here: a timer completes, a
        deadline times the key out), the instance stays running and owned
        instead, and the steps to go on with are returned.
        """

    def deliver_signal(self, write: StepWrite, traceparent: str | None = None) -> None:
        """Store a signal payload as its key's completed value, atomically (and, if given,
        the trace context the instance's next run continues).

        Raise InstanceNotFound, InstanceFinished (a terminal instance) or
        SignalRejected (the key holds a value, timed out, or was reached as a
        step or a timer), writing nothing, when the instance cannot take it.
        A key the run has reached keeps its seq; one it has not is stored at
        ``UNREACHED`` (after every step) until the run reaches it.
        The key's deadline, if armed, is dropped in the same transaction: of
        a signal and a deadline firing at once, exactly one takes the key.
        """

    def place_signal(self, workflow: str, instance_id: str, key: str, seq: int) -> None:
        """Store ``seq`` as the place of a signal stored before the run reached its key
        (seq ``UNREACHED``), now that it has; only if owned (else ``LostInstance``).
        Before any later step of the run is stored."""

    def set_traceparent(self, workflow: str, instance_id: str, traceparent: str) -> None:
        """Store the trace context the instance's next run continues (a signal's or a
        resume's span); nothing if there is no such instance."""

    def fire_due_timers(
        self, clock: Callable[[], float], at: float
    ) -> list[tuple[str, str, str, float]]:
        """Claim every timer due by the time ``clock`` (epoch seconds) tells and complete
        its key, at ``at`` (epoch seconds, UTC); return (workflow, id, key, deadline)s.

        As ``time_out`` does, a timer is judged due by a reading of ``clock`` taken
        after it was read from the store, never by one taken before: a timer armed
        after that reading by a clock that had since gone back is not fired by it.

        Atomically per call: a timer is fired (its row deleted, a timer key
        completed, a suspend point that holds no signal yet timed out) by
        exactly one caller across every engine on the store. A due retry
        backoff is deleted and returned; its step stays as it is.
        """

    def time_out(self, clock: Callable[[], float], at: float) -> list[TimedOut]:
        """Cancel, as ``cancel`` does, each instance whose workflow timeout passed by the
        time ``clock`` (epoch seconds) tells and that has not ended (running, suspended or
        queued), with the status "timed out after <duration>", at ``at`` (epoch seconds,
        UTC); return them (at most 100 per call).

        An instance is judged due by a reading of ``clock`` taken after it was read
        from the store (``shared.time_out_due``), never by one taken before: an
        instance created after that reading, by a clock that had since gone back (a
        frozen test clock started meanwhile, a clock stepped back), is not timed out
        by it.

        Each is checked due and cancelled in one transaction, so exactly one caller
        across every engine on the store times it out, and a crash before the
        commit leaves it due for the next look; one that ended first is left.
        """

    def next_deadline(self) -> float | None:
        """The earliest armed timer deadline or workflow timeout, or None."""

    # A run's end, and a cancel.

    def finish(self, workflow: str, instance_id: str, end: RunEnd) -> Ended:
        """Record how this engine's run ended, and release the instance, atomically.

        Only while owned and running; not recorded (only the release written)
        if the instance is no longer running under this engine: cancelled
        meanwhile, or taken over. The end of a child (a terminal ``end.status``)
        settles its parent's step in the same transaction (the output, or the
        failure) and, if that was what the parent waited for (the key, or the
        last pending child of its group), names the parent to ``wake``.
        """

    def cancel(self, workflow: str, instance_id: str, *, now: float) -> Ended:
        """Mark the instance and its descendants that have not ended Cancelled, at ``now``
        (epoch seconds, UTC), atomically.

        Their timers are dropped. The owners stay, so a run in flight can
        store its current step; every later write that would carry a run on
        is refused. A cancelled child settles its parent's step as failed
        (and may name the parent to ``wake``, as ``finish`` does). Raise
        InstanceNotFound, or InstanceFinished for a Completed or Cancelled one
        (writing nothing).
        """

    # Queues' claims.

    def claim_queued(
        self, queue: str, workflows: list[str], *, concurrency: int | None,
        per_process: int | None, rate: tuple[int, float] | None, clock: Callable[[], float],
        at: float,
        batch: int,
        per_key: int | None = None,
    ) -> Claimed:
        """Claim up to ``batch`` queued instances of ``queue`` (of ``workflows``), atomically,
        at ``at`` (epoch seconds, UTC).

        Next by priority, then by when they became runnable; no more than
        the queue's limits let start now: ``concurrency`` running instances
        of the queue in all, ``per_process`` of this engine's, ``rate =
        (count, period)`` claims in any window of ``period`` seconds, by the
        database's clock where there is one, else by ``clock`` read inside the
        transaction (so starts are recorded in the order they commit). The count and the claim are
        one transaction that every other claimer of the queue waits for; a
        claimed instance is marked running and owned by this engine in it.
        Nothing is claimed while the queue is paused (read in that transaction;
        see ``OperatorStore.set_queue_paused``). ``per_key``: no more than that many of the
        queue's instances with one ``concurrency_key`` hold a slot at once (those
        claimed here counted); the instances of a key at its limit are skipped,
        not waited for, so the next ones of other keys (and those without a key)
        are claimed in the queue's order.
        """

    def queued(self, queue: str, workflows: list[str]) -> int:
        """How many instances of ``workflows`` wait in ``queue`` for a claim to take them:
        none while the queue is paused."""

    # Children and forks.

    def start_children(self, waits: list[StepWrite], rows: list[InstanceRow]) -> list[str]:
        """Record a parent's child steps as waiting and create the children, atomically.

        ``waits`` are the parent's rows (kind ``"child"``), ``rows`` the
        children, owned by this engine. Only if the parent is owned (else
        ``LostInstance``) and running (cancelled: ``RunCancelled``, nothing
        written). A child id that exists is left as it was, so a parent that
        crashed after starting a child never makes a second. Return the ids
        of the children created.
        """

    def fork_instance(
        self, workflow: str, instance_id: str, new_id: str, from_key: str | None, now: float
    ) -> bool:
        """Create ``new_id``, a fork of the instance from ``from_key``, at ``now`` (epoch
        seconds, UTC), atomically (see ``sql.forks``): its completed steps reached before
        that key (every completed one when None) copied, ready for an engine that runs the
        workflow. False, and nothing written, if ``new_id`` exists; ``InstanceNotFound``,
        or ``StepNotFound`` for a key the source never reached, each writing nothing. The
        source is only read."""

    # Schedules' firings.

    def declare_schedules(self, schedules: list[ScheduleRow], at: float) -> list[ScheduleRow]:
        """Store this engine's schedule declarations, atomically; return the stored rows.

        A schedule new to the store counts its ticks from ``at`` (epoch seconds, UTC;
        stored as ``since``);
        one whose stored cron or zone differs takes the declaration's and
        counts from ``at`` too (no catch-up across a change); its workflow
        is the declaration's.
        """

    def fire_ticks(self, name: str, last: str | None, firing: TickFiring) -> TicksFired:
        """Record a firing of schedule ``name`` planned from its last tick ``last``, atomically.

        Only while the stored last tick is still ``last``: else another engine
        fired these ticks, and nothing is written (``won`` False). Else the
        last tick becomes ``firing.last_tick``, its missed ticks are counted,
        and each of ``firing.rows`` is created (running here, or queued),
        unless ``firing.skip_overlap`` and an earlier tick's instance of the
        schedule has not ended (then it is counted skipped), or its id is
        there already. A created queued instance tells the queue's consumers.
        """

    # Owners and their leases, and what other engines changed.

    def register_owner(
        self, lease: float, now: float, declares: str | None = None
    ) -> float | None:
        """Record this engine as an owner on the store, alive for ``lease`` seconds from
        ``now`` (epoch seconds, UTC), with what it ``declares`` it runs
        (``_queues.Declarations`` JSON).

        Returns the store's own clock (seconds since the epoch) as it wrote the row,
        where leases are judged by a clock of the store's (PostgreSQL: the server's),
        read in the same round trip; None where they are judged by ``now`` (SQLite).
        """

    def heartbeat(self, now: float) -> float | None:
        """Renew this engine's lease from ``now`` (epoch seconds, UTC), and its owner row if
        someone reaped it; the store's own clock as it did, as ``register_owner`` returns
        it."""

    def drop_owner(self) -> None:
        """Remove this engine's owner row (at stop; it runs nothing any more).

        With the store unreachable it raises ``StorageError`` once the lease is known
        lost at the latest (no longer than a run's writes retry), and the row is left
        for the lease to expire.
        """

    def look_around(self, workflows: list[str], now: float) -> Look:
        """What other processes changed, for these workflows, judged at ``now`` (epoch
        seconds, UTC).

        Owners in this process's PID namespace whose process is gone (or a
        zombie) are reaped first; owners elsewhere only by their lease.
        """

    def get_instance(self, workflow: str, instance_id: str) -> InstanceRow | None:
        """The instance's row, or None."""

    def listen(self, changed: Callable[[str, str | None, str | None], None] | None) -> None:
        """Tell ``changed(kind, workflow, instance_id)`` what other engines write, as they do.

        kind: "signal", "cancel", "timer" (armed), or "poll" (anything:
        look at the store; workflow and id None). None stops listening. A
        store that cannot tell (SQLite: the engines on one file are found by
        the poll) does nothing; the poll stays the safety net either way.
        """

    # The store itself.

    def session(self) -> AbstractContextManager[None]:
        """Within (one run, on its thread): the thread's operations may share one connection.

        A store whose operations each take a connection from a pool holds one
        for the whole run instead; the SQLite store has one connection anyway.
        Within, an operation that meets a lost connection is retried until the
        engine's lease is known lost, then raises ``LeaseLost`` (PostgreSQL).
        """

    def close(self) -> None:
        """Release the store; later calls raise ``StorageError``."""


class Store(RunStore, OperatorStore, Protocol):
    """A store: what a run needs of it (``RunStore``) and what an operator reads and does
    (``OperatorStore``), both, as the SQLite and the PostgreSQL store implement them.
    Only what holds the store for both (the engine, a queue's consumer that reads the
    live engines' declarations, the command line's actions) holds it as this."""
