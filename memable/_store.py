"""The storage interface the engine speaks to, and the rows it passes.

SQLite (``_sqlite.SQLiteStore``) is the only implementation; the interface is
kept this small so that a PostgreSQL store can stand beside it later. Only a
store speaks SQL. What goes wrong below it reaches the engine as
``StorageError`` (naming workflow, instance and key); the checks a store
makes inside a transaction (a signal to a finished instance, say) raise the
matching ``EngineError``, and the transaction writes nothing.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Literal, Protocol

import attrs

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
    kind: StepKind
    state: StepState
    result: str | None
    result_type: str | None
    status: str | None
    error: str | None
    at: str
    #: When the execution that produced this outcome began (None for signals, waits).
    started: str | None = None


@attrs.frozen
class RunSnapshot:
    """Everything a run reads before it starts, read in one go."""

    instance: InstanceRow
    steps: dict[str, StoredStep]


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


class LostInstance(BaseException):
    """The run's engine no longer owns its instance: stop without writing.

    Raised by a store write that finds another owner (the lease expired and
    another engine took the instance over). A BaseException, like a
    suspension, so user code cannot catch it and go on writing.
    """


class Store(Protocol):
    """What the engine needs from a store. Every method is thread-safe."""

    def create_instance(self, row: InstanceRow) -> bool:
        """Insert ``row``, owned by this store's engine; False (nothing written) if it exists."""

    def begin_run(
        self, workflow: str, instance_id: str, *, now: str, claim: Claim
    ) -> RunSnapshot | None:
        """Claim the instance for a run of this engine, as ``claim`` allows.

        Mark it running and owned, and read its input and steps, in one
        transaction; None (and nothing written) if unknown or not claimable.
        """

    def save_step(self, write: StepWrite) -> None:
        """Store one step outcome; never overwrites a completed step. LostInstance if not owned."""

    def read_step(self, workflow: str, instance_id: str, key: str) -> StoredStep | None:
        """The stored row of one key, or None."""

    def suspend(
        self, waiting: StepWrite, message: str, deadline: float | None, now: float
    ) -> Suspend:
        """End this engine's run at a suspend point or timer, in one transaction.

        Mark the key waiting (arming the timer, once, with ``deadline``) and
        the instance suspended. If the key has completed meanwhile (a signal
        arrived, or the timer is due at ``now``, which fires it here), the
        instance stays running and owned instead, and the steps to go on
        with are returned.
        """

    def deliver_signal(self, write: StepWrite) -> None:
        """Store a signal payload as its key's completed value.

        Raise InstanceNotFound, InstanceFinished or SignalRejected (writing
        nothing) when the instance cannot take it.
        """

    def fire_due_timers(self, now: float, at: str) -> list[tuple[str, str, str]]:
        """Claim every timer due at ``now`` and complete its key; return (workflow, id, key)s."""

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
        now: str,
    ) -> bool:
        """Record how this engine's run ended, and release the instance.

        False (only the release written) if the instance is no longer
        running under this engine: cancelled meanwhile, or taken over.
        """

    def cancel(self, workflow: str, instance_id: str, *, now: str) -> None:
        """Mark the instance Cancelled and drop its timers.

        Raise InstanceNotFound, or InstanceFinished for a Completed or
        Cancelled one (writing nothing).
        """

    def purge(self, completed_before: str) -> int:
        """Delete terminal instances completed before then, with their steps and timers."""

    def register_owner(self, lease: float, now: float) -> None:
        """Record this engine as an owner on the store, alive for ``lease`` seconds."""

    def heartbeat(self, now: float) -> None:
        """Renew this engine's lease (and its owner row, if someone reaped it)."""

    def drop_owner(self) -> None:
        """Remove this engine's owner row (at stop; it runs nothing any more)."""

    def look_around(
        self, workflows: list[str], now: float, host: str
    ) -> tuple[list[tuple[str, str]], list[tuple[str, str]], list[tuple[str, str]]]:
        """What other processes changed, for these workflows.

        Return (suspended instances whose awaited key completed, running
        instances whose owner is dead, instances of this engine that were
        cancelled). Owners on ``host`` whose process is gone are reaped first.
        """

    def get_instance(self, workflow: str, instance_id: str) -> InstanceRow | None:
        """The instance's row, or None."""

    def list_instances(self, workflow: str) -> list[InstanceRow]:
        """Every instance of ``workflow``, oldest first."""

    def list_steps(self, workflow: str, instance_id: str) -> list[StepRecord]:
        """The instance's stored keys, in the order first reached."""

    def close(self) -> None:
        """Release the store; later calls raise ``StorageError``."""


def metadata_of(row: InstanceRow) -> WorkflowMetadata:
    """Build the public ``WorkflowMetadata`` of an instance row."""
    return WorkflowMetadata(
        status=MetadataStatus.from_row(row.status, row.message),
        created_at=datetime.fromisoformat(row.created_at),
        updated_at=datetime.fromisoformat(row.updated_at),
        completed_at=datetime.fromisoformat(row.completed_at) if row.completed_at else None,
    )
