"""The rows a store passes to the engine and takes from it: frozen attrs records
with no I/O, and their conversions to the public records and to SQL parameters.

The operations that pass them, each with its guarantee, are the store
protocol's (``memable._store.protocol``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any, Literal, TypeVar

import attrs
import cattrs

from .._clock import iso_utc
from .._records import (
    MetadataStatus,
    StatusName,
    StepKind,
    StepRecord,
    StepState,
    WorkflowMetadata,
)


def waited(since: str | None, now: float) -> float | None:
    """Seconds from the stored time ``since`` (ISO text; a queue's oldest runnable
    instance, say) to ``now`` (epoch seconds), never negative; None without one.

    >>> waited("1970-01-01T00:01:00+00:00", 90.0), waited("1970-01-01T00:01:00+00:00", 0.0)
    (30.0, 0.0)
    >>> waited(None, 90.0) is None
    True
    """
    if since is None:
        return None
    return max(0.0, now - datetime.fromisoformat(since).timestamp())


@attrs.frozen(kw_only=True)
class InstanceRow:
    """One row of the ``instances`` table; timestamps are ISO 8601 text. Built by name
    only (35 fields: a position would be a guess), from stored rows by ``instance_row``.
    """

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
    #: The schedule whose tick this instance is ("{schedule}@{tick}").
    schedule: str | None = None
    #: The W3C trace context of the span that last invoked, signalled or resumed it: its
    #: next run's span is a child of it (None: no tracing).
    traceparent: str | None = None
    #: Why the claim that last took it was made, when that says why its next run
    #: begins ("resume", "recovery"): kept for a queue's consumer, which runs it later.
    run_reason: str | None = None
    #: The workflow timeout in seconds (``register``/``invoke(timeout=)``), and when it
    #: passes (epoch seconds from its creation): then the instance is cancelled, "timed
    #: out after" it, unless it ended first (None: no timeout).
    timeout: float | None = None
    timeout_at: float | None = None
    #: The key its queue's ``per_key`` limit counts it under (None: none).
    concurrency_key: str | None = None
    #: The owner the last recovery took it from, by host and pid, and how it was lost:
    #: ``"host:pid died"`` or ``"host:pid stalled past its lease"`` (None: never recovered).
    lost_by: str | None = None


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
    #: Whether the queue is stored as paused (nothing of it starts), and since when.
    paused: bool = False
    paused_at: str | None = None
    #: The queue's instances with its concurrency key that hold a slot (None: no key).
    key_running: int | None = None


@attrs.frozen(kw_only=True)
class StepView:
    """One stored key of an instance as an operator sees it (``Store.inspect``): the
    columns of its ``steps`` row an operator reads, by name."""

    #: Its place among the instance's keys (None: a signal stored before the run reached
    #: its key, listed last).
    seq: int | None
    key: str
    kind: StepKind
    state: StepState
    attempts: int
    started_at: str | None
    completed_at: str | None
    status: str | None
    error: str | None
    #: The stored text of its value (JSON), or of its error's.
    result: str | None
    traceback: str | None


@attrs.frozen
class InstanceView:
    """What ``memable show`` needs of one instance, read by ``Store.inspect``."""

    instance: InstanceRow
    owner: OwnerRow | None  # the row of ``instance.owner``, if it still has one
    #: Its steps in order (a signal the run has not reached yet last).
    steps: list[StepView]
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
    #: When it was stored (epoch seconds, UTC): a completed row's ``completed_at``.
    at: float
    #: When the execution that produced this outcome began (epoch seconds, UTC; None for
    #: signals, waits).
    started: float | None = None
    #: The traceback of a failed execution's error.
    traceback: str | None = None


@attrs.frozen
class RunSnapshot:
    """Everything a run reads before it starts, read in one go."""

    instance: InstanceRow
    steps: dict[str, StoredStep]


#: The seq of a signal stored before its run reached its key: after every step until the
#: run reaches it, which then stores the place it reached it at (``Store.place_signal``),
#: so a fork from a key copies exactly the steps reached before it. PostgreSQL's largest
#: ``integer``.
UNREACHED = 2**31 - 1
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
#: and not run by a live owner), a timer or signal (only a suspended one that is ready:
#: its awaited key ended its wait, or its children all ended; never one still waiting,
#: as on its delayed start), or recovery (only a running one whose owner is dead).
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
class ScheduleRow:
    """One row of ``schedules``: what a schedule was declared as, and how far it fired."""

    name: str
    cron: str
    timezone: str
    workflow: str
    #: The newest tick accounted for (run, skipped or missed), as ``YYYY-MM-DDTHH:MM:SSZ``.
    last_tick: str | None = None
    #: When the schedule (or its cron and zone as they are now) was first declared: no
    #: tick before it is due.
    since: str | None = None
    #: Ticks not run because an earlier tick's instance had not ended (``overlap="skip"``).
    skipped: int = 0
    #: Ticks that fell due while no engine fired them, and that were not run.
    missed: int = 0


@attrs.frozen
class TickFiring:
    """What one firing of a schedule records (``Store.fire_ticks``)."""

    #: The newest tick this firing accounts for: the schedule's new ``last_tick``.
    last_tick: str
    #: The instances of the ticks to run, oldest first.
    rows: list[InstanceRow] = attrs.Factory(list)
    #: Ticks passed over as missed.
    missed: int = 0
    #: Skip a tick while an earlier tick's instance has not ended (``overlap="skip"``).
    skip_overlap: bool = False


@attrs.frozen
class TicksFired:
    """How a firing went."""

    #: False: the stored last tick had moved (another engine fired): nothing written.
    won: bool
    #: The instances created (their ids; an id already there is not created again).
    created: list[str] = attrs.Factory(list)
    #: Ticks skipped because an earlier tick's instance had not ended.
    skipped: int = 0
    #: The stored (cron, zone) of the schedule: another engine's declaration, if it
    #: differs from the firing engine's.
    declared: tuple[str, str] | None = None


@attrs.frozen
class RunEnd:
    """How a run ended, as ``Store.finish`` records it."""

    status: StatusName
    #: When (epoch seconds, UTC): the instance's ``updated_at``, and ``completed_at`` if
    #: terminal.
    at: float
    message: str | None = None
    #: A completed run's output: its stored text and type tag.
    output: tuple[str, str | None] | None = None
    #: The key a run released at a wait waits on.
    waiting_for: str | None = None
    #: The traceback of a failed run's error.
    traceback: str | None = None


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
class TimedOut:
    """An instance its workflow timeout cancelled (``Store.time_out``), and how."""

    workflow: str
    instance_id: str
    #: Its status: "timed out after <duration>".
    message: str
    #: The cancel's outcome: its descendants cancelled with it, a parent to wake.
    ended: Ended


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


#: A record a stored row is built into.
R = TypeVar("R")


def by_name(record: type[R], columns: Iterable[str], values: Iterable[Any]) -> R:
    """The ``record`` of one stored row, built by name, never by position: ``values`` are
    the columns ``columns`` names, in its order (a statement's select list); a name that
    is not one of the record's fields, or a count that differs, raises.

    >>> by_name(StoredStep, ["seq", "key", "kind", "state", "result", "result_type",
    ...                      "status", "attempts"], [3, "pay", "step", "completed", "1",
    ...                                              None, None, 1]).key
    'pay'
    """
    return record(**dict(zip(columns, values, strict=True)))


def instance_row(columns: Iterable[str], values: Iterable[Any]) -> InstanceRow:
    """The ``InstanceRow`` of one stored row of ``columns`` (``sql.instances.INSTANCE_COLUMNS``,
    or a statement's own select list), built by name (``by_name``)."""
    return by_name(InstanceRow, columns, values)


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
        "completed_at": iso_utc(write.at) if write.state == "completed" else None,
        "started_at": None if write.started is None else iso_utc(write.started),
        "traceback": write.traceback,
        "me": owner,
    }
