"""The operator's half of the store protocol (``OperatorStore``): what the command line, the
dashboard and the API's listings read of a store, and the actions no run takes (``admin``).

A run needs ``protocol.RunStore``; ``Store`` is both. As there: every method is thread-safe,
every write atomic, every time passed in epoch seconds, UTC; reads return times as stored.
Nothing here needs the store's engine to own anything."""

from __future__ import annotations

from typing import Protocol

from .._records import StepRecord
from .rows import InstanceRow, InstanceView, OwnerRow, ScheduleRow


class OperatorStore(Protocol):
    """What an operator reads of a store and does to it, and what each operation guarantees."""

    # Reads: ``sql.reads``.

    def list_instances(self, workflow: str) -> list[InstanceRow]:
        """Every instance of ``workflow``, oldest first."""

    def list_steps(self, workflow: str, instance_id: str) -> list[StepRecord]:
        """The instance's stored keys, in the order first reached."""

    def list_view(
        self, workflow: str | None, status: str | None, schedule: str | None = None
    ) -> list[tuple[InstanceRow, OwnerRow | None]]:
        """Instances oldest first, optionally filtered, each with its owner's row while it runs."""

    def inspect(self, workflow: str, instance_id: str, now: float) -> InstanceView | None:
        """One instance with its owner, steps, timers and awaited signals (a queued one's
        place judged at ``now``); None if unknown."""

    def workflows(self) -> list[str]:
        """The names of the workflows the store has instances of."""

    def awaited_signals(self, workflow: str, instance_id: str) -> list[str]:
        """The suspend points the instance waits on now (none once it finished)."""

    def schedules(self) -> list[ScheduleRow]:
        """Every schedule the store knows (declared by some engine, ever), by name."""

    def live_owners(self, now: float) -> list[OwnerRow]:
        """The engines whose lease has not run out at ``now``, with what each declares."""

    def queue_stats(self, queue: str, now: float) -> tuple[int, int, str | None]:
        """(runnable, holding a slot at ``now``, when the oldest runnable one became runnable)
        of ``queue``: what its gauges show."""

    def status_counts(self) -> list[tuple[str, str, int]]:
        """(workflow, status, how many instances) of every pair the store holds."""

    def instance_page(
        self, workflow: str | None, status: str | None, id_prefix: str | None,
        offset: int, limit: int,
    ) -> list[InstanceRow]:
        """Instances newest first, filtered: ``limit`` after ``offset``, via an index (no scan)."""

    def failed_instances(
        self, workflow: str | None, *, id_prefix: str | None = None,
        since: float | None = None, until: float | None = None, limit: int,
    ) -> list[tuple[str, str, str]]:
        """(workflow, id, when it failed) of failed instances, oldest failure first, optionally
        filtered, failed between ``since`` and ``until``; at most ``limit``. A failed child
        whose failure was handled (its parent ended, or raised ``ChildFailed``) is left out."""

    def queue_names(self) -> list[str]:
        """The queues the store has instances of."""

    def paused_queues(self) -> dict[str, str | None]:
        """The queues stored as paused, by name, each with when it was paused."""

    # Actions (``admin``).

    def mark_resumable(self, workflow: str, instance_id: str, now: float) -> str:
        """Store a failed, suspended or completed instance suspended, ready (as after
        ``release``) and nobody's at ``now``, for an engine's next look; the status it had. A
        running or queued one is left as it is; InstanceNotFound, or InstanceFinished for a
        Cancelled one, write nothing."""

    def resume_failure(self, workflow: str, instance_id: str, failed_at: str, now: float) -> bool:
        """``mark_resumable``, only if it is still the failure a bulk resume counted (failed at
        ``failed_at``, as ``failed_instances`` returned) and not a handled child's; whether it
        did."""

    def set_queue_paused(self, queue: str, paused: bool, at: float) -> bool:
        """Store ``queue`` as paused (since ``at``) or not; whether its stored state changed.

        A claim reads this state under the queue's claim lock, which pausing takes too: once a
        pause returns, no engine starts another of its instances; runs in flight go on. A
        resume tells the consumers at once on PostgreSQL (NOTIFY); elsewhere their poll does."""

    def purge_batch(self, completed_before: float, limit: int, now: float) -> int:
        """Delete at most ``limit`` instances finished before ``completed_before``, with their
        steps and timers, in one transaction; how many (fewer: no more could be taken now).

        An instance goes only if, in that transaction, it is terminal with no run in flight or
        to come (leases judged at ``now``; PostgreSQL's own clock) and no family a run may use
        (``sql.retention``). Safe from several engines at once. Batches stay small: one is all
        another engine's write ever waits for."""

    def close(self) -> None:
        """Release the store; later calls raise ``StorageError``."""
