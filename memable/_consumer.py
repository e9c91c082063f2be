"""An engine consuming its queues: what the queue thread does each time it looks.

``QueueConsumer.claim`` asks the store for the queued instances each consumed
queue lets start now (of the workflows this engine registered, no more than
it has free worker threads for) and hands each claimed snapshot to the
runner, which runs it like any other run of the instance.
"""

from __future__ import annotations

from collections.abc import Callable

from ._clock import Clock
from ._queues import QueueSpec
from ._store import RunSnapshot, Store, utcnow

#: Most instances one claim takes.
BATCH = 64


class QueueConsumer:
    """Claims for one engine's consumed queues; used by its queue thread alone.

    >>> from memable._sqlite import SQLiteStore
    >>> from memable._clock import SYSTEM_CLOCK
    >>> store = SQLiteStore(None, "full")
    >>> consumer = QueueConsumer(store, [QueueSpec("q")], ["wf"], SYSTEM_CLOCK,
    ...                          capacity=lambda: 8, run=print)
    >>> consumer.claim() is None  # nothing queued
    True
    >>> store.close()
    """

    def __init__(
        self,
        store: Store,
        queues: list[QueueSpec],
        workflows: list[str],
        clock: Clock,
        *,
        capacity: Callable[[], int],
        run: Callable[[RunSnapshot], None],
    ) -> None:
        self._store = store
        self._queues = queues
        self._workflows = workflows
        self._clock = clock
        self._capacity = capacity  # worker threads free now
        self._run = run  # runs a claimed instance here

    def claim(self) -> float | None:
        """Claim what may start now; seconds until a rate limit has room again, or None."""
        retry_in: float | None = None
        for queue in self._queues:
            free = self._capacity()
            if free <= 0:  # the end of a run here looks again
                break
            claimed = self._store.claim_queued(
                queue.name, self._workflows, concurrency=queue.concurrency,
                per_process=queue.per_process, rate=queue.rate, clock=self._clock.wall,
                at=utcnow().isoformat(), batch=min(free, BATCH),
            )
            for snapshot in claimed.snapshots:
                self._run(snapshot)
            later = claimed.retry_in
            if later is not None:
                retry_in = later if retry_in is None else min(retry_in, later)
        return retry_in

    def waiting(self) -> bool:
        """Whether an instance this engine can run waits in one of its queues."""
        return any(self._store.queued(q.name, self._workflows) for q in self._queues)
