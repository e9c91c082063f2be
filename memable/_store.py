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
from typing import Protocol

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


@attrs.frozen
class RunSnapshot:
    """Everything a run reads before it starts, read in one go."""

    instance: InstanceRow
    steps: dict[str, StoredStep]


class Store(Protocol):
    """What the engine needs from a store. Every method is thread-safe."""

    def create_instance(self, row: InstanceRow) -> bool:
        """Insert ``row``; False (and nothing written) if the instance exists."""

    def begin_run(
        self, workflow: str, instance_id: str, *, now: str, only_if_suspended: bool
    ) -> RunSnapshot | None:
        """Claim the instance for a run (only a suspended one if so asked).

        Mark it running and read its input and steps in one transaction;
        None (and nothing written) if it is unknown or not claimable.
        """

    def save_step(self, write: StepWrite) -> None:
        """Store one step outcome; never overwrites a completed step."""

    def await_signal(self, write: StepWrite) -> StoredStep | None:
        """The key's completed row if it was signalled, else mark it waiting; one transaction."""

    def arm_timer(self, write: StepWrite, deadline: float) -> float | None:
        """None if the timer already fired; else arm it (once) and return its deadline."""

    def deliver_signal(self, write: StepWrite) -> None:
        """Store a signal payload as its key's completed value.

        Raise InstanceNotFound, InstanceFinished or SignalRejected (writing
        nothing) when the instance cannot take it.
        """

    def fire_due_timers(self, now: float, at: str) -> list[tuple[str, str, str]]:
        """Claim every timer due at ``now`` and complete its key; return (workflow, id, key)s."""

    def next_deadline(self) -> float | None:
        """The earliest armed timer deadline, or None."""

    def ready_to_resume(self, workflows: list[str]) -> list[tuple[str, str]]:
        """Suspended instances of these workflows whose awaited key has completed."""

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
    ) -> None:
        """Record how a run ended: with the output if completed, the awaited key if suspended."""

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
