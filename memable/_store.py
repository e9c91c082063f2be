"""The storage interface the engine speaks to, and the rows it passes.

SQLite (``_sqlite.SQLiteStore``) is the only implementation so far; each
operation states the guarantee it gives atomically, without relying on
SQLite's database-wide write lock being the only lock, so that a PostgreSQL
store can meet the same contract with row locks. Only a
store speaks SQL. What goes wrong below it reaches the engine as
``StorageError`` (naming workflow, instance and key); the checks a store
makes inside a transaction (a signal to a finished instance, say) raise the
matching ``EngineError``, and the transaction writes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Any, Literal, Protocol

import attrs
import cattrs

from ._records import MetadataStatus, StatusName, StepKind, StepRecord, StepState, WorkflowMetadata


def utcnow() -> datetime:
    """The wall clock as an aware UTC datetime (freezegun moves it in tests)."""
    return datetime.now(timezone.utc)


@attrs.frozen
class InstanceRow:
    """One row of the ``instances`` table; timestamps are ISO 8601 text."""

    workflow: str
    instance_id: str
    status: StatusName
    message: str | None
    input: str
    input_type: str | None
    output: str | None
    output_type: str | None
    created_at: str
    updated_at: str
    completed_at: str | None
    waiting_for: str | None = None
    owner: str | None = None
    status_message: str | None = None
    step_key: str | None = None
    step_started: str | None = None
    traceback: str | None = None
    parent_workflow: str | None = None
    parent_id: str | None = None
    parent_key: str | None = None
    parent_group: str | None = None
    children_pending: int | None = None
    queue: str | None = None
    priority: int | None = None
    queued_at: str | None = None
    recoveries: int | None = None
    lost_owner: str | None = None
    lost_step: str | None = None


@attrs.frozen
class OwnerRow:
    """One row of ``owners``: an engine, where it runs, and its lease."""

    id: str
    host: str
    pid: int
    heartbeat: float  # seconds since the epoch of its last heartbeat
    lease: float
    boot_id: str | None
    pid_ns: str | None
    proc_start: str | None
    #: What it runs, as ``_queues.Declarations`` JSON (None: an engine older than v9).
    declares: str | None = None


@attrs.frozen
class QueueLook:
    """Where a queued instance stands in its queue, read by ``Store.inspect``."""

    position: int  # 1 for the next to start, by priority and then runnable time
    #: The queue's instances that hold a slot, counted by owner.
    running: dict[str, int]
    starts: list[float]  # the claims a rate limit counts (epoch seconds), oldest first
    #: Owners whose lease has not ended, each with what it declares it runs.
    live: list[OwnerRow]
    now: float  # the clock ``live`` was judged by


@attrs.frozen
class InstanceView:
    """What ``memable show`` needs of one instance, read by ``Store.inspect``."""

    instance: InstanceRow
    owner: OwnerRow | None  # the row of ``instance.owner``, if it still has one
    #: Its steps in order, as dicts of the ``steps`` columns an operator sees.
    steps: list[dict[str, Any]]
    timers: list[tuple[str, float]]  # (key, deadline) of each pending timer
    awaiting: list[str]  # the suspend points it waits on now
    #: Its children, oldest first: (workflow, instance_id, status).
    children: list[tuple[str, str, str]] = attrs.Factory(list)
    #: For a queued instance, where it stands in its queue.
    queue: QueueLook | None = None


@attrs.frozen
class StoredStep:
    """What a run needs to know of one stored key."""

    key: str
    seq: int
    kind: StepKind
    state: StepState
    result: str | None
    result_type: str | None
    status: str | None
    attempts: int


@attrs.frozen
class StepWrite:
    """The outcome of one step execution, to be stored in one transaction."""

    workflow: str
    instance_id: str
    key: str
    seq: int
    #: "children": a wait on a group of children (``ctx.children``), which has no row.
    kind: StepKind | Literal["children"]
    state: StepState
    result: str | None
    result_type: str | None
    status: str | None
    error: str | None
    at: str
    #: When the execution that produced this outcome began (None for signals, waits).
    started: str | None = None
    #: The traceback of a failed execution's error.
    traceback: str | None = None


@attrs.frozen
class RunSnapshot:
    """Everything a run reads before it starts, read in one go."""

    instance: InstanceRow
    steps: dict[str, StoredStep]


#: The statuses an instance ends in (a store stamps ``completed_at`` on reaching one).
TERMINAL: tuple[StatusName, ...] = ("completed", "failed", "cancelled")
#: The states of a key a wait has its outcome in: a value, or a deadline passed.
SETTLED: tuple[StepState, ...] = ("completed", "timed_out")


def settled(kind: str, state: str) -> bool:
    """Whether a wait on a key of ``kind`` in ``state`` is over (a child's failure ends it).

    >>> settled("signal", "timed_out"), settled("child", "failed"), settled("step", "failed")
    (True, True, False)
    """
    return state in SETTLED or (kind == "child" and state == "failed")

#: How a run may claim an instance: the user's resume (anything not cancelled
#: and not run by a live owner), a timer or signal (only a suspended one), or
#: recovery (only a running one whose owner is dead).
Claim = Literal["resume", "wake", "recover"]


@attrs.frozen
class Suspend:
    """How recording a suspension went."""

    #: "waiting", "ready" (the key completed: run again with ``snapshot``),
    #: or "stopped" (the instance is no longer running under this engine).
    outcome: Literal["waiting", "ready", "stopped"]
    deadline: float | None = None  # the timer's armed deadline, when waiting on one
    snapshot: RunSnapshot | None = None


@attrs.frozen
class Ended:
    """How recording the end of a run (``Store.finish``) or a cancel went."""

    #: Whether the end was recorded (False: the instance was no longer this run's).
    recorded: bool = True
    #: The parent this end made ready to go on (it waited for this child): wake it.
    wake: tuple[str, str] | None = None
    #: Descendants a cancel cancelled with the instance (their runs stop too).
    cancelled: list[tuple[str, str]] = attrs.Factory(list)


@attrs.frozen
class Claimed:
    """What one claim on a queue took, and when its rate limit lets more start."""

    snapshots: list[RunSnapshot] = attrs.Factory(list)
    #: Seconds until the rate window has room again (None: the rate does not hold it back).
    retry_in: float | None = None


@attrs.frozen
class Look:
    """What a poll of the store found (see ``Store.look_around``)."""

    #: Suspended instances whose awaited key completed (or whose retry backoff ended).
    ready: list[tuple[str, str]] = attrs.Factory(list)
    #: Running instances whose owner is dead.
    orphaned: list[tuple[str, str]] = attrs.Factory(list)
    #: Instances this engine owns that were cancelled.
    cancelled: list[tuple[str, str]] = attrs.Factory(list)
    #: Running instances this engine owns (the runner recovers those it no longer runs).
    mine: list[tuple[str, str]] = attrs.Factory(list)


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

    def create_instance(self, row: InstanceRow) -> bool:
        """Insert ``row``, owned by this store's engine; False (nothing written) if it exists."""

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

    def deliver_signal(self, write: StepWrite) -> None:
        """Store a signal payload as its key's completed value, atomically.

        Raise InstanceNotFound, InstanceFinished (a terminal instance) or
        SignalRejected (the key holds a value, timed out, or was reached as a
        step or a timer), writing nothing, when the instance cannot take it.
        The key's deadline, if armed, is dropped in the same transaction: of
        a signal and a deadline firing at once, exactly one takes the key.
        """

    def mark_resumable(self, workflow: str, instance_id: str, now: str) -> str:
        """Mark a failed, suspended or completed instance ready to run again, atomically, for
        an engine's next look (``memable resume``: no engine here); return the status it had.

        It is stored suspended and ready (``children_pending`` 0, which every
        poll runs on, as after ``release``) and nobody's; a running or queued
        one is left as it is. Raise InstanceNotFound, or InstanceFinished for a
        Cancelled one (writing nothing).
        """

    def fire_due_timers(self, now: float, at: str) -> list[tuple[str, str, str]]:
        """Claim every timer due at ``now`` and complete its key; return (workflow, id, key)s.

        Atomically per call: a timer is fired (its row deleted, a timer key
        completed, a suspend point that holds no signal yet timed out) by
        exactly one caller across every engine on the store. A due retry
        backoff is deleted and returned; its step stays as it is.
        """

    def next_deadline(self) -> float | None:
        """The earliest armed timer deadline, or None."""

    def finish(
        self,
        workflow: str,
        instance_id: str,
        *,
        status: StatusName,
        message: str | None,
        output: tuple[str, str | None] | None = None,
        waiting_for: str | None = None,
        traceback: str | None = None,
        now: str,
    ) -> Ended:
        """Record how this engine's run ended, and release the instance, atomically.

        Only while owned and running; not recorded (only the release written)
        if the instance is no longer running under this engine: cancelled
        meanwhile, or taken over. The end of a child (a terminal ``status``)
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
        """

    def queued(self, queue: str, workflows: list[str]) -> int:
        """How many instances of ``workflows`` wait in ``queue``."""

    def start_children(self, waits: list[StepWrite], rows: list[InstanceRow]) -> list[str]:
        """Record a parent's child steps as waiting and create the children, atomically.

        ``waits`` are the parent's rows (kind ``"child"``), ``rows`` the
        children, owned by this engine. Only if the parent is owned (else
        ``LostInstance``) and running (cancelled: ``RunCancelled``, nothing
        written). A child id that exists is left as it was, so a parent that
        crashed after starting a child never makes a second. Return the ids
        of the children created.
        """

    def purge(self, completed_before: str) -> int:
        """Delete terminal, unowned instances completed before then, with steps and timers."""

    def register_owner(self, lease: float, now: float, declares: str | None = None) -> None:
        """Record this engine as an owner on the store, alive for ``lease`` seconds, with what
        it ``declares`` it runs (``_queues.Declarations`` JSON)."""

    def heartbeat(self, now: float) -> None:
        """Renew this engine's lease (and its owner row, if someone reaped it)."""

    def drop_owner(self) -> None:
        """Remove this engine's owner row (at stop; it runs nothing any more)."""

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

    # Reads an operator makes (``memable list``, ``show``, ``signal``); see ``_store_reads``.

    def list_view(
        self, workflow: str | None, status: str | None
    ) -> list[tuple[InstanceRow, OwnerRow | None]]:
        """Instances oldest first, optionally of one workflow and in one status, each with
        its owner's row while it runs."""

    def inspect(self, workflow: str, instance_id: str) -> InstanceView | None:
        """One instance with its owner, steps, timers and awaited signals; None if unknown."""

    def workflows(self) -> list[str]:
        """The names of the workflows the store has instances of."""

    def awaited_signals(self, workflow: str, instance_id: str) -> list[str]:
        """The suspend points the instance waits on now (none once it finished)."""

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
        """

    def close(self) -> None:
        """Release the store; later calls raise ``StorageError``."""


def metadata_of(row: InstanceRow) -> WorkflowMetadata:
    """Build the public ``WorkflowMetadata`` of an instance row."""
    return WorkflowMetadata(
        status=MetadataStatus.from_row(row.status, row.message),
        created_at=datetime.fromisoformat(row.created_at),
        updated_at=datetime.fromisoformat(row.updated_at),
        completed_at=datetime.fromisoformat(row.completed_at) if row.completed_at else None,
        parent=(
            None if row.parent_workflow is None or row.parent_id is None
            else (row.parent_workflow, row.parent_id)
        ),
        status_message=row.status_message,
    )


#: Structures stored rows (dicts of column values) into records.
ROWS = cattrs.Converter()
ROWS.register_structure_hook(datetime, lambda value, _: datetime.fromisoformat(value))


def step_record(row: dict[str, Any]) -> StepRecord:
    """The public ``StepRecord`` of one stored ``steps`` row (a dict of its columns)."""
    row = dict(row)
    row["result"] = json.loads(row["result"]) if row["state"] == "completed" else None
    return ROWS.structure(row, StepRecord)


def fired_now(waiting: StepWrite) -> StepWrite:
    """A timer's or deadline's waiting row as it is once due: completed, or timed out."""
    if waiting.kind == "signal":
        return attrs.evolve(waiting, state="timed_out", result=None)
    return attrs.evolve(waiting, state="completed", result="null")


def step_params(write: StepWrite, owner: str) -> dict[str, Any]:
    """The named parameters of UPSERT_STEP and INSERT_WAITING for ``write`` by ``owner``."""
    return {
        "workflow": write.workflow, "instance_id": write.instance_id, "key": write.key,
        "seq": write.seq, "kind": write.kind, "state": write.state,
        "result": write.result, "result_type": write.result_type,
        "status": write.status, "error": write.error,
        "completed_at": write.at if write.state == "completed" else None,
        "started_at": write.started,
        "traceback": write.traceback,
        "me": owner,
    }
