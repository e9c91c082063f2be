"""The runner: the lifecycle of an engine's runs, from start to stop, over the registry (the
one lock), the runs in flight (``runs.Runs``) and the claims (``claims.Claims``)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from typing import Any

from .._background.retention import Purger
from .._clock import Clock
from .._errors import AlreadyStarted, StorageError
from .._log import log
from .._observe.base import QueueStats, RunReason, Telemetry
from .._queues import Declarations, QueueSpec, consumed
from .._store.protocol import Store
from .._store.rows import Claim, Ended, waited
from .children import Children
from .claims import Claims
from .invocation import Watch
from .options import Options
from .registry import Phase, Registry, Ticker
from .runs import Runs
from .workflow import Made, Workflow


class Runner:
    """Starts, drains and stops an engine's runs; the engine's one way in to its parts.

    The run path needs only a ``RunStore``; the runner and ``Claims`` hold a whole ``Store``
    for what their services read as an operator does (queue gauges, schedules, retention).

    >>> from memable._run.options import Options
    >>> from memable._sqlite.store import SQLiteStore
    >>> runner = Runner(SQLiteStore(None, "full"), Options())
    >>> runner.phase, runner.close(), runner.phase
    ('new', True, 'closed')
    >>> runner.store.close()
    """

    def __init__(self, store: Store, options: Options, telemetry: Telemetry | None = None) -> None:
        self.store = store
        #: Where runs and steps report spans and metrics (does nothing unless told).
        self.telemetry = telemetry or Telemetry()
        self._clock = options.clock
        self.poll_interval = options.poll_interval
        #: The workflows, queues, tickers, options and phase; owns the one lock.
        self.registry = Registry(options)
        self._lock = self.registry.lock  # shared by the parts; Registry.lock says what it guards
        self.children = Children(self.registry.workflows, store, self.submit, self._clock,
                                 self.registry.queues, self.kick, self.telemetry, self.start_made)
        self.runs = Runs(self.registry, self._lock, store, self.telemetry, self.children,
                         wake=self.wake, kick=self.kick, armed=self.armed)
        #: Wake-ups, queue claims, the poll's look and recovery, the lease.
        self.claims = Claims(self.registry, self._lock, self.runs, store, self.telemetry)
        self._purger: Purger | None = None  # purges past retention; started by start()
        # Stops the queue gauges reading this engine's queues (set by start).
        self._unobserve: Callable[[], None] = lambda: None

    @property
    def clock(self) -> Clock:
        """The runner's clock (the options'); set before start (a test's), runs and claims
        read it too, but not the runs' contexts nor the children (the options' clock)."""
        return self._clock

    @clock.setter
    def clock(self, clock: Clock) -> None:
        self._clock = self.runs.clock = self.claims.clock = clock

    @property
    def phase(self) -> Phase:
        return self.registry.phase

    @property
    def options(self) -> Options:
        return self.registry.options

    @property
    def workflows(self) -> dict[str, Workflow]:
        return self.registry.workflows

    @property
    def queues(self) -> dict[str, QueueSpec]:
        """Declared queues, by name (fixed once started)."""
        return self.registry.queues

    @property
    def accepting(self) -> bool:
        """Whether new runs are taken (started, and not draining or stopping)."""
        with self._lock:
            return self.registry.accepting

    def check_fork(self) -> None:
        """Raise EngineError in a child forked after this engine was made."""
        self.registry.check_fork()

    def require_accepting(self, name: str) -> None:
        self.registry.require_accepting(name)

    def workflow(self, name: str) -> Workflow:
        return self.registry.workflow(name)

    def register(self, workflow: Workflow) -> None:
        self.registry.register(workflow)

    def declare_queue(self, spec: QueueSpec) -> None:
        self.registry.declare_queue(spec)

    def declaring(self) -> AbstractContextManager[None]:
        """Hold the lock while a declaration is recorded: only before start."""
        return self.registry.declaring()

    def add_ticker(self, ticker: Ticker) -> None:
        self.registry.add_ticker(ticker)

    def set_options(self, **changes: Any) -> None:
        """Change options before start (``memable worker --threads``, ``--queues``)."""
        self.registry.set_options(**changes)

    def start(self) -> None:
        self.check_fork()
        registry = self.registry
        with self._lock:
            if registry.phase != "new":
                raise AlreadyStarted(phase=registry.phase)
            options = registry.options
            queues = consumed(registry.queues, options.queues)  # ValueError: undeclared
            self.claims.prepare(queues)
            self.runs.open(options.max_workers)
            if options.retention is not None:
                self._purger = Purger(self.store, options.retention,
                                      options.poll_interval, self.clock)
            registry.phase = "started"
            registry.accepting = True
        now = self.clock.wall()
        # What it runs, for a tool to say why a queued instance waits.
        schedules = {k: v for ticker in registry.tickers for k, v in ticker.declares().items()}
        declared = Declarations(sorted(registry.workflows), queues, schedules)
        server = self.store.register_owner(options.lease, now, declared.to_json())
        self.claims.registered(now, server)
        for ticker in registry.tickers:
            ticker.start(now)
        # Its first tick fires what fell due while no engine ran, resumes instances whose
        # signal or timer arrived meanwhile, and (with recover) those whose owner died.
        assert self.claims.background is not None
        self.claims.background.start()
        if self.claims.dispatcher is not None:
            self.claims.dispatcher.start()
        if self._purger is not None:
            self._purger.start()
        self.store.listen(self.claims.changed)
        if queues:
            names = [queue.name for queue in queues]
            self._unobserve = self.telemetry.observe_queues(lambda: self.queue_stats(names))
        log.info("engine started", extra={"workflows": sorted(registry.workflows)})

    def queue_stats(self, names: list[str]) -> list[QueueStats]:
        """The queue gauges of the queues this engine consumes (read on the meter's thread)."""
        now = self.clock.wall()
        stats = []
        for name in names:
            queued, running, oldest = self.store.queue_stats(name, now)
            stats.append(QueueStats(name, queued, running, waited(oldest, now) or 0.0))
        return stats

    def wait_all(self) -> None:
        with self._lock:
            self.registry.accepting = False
            started = self.registry.phase == "started"
        while started:
            with self._lock:
                self.runs.wait_drained()
            # Timers that fell due meanwhile start runs too; drain those as well.
            self.claims.tick(False)
            consumer = self.claims.consumer
            if consumer is not None and consumer.waiting():
                # Queued instances this engine can run: the queue thread takes them.
                self.kick()
                with self._lock:
                    self.runs.wait_idle(self.poll_interval)
                continue
            with self._lock:
                if self.runs.drained():
                    break
        self.stop()

    def stop(self) -> None:
        registry = self.registry
        with self._lock:
            registry.accepting = False
            if registry.phase != "started":
                if registry.phase == "new":
                    registry.phase = "stopped"
                return
            registry.phase = "stopped"
            executor, background = self.runs.executor, self.claims.background
            dispatcher, purger = self.claims.dispatcher, self._purger
            # Runs in a retry backoff stop waiting (the rest is stored as a timer).
            self.runs.interrupt_all()
        self.store.listen(None)
        self._unobserve()
        if dispatcher is not None:
            dispatcher.stop()
        if purger is not None:  # a purge under way stops after its current batch
            purger.stop()
        if background is not None:
            background.stop()
        # Runs submitted before the phase changed still run: shutdown waits for them.
        if executor is not None:
            executor.shutdown(wait=True)
            try:
                self.store.drop_owner()
            except StorageError as exc:  # unreachable: the lease expires on its own
                log.warning("engine stopped; its owner row stays until its lease expires "
                            "(%s)", exc)
                return
        log.info("engine stopped")

    def close(self) -> bool:
        """Mark the runner closed; False if it already was (the caller closes the store)."""
        self.stop()
        with self._lock:
            if self.registry.phase == "closed":
                return False
            self.registry.phase = "closed"
        return True

    def watch(self, workflow: str, instance_id: str) -> Watch:
        return self.runs.watch(workflow, instance_id)

    def signalling(
        self, workflow: str, instance_id: str, key: str
    ) -> AbstractContextManager[None]:
        """Hold off steps starting while a signal to ``key`` is stored (``Runs.signalling``)."""
        return self.runs.signalling(workflow, instance_id, key)

    def start_run(
        self, workflow: Workflow, instance_id: str, fresh_input: tuple[Any] | None, *,
        claim: Claim = "resume", traceparent: str | None = None,
    ) -> Watch:
        """Submit a run the user asked for, unless one is active (``Runs.start_run``)."""
        return self.runs.start_run(workflow, instance_id, fresh_input, claim=claim,
                                   traceparent=traceparent)

    def submit(
        self, workflow: Workflow, instance_id: str, fresh_input: tuple[Any] | None, *,
        traceparent: str | None = None, reason: RunReason | None = None,
    ) -> None:
        """Run an instance here while the engine is started (``Runs.submit``)."""
        self.runs.submit(workflow, instance_id, fresh_input, traceparent=traceparent,
                         reason=reason)

    def in_flight(self) -> list[tuple[str, str, str | None, float | None]]:
        """(workflow, id, key, since) of each active run (``Runs.in_flight``)."""
        return self.runs.in_flight()

    def start_made(
        self, make: Callable[[], Iterable[Made]], *, asked: bool = False
    ) -> list[Watch]:
        """Store instances this engine runs and start their runs (``Claims.start_made``)."""
        return self.claims.start_made(make, asked=asked)

    def kick(self) -> None:
        self.claims.kick()

    def armed(self) -> None:
        self.claims.armed()

    def wake(self, name: str, instance_id: str, claim: Claim = "wake") -> None:
        self.claims.wake(name, instance_id, claim)

    def ended_by_cancel(self, name: str, instance_id: str, ended: Ended) -> None:
        self.claims.ended_by_cancel(name, instance_id, ended)

    def fire_due(self) -> int:
        return self.claims.fire_due()
