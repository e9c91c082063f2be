"""The claims and recovery: how instances come to run here besides a user's call.

``_claiming`` is guarded by the registry's lock (``Registry.lock`` names all it guards)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from .._background.queues import Dispatcher, QueueConsumer
from .._background.timers import BackgroundThread
from .._clock import Skew
from .._errors import NotStarted
from .._log import log, where
from .._observe.base import Telemetry
from .._queues import QueueSpec
from .._store.protocol import Store
from .._store.rows import Claim, Ended, RunEnd, RunSnapshot
from .invocation import Watch
from .registry import Registry
from .runs import Runs
from .workflow import Made


class Claims:
    """Wakes, claims and recovers instances to run here, and keeps the engine's lease.

    >>> from memable._run.children import Children
    >>> from memable._run.options import Options
    >>> from memable._sqlite.store import SQLiteStore
    >>> store = SQLiteStore(None, "full")
    >>> registry = Registry(Options())
    >>> runs = Runs(registry, registry.lock, store, Telemetry(),
    ...             Children({}, store, lambda *args, **kwargs: None, registry.options.clock),
    ...             wake=lambda name, instance_id: None, kick=lambda: None, armed=lambda: None)
    >>> claims = Claims(registry, registry.lock, runs, store, Telemetry())
    >>> claims.fire_due()
    Traceback (most recent call last):
    ...
    memable._errors.NotStarted: the engine is not running (call start() first)
    >>> store.close()
    """

    def __init__(
        self, registry: Registry, lock: threading.Lock, runs: Runs, store: Store,
        telemetry: Telemetry,
    ) -> None:
        self._registry = registry  # the workflows, the phase, the options, the tickers
        self._lock = lock  # the registry's: Registry.lock says what it guards
        self._runs = runs
        self._store = store
        self._telemetry = telemetry
        self.clock = registry.options.clock  # the runner's (see Runner.clock)
        # Under lock: claims and makes under way, instances ours but not yet runs (look_around).
        self._claiming = 0
        # Made by prepare() under lock, at start; fixed after.
        self.consumer: QueueConsumer | None = None  # claims the queues this engine consumes
        self.dispatcher: Dispatcher | None = None  # the queue thread: consumes queues
        self.background: BackgroundThread | None = None  # the timer thread: tick()
        self._next_heartbeat = 0.0  # wall clock; the background thread's alone
        # The wall clock against the store's: start's, then the background thread's alone.
        self._skew = Skew()

    def prepare(self, queues: list[QueueSpec]) -> None:
        """Make the queue consumer (for ``queues``) and the threads; the caller holds the lock."""
        options = self._registry.options
        if queues:
            self.consumer = QueueConsumer(self._store, queues, sorted(self._registry.workflows),
                self.clock, capacity=self._runs.capacity, run=self._run_claimed,
                telemetry=self._telemetry, check_every=options.lease)
            self.dispatcher = Dispatcher(self._claim_queued, options.poll_interval, self.clock)
        # The thread must look often enough to renew the lease in time.
        self.background = BackgroundThread(
            self.tick, min(options.poll_interval, options.lease / 3), self.clock)

    def registered(self, now: float, server: float | None) -> None:
        """The owner row was stored at ``now`` (the store's clock: ``server``): judge the clock."""
        self._judge_clock(now, server)
        self._next_heartbeat = now + self._registry.options.lease / 3

    def armed(self) -> None:
        """A deadline was stored: the timer thread looks at the deadlines again."""
        if self.background is not None:
            self.background.armed()

    def start_made(
        self, make: Callable[[], Iterable[Made]], *, asked: bool = False
    ) -> list[Watch]:
        """Store instances (``make``: one store call, returning those to run here) and start
        their runs: ``asked``, as ``start_run`` does for a user's call (the engine
        accepting); else while started, as ``submit`` (children, ticks). Until they are runs,
        the poll does not take one, owned here and not active, for a run whose end was lost."""
        with self._lock:
            self._claiming += 1
        try:
            watches = []
            for workflow, instance_id, fresh_input, traceparent, reason in make():
                if asked:
                    watches.append(self._runs.start_run(workflow, instance_id, fresh_input,
                                                        traceparent=traceparent))
                    continue
                with self._lock:
                    if self._registry.phase == "started":
                        watches.append(self._runs.submit_locked(
                            workflow, instance_id, fresh_input, "resume", traceparent, reason))
            return watches
        finally:
            with self._lock:
                self._claiming -= 1

    def kick(self) -> None:
        """An instance was queued, or a slot freed: the queue thread looks now."""
        if self.dispatcher is not None:
            self.dispatcher.kick()

    def _claim_queued(self) -> float | None:
        """The queue thread's look; counted as work under way, so wait_all waits for it."""
        assert self.consumer is not None
        with self._lock:
            self._runs.work_began()
            self._claiming += 1
        try:
            return self.consumer.claim()
        finally:
            with self._lock:
                self._claiming -= 1
                self._runs.work_ended()

    def _run_claimed(self, snapshot: RunSnapshot) -> None:
        """Run an instance the queue thread claimed (it is running and ours)."""
        name, instance_id = snapshot.instance.workflow, snapshot.instance.instance_id
        with self._lock:
            if self._registry.phase == "started" and self._runs.get(name, instance_id) is None:
                self._runs.submit_claimed(self._registry.workflows[name], instance_id, snapshot)
                return
        # Stopping: back in the queue, in its place, for the next engine.
        self._store.finish(name, instance_id, RunEnd("queued", self.clock.wall()))

    def wake(self, name: str, instance_id: str, claim: Claim = "wake") -> None:
        """A key it may wait on completed (or its owner died): run it, now or after its run."""
        workflow = self._registry.workflows.get(name)
        with self._lock:
            active = self._runs.get(name, instance_id)
            if active is not None:
                active.rerun = active.rerun or claim == "wake"
            elif workflow is not None and self._registry.phase == "started":
                self._runs.submit_locked(workflow, instance_id, None, claim)
            # Else the next poll of an engine that runs the workflow picks the instance up.

    def ended_by_cancel(self, name: str, instance_id: str, ended: Ended) -> None:
        """A cancel stored (``Store.cancel``, or a workflow timeout): the runs here of the
        instance and its cancelled descendants stop, and a parent it settles goes on."""
        for workflow, cancelled_id in [(name, instance_id), *ended.cancelled]:
            self._runs.cancelled(workflow, cancelled_id)
        if ended.wake is not None:  # a child cancelled: its parent goes on
            self.wake(*ended.wake)

    def changed(self, kind: str, name: str | None, instance_id: str | None) -> None:
        """Another engine changed the store (it said so; see ``Store.listen``): act now."""
        background = self.background
        if kind == "queued":  # queued or freed a slot elsewhere
            self.kick()
        elif name is not None and instance_id is not None and kind in ("signal", "cancel"):
            (self.wake if kind == "signal" else self._runs.cancelled)(name, instance_id)
        elif background is not None:  # a timer armed (look at deadlines again), or anything
            background.armed() if kind == "timer" else background.poll_soon()

    def fire_due(self) -> int:
        """Fire the timers (and schedule ticks) due now, start the runs they make; how many."""
        self._registry.check_fork()
        with self._lock:
            if self._registry.phase != "started":
                raise NotStarted(phase=self._registry.phase)
        fired, _, _ = self._fire_due()
        return fired

    def _fire_due(self) -> tuple[int, float, float | None]:
        """Fire due timers and ticks: (how many, wall time used, seconds to a ticker's look)."""
        with self._lock:
            self._runs.work_began()
        try:
            # Read here, not higher up: see BackgroundThread on freezegun.
            now = self.clock.wall()
            fired = self._store.fire_due_timers(self.clock.wall, self.clock.wall())
            # Each lag by a reading taken after the firing: the store judged each timer
            # due by a reading after ``now`` (a frozen test clock may move in between).
            fired_at = self.clock.wall() if fired else now
            for name, instance_id, key, deadline in fired:
                log.info("timer fired: %s", key, extra=where(name, instance_id, key))
                self._telemetry.timer_fired(fired_at - deadline)
                self.wake(name, instance_id)
            count, until = len(fired), None
            # The clock, not ``now``: ``Store.time_out`` reads it after the instances it judges.
            for out in self._store.time_out(self.clock.wall, self.clock.wall()):
                log.warning("%s", out.message, extra=where(out.workflow, out.instance_id))
                self.ended_by_cancel(out.workflow, out.instance_id, out.ended)
                count += 1
            for ticker in self._registry.tickers:
                made, wait = ticker.look(now)
                count += made
                if wait is not None and (until is None or wait < until):
                    until = wait
            return count, now, until
        finally:
            with self._lock:
                self._runs.work_ended()

    def tick(self, poll: bool) -> float | None:
        """Fire due timers (and ticks), look at the store; return seconds to the next deadline."""
        self._renew()  # first: after an outage, the lease before anything else
        _, now, until = self._fire_due()
        if poll:
            self.look_around(now)
        deadline = self._store.next_deadline()
        waits = [w for w in (until, None if deadline is None else deadline - now) if w is not None]
        return min(waits) if waits else None

    def _heartbeat(self) -> None:
        """Renew the lease and judge the wall clock (read here: see BackgroundThread)."""
        before = self.clock.wall()
        self._judge_clock(before, self._store.heartbeat(before))

    def _judge_clock(self, before: float, server: float | None) -> None:
        """Log a WARNING, once per difference (``_clock.Skew``), when the wall clock read at
        ``before`` and now differs by over a second from the store's ``server`` read between."""
        if server is not None and (said := self._skew.judge(before, server, self.clock.wall())):
            log.warning("%s", said)

    def _renew(self) -> None:
        """Renew the engine's lease when its heartbeat is due, with the steps in flight."""
        # Read here, not higher up: see BackgroundThread on freezegun.
        now = self.clock.wall()
        if now >= self._next_heartbeat:
            self._heartbeat()
            self._next_heartbeat = now + self._registry.options.lease / 3
            steps = [(w, i, k, t) for w, i, k, t in self._runs.in_flight() if k and t is not None]
            self._store.record_in_flight(steps)

    def look_around(self, now: float) -> None:
        """Run what other engines left ready (and, with recover, orphaned), stop what was
        cancelled, and take back instances owned here whose run's end was lost."""
        with self._lock:
            turnover = self._runs.turnover
        look = self._store.look_around(sorted(self._registry.workflows), now)
        for name, instance_id in look.ready:
            self.wake(name, instance_id)
        if self._registry.options.recover:
            for name, instance_id in look.orphaned:
                # Logged by the run that wins the claim: every engine sees it.
                self.wake(name, instance_id, "recover")
        for name, instance_id in look.cancelled:
            self._runs.cancelled(name, instance_id)
        # Instances ours with no run (its end unrecorded): run them again, or, cancelled, let
        # go of them and their slot; only if no run here began or ended during the read and no
        # claim is under way, else "ours, not active" may be a run just ended or not yet begun.
        with self._lock:
            if self._runs.turnover != turnover or self._claiming:
                return
            lost = [key for key in look.mine if self._runs.get(*key) is None]
            dropped = [key for key in look.cancelled if self._runs.get(*key) is None]
        for name, instance_id in lost:
            if name in self._registry.workflows:
                log.warning("running again an instance whose run here did not record its end",
                            extra=where(name, instance_id))
                self.wake(name, instance_id, "recover")
        for name, instance_id in dropped:
            # Its run stopped on the cancel without recording it: the release it would have
            # written (``finish`` of a cancelled instance writes only that) frees the slot.
            log.warning("letting go of a cancelled instance whose run here did not record "
                        "its end", extra=where(name, instance_id))
            self._store.finish(name, instance_id, RunEnd("cancelled", self.clock.wall()))
            self.kick()
