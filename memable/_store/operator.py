"""What an operator reads of a store and does to it: the operator's half of the store
protocol (``OperatorStore``).

The command line (``memable list``, ``show``, ``resume``, ``purge``, ...), the
dashboard, ``memable._inspect`` and the API's listings read a store through it,
and its actions (``memable._store.admin``) that no run takes write through it.
None of it carries a run on: what a run needs is ``memable._store.protocol.RunStore``,
and ``Store`` is both, which each store implements. The same rules hold as there:
every method is thread-safe, every write atomic; nothing here needs this store's
engine to own anything. Every time passed in is epoch seconds, UTC (a ``float``), as
there; what a read returns is as stored.
"""

from __future__ import annotations

from typing import Protocol

from .._records import StepRecord
from .rows import InstanceRow, InstanceView, OwnerRow, ScheduleRow


class OperatorStore(Protocol):
    """What an operator reads of a store and does to it, and what each operation
    guarantees."""

    # Reads (``memable list``, ``show``, the dashboard, the API's listings): ``sql.reads``.

    def list_instances(self, workflow: str) -> list[InstanceRow]:
        """Every instance of ``workflow``, oldest first."""

    def list_steps(self, workflow: str, instance_id: str) -> list[StepRecord]:
        """The instance's stored keys, in the order first reached."""

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
        """The engines whose lease has not run out at ``now`` (epoch seconds, UTC), with what
        each declares."""

    def queue_stats(self, queue: str, now: float) -> tuple[int, int, str | None]:
        """(runnable instances, instances holding a slot at ``now`` (epoch seconds, UTC), when
        the oldest runnable one became runnable, as stored) of ``queue``: what its gauges
        show."""

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
        since: float | None = None, until: float | None = None, limit: int,
    ) -> list[tuple[str, str, str]]:
        """(workflow, id, when it failed, as stored) of failed instances, oldest failure
        first, optionally of one workflow, by id prefix, failed between ``since`` and
        ``until`` (epoch seconds, UTC); at most ``limit``. A failed child whose failure was
        handled (its parent ended, or raised ``ChildFailed`` for it) is not one of them."""

    def queue_names(self) -> list[str]:
        """The queues the store has instances of."""

    def paused_queues(self) -> dict[str, str | None]:
        """The queues stored as paused, by name, each with when it was paused."""

    # An operator's actions (``memable._store.admin``) that no run takes.

    def mark_resumable(self, workflow: str, instance_id: str, now: float) -> str:
        """Mark a failed, suspended or completed instance ready to run again at ``now`` (epoch
        seconds, UTC), atomically, for an engine's next look (``memable resume``: no engine
        here); return the status it had.

        It is stored suspended and ready (``children_pending`` 0, which every
        poll runs on, as after ``release``) and nobody's; a running or queued
        one is left as it is. Raise InstanceNotFound, or InstanceFinished for a
        Cancelled one (writing nothing).
        """

    def resume_failure(
        self, workflow: str, instance_id: str, failed_at: str, now: float
    ) -> bool:
        """Mark the instance ready to run again as ``mark_resumable`` does (at ``now``),
        atomically, only if it is still the failure a bulk resume counted (failed at
        ``failed_at``, the stored time ``failed_instances`` returned for it) and not
        a child whose failure was handled (its parent ended, or raised ``ChildFailed`` for
        it); whether it did."""

    def set_queue_paused(self, queue: str, paused: bool, at: float) -> bool:
        """Store ``queue`` as paused (since ``at``: epoch seconds, UTC) or not, atomically;
        return whether that changed its stored state (False: it was so already, and nothing
        was written).

        Every claim of the queue (``claim_queued``) reads this state in its own
        transaction, under the lock that keeps the queue's other claimers out, and
        pausing takes that lock too: once a pause returns, no claim of any engine on
        the store starts another of the queue's instances until it is resumed. Runs in
        flight are left alone, and invokes onto the queue are still stored queued. A
        resume tells the queue's consumers at once where the store can (PostgreSQL:
        NOTIFY, as an enqueue does); elsewhere their poll finds it.
        """

    def purge_batch(self, completed_before: float, limit: int, now: float) -> int:
        """Delete at most ``limit`` finished instances completed before ``completed_before``
        (epoch seconds, UTC), with their steps and timers, in one transaction; how many.

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

    def close(self) -> None:
        """Release the store; later calls raise ``StorageError``."""
