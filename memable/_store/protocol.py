"""The storage interface the engine speaks to, and the rows it passes.

Two stores implement it: one SQLite file (``memable._sqlite``) and a
PostgreSQL schema (``memable._postgres``). Each operation states the guarantee
it gives atomically, without relying on SQLite's database-wide write lock
being the only lock, so the PostgreSQL store meets the same contract with row
locks. Only a
store speaks SQL. What goes wrong below it reaches the engine as
``StorageError`` (naming workflow, instance and key); the checks a store
makes inside a transaction (a signal to a finished instance, say) raise the
matching ``EngineError``, and the transaction writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Literal, Protocol

from .._records import StatusName, StepRecord
from .rows import (
    Claim,
    Claimed,
    Ended,
    InstanceRow,
    InstanceView,
    Look,
    OwnerRow,
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


class Store(Protocol):
    """What the engine needs from a store, and what each operation guarantees.

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

    def create_instance(self, row: InstanceRow, start_at: float | None = None) -> bool:
        """Insert ``row``, owned by this store's engine; False (nothing written) if it exists.

        With ``start_at`` (epoch seconds), a delayed start, atomically with the row:
        the instance (stored suspended, nobody's, waiting on the key
        ``sql.instances.START_KEY``) gets that key as a waiting timer step and its
        timer, due then; its firing makes the instance ready, as any timer does.
        """

    def begin_run(
        self, workflow: str, instance_id: str, *, now: str, claim: Claim
    ) -> RunSnapshot | None:
        """Claim the instance for a run of this engine, as ``claim`` allows.

        Atomically: only if the claim's condition holds (see ``Claim``; a
        live owner other than this engine never loses an instance to it),
        mark it running and owned and read its input and steps. An instance
        of a queue is marked queued instead (it waits for a slot; a queued
        one keeps its place), and its snapshot says so. None, and nothing
        written, if unknown or not claimable.
        """

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

    def record_in_flight(self, steps: list[tuple[str, str, str, str]]) -> None:
        """Note, for operators, the step each run is executing: (workflow, id, key, since).

        Only for instances this engine owns and runs; written at heartbeats,
        so a step shows once it has run that long, and an entry may outlive
        its step until the next one (readers compare it with the step's row).
        """

    def read_step(self, workflow: str, instance_id: str, key: str) -> StoredStep | None:
        """The stored row of one key, or None."""

    def suspend(
        self, waiting: StepWrite, message: str, deadline: float | None, now: float
    ) -> Suspend:
        """End this engine's run at a suspend point, timer or retry backoff, in one transaction.

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

    def mark_resumable(self, workflow: str, instance_id: str, now: str) -> str:
        """Mark a failed, suspended or completed instance ready to run again, atomically, for
        an engine's next look (``memable resume``: no engine here); return the status it had.

        It is stored suspended and ready (``children_pending`` 0, which every
        poll runs on, as after ``release``) and nobody's; a running or queued
        one is left as it is. Raise InstanceNotFound, or InstanceFinished for a
        Cancelled one (writing nothing).
        """

    def resume_failure(
        self, workflow: str, instance_id: str, failed_at: str, now: str
    ) -> bool:
        """Mark the instance ready to run again as ``mark_resumable`` does, atomically, only
        if it is still the failure a bulk resume counted (failed, at ``failed_at``) and not
        a child whose failure was handled (its parent ended, or raised ``ChildFailed`` for
        it); whether it did."""

    def fire_due_timers(
        self, clock: Callable[[], float], at: str
    ) -> list[tuple[str, str, str, float]]:
        """Claim every timer due by the time ``clock`` (epoch seconds) tells and complete
        its key; return (workflow, id, key, deadline)s.

        As ``time_out`` does, a timer is judged due by a reading of ``clock`` taken
        after it was read from the store, never by one taken before: a timer armed
        after that reading by a clock that had since gone back is not fired by it.

        Atomically per call: a timer is fired (its row deleted, a timer key
        completed, a suspend point that holds no signal yet timed out) by
        exactly one caller across every engine on the store. A due retry
        backoff is deleted and returned; its step stays as it is.
        """

    def time_out(self, clock: Callable[[], float], at: str) -> list[TimedOut]:
        """Cancel, as ``cancel`` does, each instance whose workflow timeout passed by the
        time ``clock`` (epoch seconds) tells and that has not ended (running, suspended or
        queued), with the status "timed out after <duration>"; return them (at most 100
        per call).

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

    def finish(self, workflow: str, instance_id: str, end: RunEnd) -> Ended:
        """Record how this engine's run ended, and release the instance, atomically.

        Only while owned and running; not recorded (only the release written)
        if the instance is no longer running under this engine: cancelled
        meanwhile, or taken over. The end of a child (a terminal ``end.status``)
        settles its parent's step in the same transaction (the output, or the
        failure) and, if that was what the parent waited for (the key, or the
        last pending child of its group), names the parent to ``wake``.
        """

    def cancel(self, workflow: str, instance_id: str, *, now: str) -> Ended:
        """Mark the instance and its descendants that have not ended Cancelled, atomically.

        Their timers are dropped. The owners stay, so a run in flight can
        store its current step; every later write that would carry a run on
        is refused. A cancelled child settles its parent's step as failed
        (and may name the parent to ``wake``, as ``finish`` does). Raise
        InstanceNotFound, or InstanceFinished for a Completed or Cancelled one
        (writing nothing).
        """

    def claim_queued(
        self, queue: str, workflows: list[str], *, concurrency: int | None,
        per_process: int | None, rate: tuple[int, float] | None, clock: Callable[[], float],
        at: str,
        batch: int,
        per_key: int | None = None,
    ) -> Claimed:
        """Claim up to ``batch`` queued instances of ``queue`` (of ``workflows``), atomically.

        Next by priority, then by when they became runnable; no more than
        the queue's limits let start now: ``concurrency`` running instances
        of the queue in all, ``per_process`` of this engine's, ``rate =
        (count, period)`` claims in any window of ``period`` seconds, by the
        database's clock where there is one, else by ``clock`` read inside the
        transaction (so starts are recorded in the order they commit). The count and the claim are
        one transaction that every other claimer of the queue waits for; a
        claimed instance is marked running and owned by this engine in it.
        Nothing is claimed while the queue is paused (read in that transaction;
        see ``set_queue_paused``). ``per_key``: no more than that many of the
        queue's instances with one ``concurrency_key`` hold a slot at once (those
        claimed here counted); the instances of a key at its limit are skipped,
        not waited for, so the next ones of other keys (and those without a key)
        are claimed in the queue's order.
        """

    def queued(self, queue: str, workflows: list[str]) -> int:
        """How many instances of ``workflows`` wait in ``queue`` for a claim to take them:
        none while the queue is paused."""

    def set_queue_paused(self, queue: str, paused: bool, at: str) -> bool:
        """Store ``queue`` as paused (since ``at``) or not, atomically; return whether that
        changed its stored state (False: it was so already, and nothing was written).

        Every claim of the queue (``claim_queued``) reads this state in its own
        transaction, under the lock that keeps the queue's other claimers out, and
        pausing takes that lock too: once a pause returns, no claim of any engine on
        the store starts another of the queue's instances until it is resumed. Runs in
        flight are left alone, and invokes onto the queue are still stored queued. A
        resume tells the queue's consumers at once where the store can (PostgreSQL:
        NOTIFY, as an enqueue does); elsewhere their poll finds it.
        """

    def paused_queues(self) -> dict[str, str | None]:
        """The queues stored as paused, by name, each with when it was paused."""

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
        self, workflow: str, instance_id: str, new_id: str, from_key: str | None, now: str
    ) -> bool:
        """Create ``new_id``, a fork of the instance from ``from_key``, atomically (see
        ``sql.forks``): its completed steps reached before that key (every completed
        one when None) copied, ready for an engine that runs the workflow. False, and
        nothing written, if ``new_id`` exists; ``InstanceNotFound``, or ``StepNotFound``
        for a key the source never reached, each writing nothing. The source is only
        read."""

    def purge_batch(self, completed_before: str, limit: int, now: float) -> int:
        """Delete at most ``limit`` finished instances completed before then (ISO 8601
        text), with their steps and timers, in one transaction; how many.

        An instance goes only if, in that transaction, it is terminal, has no
        run in flight (owned by nobody, or by an owner whose lease ran out at
        ``now``, epoch seconds on the engine's wall clock; PostgreSQL judges
        leases by its own clock), has no child that has not ended or whose run
        is in flight, is not the child of an instance in a run, and is not a
        child its parent waits for (see ``sql.retention``): a run that starts
        after the choice finds the instances it judged by as they were judged
        (PostgreSQL: they are locked until the commit). Safe to call from
        several engines at once: each deletes what is still there (PostgreSQL:
        a batch passes over rows another transaction holds, never waiting for
        them). Fewer than ``limit`` means no more could be taken now. A store
        whose file can shrink (SQLite with ``auto_vacuum = incremental``)
        returns the pages a batch freed in the same transaction. A purge of
        many is many batches (``admin.purge_batches``): a batch's transaction
        is all another engine's write ever waits for.
        """

    def register_owner(
        self, lease: float, now: float, declares: str | None = None
    ) -> float | None:
        """Record this engine as an owner on the store, alive for ``lease`` seconds, with what
        it ``declares`` it runs (``_queues.Declarations`` JSON).

        Returns the store's own clock (seconds since the epoch) as it wrote the row,
        where leases are judged by a clock of the store's (PostgreSQL: the server's),
        read in the same round trip; None where they are judged by ``now`` (SQLite).
        """

    def heartbeat(self, now: float) -> float | None:
        """Renew this engine's lease (and its owner row, if someone reaped it); the store's
        own clock as it did, as ``register_owner`` returns it."""

    def drop_owner(self) -> None:
        """Remove this engine's owner row (at stop; it runs nothing any more).

        With the store unreachable it raises ``StorageError`` once the lease is known
        lost at the latest (no longer than a run's writes retry), and the row is left
        for the lease to expire.
        """

    def look_around(self, workflows: list[str], now: float) -> Look:
        """What other processes changed, for these workflows.

        Owners in this process's PID namespace whose process is gone (or a
        zombie) are reaped first; owners elsewhere only by their lease.
        """

    def get_instance(self, workflow: str, instance_id: str) -> InstanceRow | None:
        """The instance's row, or None."""

    def list_instances(self, workflow: str) -> list[InstanceRow]:
        """Every instance of ``workflow``, oldest first."""

    def list_steps(self, workflow: str, instance_id: str) -> list[StepRecord]:
        """The instance's stored keys, in the order first reached."""

    # Reads an operator makes (``memable list``, ``show``, ``signal``); see ``sql.reads``.

    def list_view(
        self, workflow: str | None, status: str | None, schedule: str | None = None
    ) -> list[tuple[InstanceRow, OwnerRow | None]]:
        """Instances oldest first, optionally of one workflow, in one status, the ticks of
        one schedule, each with its owner's row while it runs."""

    def inspect(self, workflow: str, instance_id: str, now: float) -> InstanceView | None:
        """One instance with its owner, steps, timers and awaited signals (a queued one's
        place judged at ``now``, epoch seconds); None if unknown."""

    def workflows(self) -> list[str]:
        """The names of the workflows the store has instances of."""

    def awaited_signals(self, workflow: str, instance_id: str) -> list[str]:
        """The suspend points the instance waits on now (none once it finished)."""

    def schedules(self) -> list[ScheduleRow]:
        """Every schedule the store knows (declared by some engine, ever), by name."""

    def live_owners(self, now: float) -> list[OwnerRow]:
        """The engines whose lease has not run out at ``now``, with what each declares."""

    def queue_stats(self, queue: str, now: float) -> tuple[int, int, str | None]:
        """(runnable instances, instances holding a slot at ``now``, when the oldest
        runnable one became runnable) of ``queue``: what its gauges show."""

    def status_counts(self) -> list[tuple[str, str, int]]:
        """(workflow, status, how many instances) of every pair the store holds."""

    def instance_page(
        self, workflow: str | None, status: str | None, id_prefix: str | None,
        offset: int, limit: int,
    ) -> list[InstanceRow]:
        """Instances newest first, optionally of one workflow, in one status, with an id
        starting with ``id_prefix``: ``limit`` of them after the first ``offset``, read
        through an index (no scan past the page)."""

    def failed_instances(
        self, workflow: str | None, *, id_prefix: str | None = None,
        since: str | None = None, until: str | None = None, limit: int,
    ) -> list[tuple[str, str, str]]:
        """(workflow, id, when it failed) of failed instances, oldest failure first,
        optionally of one workflow, by id prefix, failed between ``since`` and ``until``;
        at most ``limit``. A failed child whose failure was handled (its parent ended, or
        raised ``ChildFailed`` for it) is not one of them."""

    def queue_names(self) -> list[str]:
        """The queues the store has instances of."""

    def set_traceparent(self, workflow: str, instance_id: str, traceparent: str) -> None:
        """Store the trace context the instance's next run continues (a signal's or a
        resume's span); nothing if there is no such instance."""

    # Schedules.

    def declare_schedules(self, schedules: list[ScheduleRow], at: str) -> list[ScheduleRow]:
        """Store this engine's schedule declarations, atomically; return the stored rows.

        A schedule new to the store counts its ticks from ``at`` (``since``);
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

    def listen(self, changed: Callable[[str, str | None, str | None], None] | None) -> None:
        """Tell ``changed(kind, workflow, instance_id)`` what other engines write, as they do.

        kind: "signal", "cancel", "timer" (armed), or "poll" (anything:
        look at the store; workflow and id None). None stops listening. A
        store that cannot tell (SQLite: the engines on one file are found by
        the poll) does nothing; the poll stays the safety net either way.
        """

    def session(self) -> AbstractContextManager[None]:
        """Within (one run, on its thread): the thread's operations may share one connection.

        A store whose operations each take a connection from a pool holds one
        for the whole run instead; the SQLite store has one connection anyway.
        Within, an operation that meets a lost connection is retried until the
        engine's lease is known lost, then raises ``LeaseLost`` (PostgreSQL).
        """

    def close(self) -> None:
        """Release the store; later calls raise ``StorageError``."""
