"""The rows a store and the engine pass (frozen records, no I/O; the operations are
``protocol``'s), and their conversions to the public records and to SQL parameters."""

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
    """Seconds from the stored ISO time ``since`` to ``now`` (epoch), at least 0; None if none.

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
    """One row of ``instances`` (times ISO 8601 text), built by name only (``instance_row``)."""

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
    schedule: str | None = None  # the schedule whose tick it is
    traceparent: str | None = None  # the W3C trace context its next run's span continues
    run_reason: str | None = None  # why the last claim took it, kept for a queue's consumer
    #: The workflow timeout in seconds, and when it passes (epoch seconds from creation).
    timeout: float | None = None
    timeout_at: float | None = None
    concurrency_key: str | None = None
    #: Whom the last recovery took it from (``"host:pid died"``, ``"... stalled past its lease"``).
    lost_by: str | None = None


@attrs.frozen
class OwnerRow:
    """One row of ``owners``: an engine, where it runs, and its lease."""

    id: str
    host: str
    pid: int
    heartbeat: float  # epoch seconds
    lease: float
    boot_id: str | None
    pid_ns: str | None
    proc_start: str | None
    declares: str | None = None  # what it runs, as ``_queues.Declarations`` JSON


@attrs.frozen
class QueueLook:
    """Where a queued instance stands in its queue, read by ``Store.inspect``."""

    position: int  # 1 for the next to start, by priority and then runnable time
    running: dict[str, int]  # instances holding a slot, by owner
    starts: list[float]  # the claims a rate limit counts (epoch seconds), oldest first
    live: list[OwnerRow]  # owners whose lease has not ended
    now: float  # the clock ``live`` was judged by
    paused: bool = False
    paused_at: str | None = None
    key_running: int | None = None  # of its concurrency key, holding a slot (None: no key)


@attrs.frozen(kw_only=True)
class StepView:
    """One stored key of an instance as an operator sees it (``Store.inspect``)."""

    seq: int | None  # None: a signal stored before the run reached its key
    key: str
    kind: StepKind
    state: StepState
    attempts: int
    started_at: str | None
    completed_at: str | None
    status: str | None
    error: str | None
    result: str | None  # JSON text
    traceback: str | None


@attrs.frozen
class InstanceView:
    """What ``memable show`` needs of one instance, read by ``Store.inspect``."""

    instance: InstanceRow
    owner: OwnerRow | None  # the row of ``instance.owner``, if it still has one
    steps: list[StepView]  # in order; a signal the run has not reached yet last
    timers: list[tuple[str, float]]  # (key, deadline) of each pending timer
    awaiting: list[str]  # the suspend points it waits on now
    children: list[tuple[str, str, str]] = attrs.Factory(list)  # (workflow, id, status)
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
    kind: StepKind | Literal["children"]  # "children": a group's wait, which has no row
    state: StepState
    result: str | None
    result_type: str | None
    status: str | None
    error: str | None
    at: float  # when it was stored (epoch seconds, UTC): a completed row's ``completed_at``
    started: float | None = None  # when its execution began (None: signals, waits)
    traceback: str | None = None


@attrs.frozen
class RunSnapshot:
    """Everything a run reads before it starts, read in one go."""

    instance: InstanceRow
    steps: dict[str, StoredStep]


#: The seq of a signal stored before its run reached its key, until the run places it
#: (``Store.place_signal``), so a fork copies exactly the steps reached before its key.
UNREACHED = 2**31 - 1
#: The statuses an instance ends in (stamped ``completed_at``).
TERMINAL: tuple[StatusName, ...] = ("completed", "failed", "cancelled")
#: The states of a key a wait has its outcome in: a value, or a deadline passed.
SETTLED: tuple[StepState, ...] = ("completed", "timed_out")


def settled(kind: str, state: str) -> bool:
    """Whether a wait on a key of ``kind`` in ``state`` is over (a child's failure ends it).

    >>> settled("signal", "timed_out"), settled("child", "failed"), settled("step", "failed")
    (True, True, False)
    """
    return state in SETTLED or (kind == "child" and state == "failed")

#: How a run may claim an instance: resume (not cancelled nor live-owned), wake (a ready
#: suspended one, never one still waiting), recover (a running one whose owner is dead).
Claim = Literal["resume", "wake", "recover"]


@attrs.frozen
class Suspend:
    """How recording a suspension went."""

    #: "ready": run again with ``snapshot``; "stopped": no longer this engine's.
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
    #: When its cron and zone as they are now were first declared: no tick before is due.
    since: str | None = None
    skipped: int = 0  # not run: an earlier tick's instance had not ended
    missed: int = 0  # fell due while no engine fired them, and not run


@attrs.frozen
class TickFiring:
    """What one firing of a schedule records (``Store.fire_ticks``)."""

    last_tick: str  # the schedule's new ``last_tick``
    rows: list[InstanceRow] = attrs.Factory(list)  # the ticks to run, oldest first
    missed: int = 0
    skip_overlap: bool = False


@attrs.frozen
class TicksFired:
    """How a firing went."""

    won: bool  # False: another engine moved the last tick first; nothing written
    created: list[str] = attrs.Factory(list)  # ids created (not those already there)
    skipped: int = 0
    declared: tuple[str, str] | None = None  # the stored (cron, zone), if it differs


@attrs.frozen
class RunEnd:
    """How a run ended, as ``Store.finish`` records it."""

    status: StatusName
    at: float  # epoch seconds: ``updated_at``, and ``completed_at`` if terminal
    message: str | None = None
    output: tuple[str, str | None] | None = None  # stored text and type tag
    waiting_for: str | None = None
    traceback: str | None = None
    #: The instance's row as the run read it (None: it read none, as a run of an instance made
    #: here). Its parent and queue never change: read without a parent, the end has none to
    #: settle, and commits in the round trip that records it.
    read: InstanceRow | None = None


@attrs.frozen
class Ended:
    """How recording the end of a run (``Store.finish``) or a cancel went."""

    recorded: bool = True  # False: the instance was no longer this run's
    wake: tuple[str, str] | None = None  # a parent this child's end made ready
    cancelled: list[tuple[str, str]] = attrs.Factory(list)  # descendants a cancel took along


@attrs.frozen
class TimedOut:
    """An instance its workflow timeout cancelled (``Store.time_out``), and how."""

    workflow: str
    instance_id: str
    message: str  # "timed out after <duration>"
    ended: Ended


@attrs.frozen
class Claimed:
    """What one claim on a queue took, and in how many seconds its rate lets more start."""

    snapshots: list[RunSnapshot] = attrs.Factory(list)
    retry_in: float | None = None


@attrs.frozen
class Look:
    """What a poll of the store found (see ``Store.look_around``)."""

    ready: list[tuple[str, str]] = attrs.Factory(list)  # suspended, their wait over
    orphaned: list[tuple[str, str]] = attrs.Factory(list)  # running, their owner dead
    cancelled: list[tuple[str, str]] = attrs.Factory(list)  # this engine's, cancelled
    #: Running instances this engine owns: the runner recovers those it no longer runs.
    mine: list[tuple[str, str]] = attrs.Factory(list)


R = TypeVar("R")


def by_name(record: type[R], columns: Iterable[str], values: Iterable[Any]) -> R:
    """The ``record`` of one stored row, built by name (``columns``, a select list), never by
    position; an unknown name or a count that differs raises.

    >>> by_name(StoredStep, ["seq", "key", "kind", "state", "result", "result_type",
    ...                      "status", "attempts"], [3, "pay", "step", "completed", "1",
    ...                                              None, None, 1]).key
    'pay'
    """
    return record(**dict(zip(columns, values, strict=True)))


def instance_row(columns: Iterable[str], values: Iterable[Any]) -> InstanceRow:
    """The ``InstanceRow`` of one stored row of ``columns`` (``by_name``)."""
    return by_name(InstanceRow, columns, values)


def metadata_of(row: InstanceRow) -> WorkflowMetadata:
    """Build the public ``WorkflowMetadata`` of an instance row."""
    return WorkflowMetadata(
        status=MetadataStatus.from_row(row.status, row.message),
        created_at=datetime.fromisoformat(row.created_at),
        updated_at=datetime.fromisoformat(row.updated_at),
        completed_at=datetime.fromisoformat(row.completed_at) if row.completed_at else None,
        parent=(None if row.parent_workflow is None or row.parent_id is None
                else (row.parent_workflow, row.parent_id)), status_message=row.status_message)


ROWS = cattrs.Converter()
ROWS.register_structure_hook(datetime, lambda value, _: datetime.fromisoformat(value))


def step_record(row: dict[str, Any]) -> StepRecord:
    """The public ``StepRecord`` of one stored ``steps`` row (a dict)."""
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
    return {"workflow": write.workflow, "instance_id": write.instance_id, "key": write.key,
        "seq": write.seq, "kind": write.kind, "state": write.state, "result": write.result,
        "result_type": write.result_type, "status": write.status, "error": write.error,
        "completed_at": iso_utc(write.at) if write.state == "completed" else None,
        "started_at": None if write.started is None else iso_utc(write.started),
        "traceback": write.traceback, "me": owner}
