"""Consuming queues: the queue thread (``Dispatcher``) and what each look claims.

A look also warns, once per queue, of its workflows' runnable instances in a queue no engine
consumes: a typo between invoker and worker would leave them waiting for ever, silently.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from datetime import datetime

from .._clock import Clock
from .._log import log
from .._observe.base import Telemetry
from .._queues import Declarations, QueueSpec
from .._store.protocol import Store
from .._store.rows import RunSnapshot
from .loop import LoopThread

#: Claim what may start now; seconds until a rate window has room again, or None.
Claim = Callable[[], "float | None"]


class Dispatcher(LoopThread):
    """One named daemon thread per engine that consumes queues: it claims when kicked, when a
    rate limit's window has room again, and every ``poll_interval`` seconds.

    >>> from memable._clock import SYSTEM_CLOCK
    >>> looks = []
    >>> thread = Dispatcher(lambda: looks.append(1), 60.0, SYSTEM_CLOCK)
    >>> thread.start(); thread.stop()
    >>> looks
    [1]
    """

    def __init__(self, claim: Claim, poll_interval: float, clock: Clock) -> None:
        super().__init__("memable-queues", "queue thread: claiming", clock)
        self._claim = claim
        self._poll_interval = poll_interval

    def _look(self) -> float:
        retry_in = self._claim()
        return self._poll_interval if retry_in is None else min(retry_in, self._poll_interval)

    def _after_failure(self) -> float:
        return self._poll_interval


#: Most instances one claim takes.
BATCH = 64


class QueueConsumer:
    """Claims for one engine's consumed queues; used by its queue thread alone.

    >>> from memable._sqlite.store import SQLiteStore
    >>> from memable._clock import SYSTEM_CLOCK
    >>> store = SQLiteStore(None, "full")
    >>> consumer = QueueConsumer(store, [QueueSpec("q")], ["wf"], SYSTEM_CLOCK,
    ...                          capacity=lambda: 8, run=print)
    >>> consumer.claim() is None  # nothing queued
    True
    >>> store.close()
    """

    def __init__(self, store: Store, queues: list[QueueSpec], workflows: list[str],
                 clock: Clock, *, capacity: Callable[[], int],
                 run: Callable[[RunSnapshot], None],
                 telemetry: Telemetry | None = None, check_every: float = 15.0) -> None:
        self._telemetry = telemetry or Telemetry()  # how long each waited on its queue
        self._store = store
        self._queues = queues
        self._workflows = workflows
        self._clock = clock
        self._capacity = capacity  # worker threads free now
        self._run = run  # runs a claimed instance here
        self._check_every = check_every  # seconds between looks for unconsumed queues
        self._next_check: float | None = None  # monotonic; None: at the first claim
        self._named: set[str] = set()  # the unconsumed queues already named (once each)

    def claim(self) -> float | None:
        """Claim what may start now; seconds until a rate limit has room again, or None."""
        self._name_unconsumed()
        retry_in: float | None = None
        for queue in self._queues:
            free = self._capacity()
            if free <= 0:  # the end of a run here looks again
                break
            claimed = self._store.claim_queued(
                queue.name, self._workflows, concurrency=queue.concurrency,
                per_process=queue.per_process, rate=queue.rate, clock=self._clock.wall,
                at=self._clock.wall(), batch=min(free, BATCH), per_key=queue.per_key,
            )
            now = self._clock.wall()
            for snapshot in claimed.snapshots:
                queued_at = snapshot.instance.queued_at
                if queued_at is not None:
                    waited = now - datetime.fromisoformat(queued_at).timestamp()
                    self._telemetry.queue_waited(queue.name, waited)
                self._run(snapshot)
            later = claimed.retry_in
            if later is not None:
                retry_in = later if retry_in is None else min(retry_in, later)
        return retry_in

    def _name_unconsumed(self) -> None:
        """At the first claim and every ``check_every`` seconds: warn of the unconsumed
        queues (by what live owners declare), each once."""
        started = self._clock.monotonic()
        if self._next_check is not None and started < self._next_check:
            return
        self._next_check = started + self._check_every
        consumed = {queue.name for queue in self._queues}  # ours, stored at start too
        owners = self._store.live_owners(self._clock.wall())
        for declared in Declarations.all_of(owner.declares for owner in owners):
            consumed.update(spec.name for spec in declared.queues)
        for name in self._store.queue_names():
            if name in consumed or name in self._named:
                continue
            waiting = self._store.queued(name, self._workflows)
            if not waiting:
                continue
            self._named.add(name)
            log.warning("%s", unconsumed_message(name, waiting, sorted(consumed)))

    def waiting(self) -> bool:
        """Whether an instance this engine can run waits in one of its queues."""
        return any(self._store.queued(q.name, self._workflows) for q in self._queues)


def unconsumed_message(queue: str, waiting: int, consumed: list[str]) -> str:
    """What the WARNING about a queue nobody consumes says, with the closest consumed name.

    >>> text = unconsumed_message("ordres", 1, ["emails", "orders"])
    >>> print(text.split(", and ")[0])
    queue 'ordres' holds 1 runnable instance of a workflow this engine registers
    >>> "The closest queue consumed is 'orders'" in text
    True
    """
    closest = difflib.get_close_matches(queue, consumed, n=1)
    said = (f"queue {queue!r} holds {waiting} runnable instance{'' if waiting == 1 else 's'} "
            "of a workflow this engine registers, and no running engine consumes it: "
            f"{'it waits' if waiting == 1 else 'they wait'} until one does. ")
    if closest:
        return said + (f"The closest queue consumed is {closest[0]!r}: if that is a typo, use one "
                       "name where the instance is invoked and in the worker (engine.queue, "
                       "register(..., queue=), invoke(..., queue=))")
    return said + ("No queue consumed has a similar name: start an engine that consumes it "
                   f"(queues=[{queue!r}], or `memable worker --queues {queue}`)")
