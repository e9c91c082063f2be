"""The runner: the lifecycle of an engine's runs, from submit to recorded end.

``Runner`` owns the lock and everything it guards (the phase, the registry,
the active runs, the watches), the worker pool and the background thread.
It is handed what it needs (a store and the options, with their clock), not
the engine; ``Engine`` is the public face in front of it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any, Literal, Protocol

import attrs

from .._background.queues import Dispatcher, QueueConsumer
from .._background.retention import Purger
from .._background.timers import BackgroundThread
from .._clock import Skew, utc_text
from .._errors import (
    AlreadyStarted,
    InstanceNotFound,
    InvalidKey,
    NotStarted,
    SerializationError,
    SignalRejected,
    StorageError,
    WorkflowNotFound,
)
from .._log import log, where
from .._observe.base import QueueStats, RunReason, Telemetry
from .._queues import Declarations, QueueSpec, consumed
from .._records import StatusName
from .._states import Cancelled, Completed, Failed, Suspended, WorkflowState
from .._store.control import LeaseLost, LostInstance, RunCancelled
from .._store.protocol import Store
from .._store.rows import (
    UNREACHED,
    Claim,
    Ended,
    InstanceRow,
    RunEnd,
    RunSnapshot,
    StepWrite,
    waited,
)
from .._store.serde import decode_for, store_form
from .attempts import traceback_of
from .children import Children
from .context import Context
from .control import EngineStopping, Suspension
from .fork import ForkGuard
from .invocation import Watch, state_of
from .options import Options
from .run import Run, stored_state
from .run import release as release_instance
from .workflow import Made, Workflow

Phase = Literal["new", "started", "stopped", "closed"]


class Ticker(Protocol):
    """A part the timer thread looks with too (an engine's schedules): at each look it fires
    what fell due and says when it next needs one. The runner knows nothing else of it."""

    def declares(self) -> dict[str, list[str]]:
        """What the engine's owner row says of it (``Declarations.schedules``)."""

    def start(self, now: float) -> None:
        """The engine starts (its owner row is stored; no thread looks yet)."""

    def look(self, now: float) -> tuple[int, float | None]:
        """Fire what is due at ``now``: how many runs that made, and seconds until the
        next look it needs (None: none)."""

class Runner:
    """Starts runs on the worker pool, records how they end, and keeps watch.

    >>> from memable._run.options import Options
    >>> from memable._sqlite.store import SQLiteStore
    >>> runner = Runner(SQLiteStore(None, "full"), Options())
    >>> runner.phase, runner.close(), runner.phase
    ('new', True, 'closed')
    >>> runner.store.close()
    """

    def __init__(
        self, store: Store, options: Options, telemetry: Telemetry | None = None
    ) -> None:
        self.store = store
        self.options = options
        #: Where runs and steps report spans and metrics (does nothing unless told).
        self.telemetry = telemetry or Telemetry()
        self.clock = options.clock
        self.poll_interval = options.poll_interval
        # _lock guards every field below it: the phase, the registry, the
        # active runs, the watches, _firing. Lock order: _lock, then a Watch's
        # cond, then the store's lock; never the other way round.
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when _active empties
        self.phase: Phase = "new"
        self._accepting = False  # user calls (invoke, resume) are taken
        self.workflows: dict[str, Workflow] = {}
        self._active: dict[tuple[str, str], Run] = {}
        self._watches: weakref.WeakValueDictionary[tuple[str, str], Watch] = (
            weakref.WeakValueDictionary()
        )
        self._firing = 0  # timer firings, wakes and queue claims under way outside _lock
        self._turnover = 0  # runs registered or ended so far (see _look_around)
        # Instances this engine took or made, owned here and not yet registered as runs:
        # queue claims, invokes, children started, schedule ticks (see _look_around).
        self._claiming = 0
        self._executor: ThreadPoolExecutor | None = None
        self._background: BackgroundThread | None = None
        self._next_heartbeat = 0.0  # wall clock; the background thread's alone
        # How far the wall clock is from the store's (PostgreSQL's server): start's, then
        # the background thread's alone (it heartbeats).
        self._skew = Skew()
        self._fork = ForkGuard()  # nothing here works in a forked child
        #: Declared queues, by name (fixed once started; under _lock until then).
        self.queues: dict[str, QueueSpec] = {}
        self._dispatcher: Dispatcher | None = None  # consumes queues; started by start()
        self._purger: Purger | None = None  # purges past retention; started by start()
        self._consumer: QueueConsumer | None = None
        # Stops the queue gauges reading this engine's queues (set by start).
        self._unobserve: Callable[[], None] = lambda: None
        #: Parts the timer thread looks with too (fixed once started; under _lock until then).
        self._tickers: list[Ticker] = []
        #: What runs need to start and follow children.
        self.children = Children(self.workflows, store, self.submit, self.clock, self.queues,
                                 self.kick, self.telemetry, self.start_made)

    # ------------------------------------------------------------------ guards

    def check_fork(self) -> None:
        """Raise EngineError in a child forked after this engine was made."""
        self._fork.check()

    def require_accepting(self, name: str) -> None:
        self.check_fork()
        with self._lock:
            if not self._accepting:
                raise NotStarted(name, self.phase)

    def workflow(self, name: str) -> Workflow:
        workflow = self.workflows.get(name)
        if workflow is None:
            raise WorkflowNotFound(name)
        return workflow

    # ------------------------------------------------------------------ lifecycle

    def register(self, workflow: Workflow) -> None:
        with self._lock:
            if self.phase != "new":
                raise AlreadyStarted(workflow.name, self.phase)
            if workflow.name in self.workflows:
                raise ValueError(f"workflow {workflow.name!r} is already registered")
            self.workflows[workflow.name] = workflow

    def declare_queue(self, spec: QueueSpec) -> None:
        with self._lock:
            if self.phase != "new":
                raise AlreadyStarted(phase=self.phase)
            if spec.name in self.queues:
                raise ValueError(f"queue {spec.name!r} is already declared")
            self.queues[spec.name] = spec

    @contextmanager
    def declaring(self) -> Iterator[None]:
        """Hold the lock while a declaration is recorded: only before start."""
        with self._lock:
            if self.phase != "new":
                raise AlreadyStarted(phase=self.phase)
            yield

    def add_ticker(self, ticker: Ticker) -> None:
        with self._lock:
            if self.phase != "new":
                raise AlreadyStarted(phase=self.phase)
            self._tickers.append(ticker)

    @property
    def accepting(self) -> bool:
        """Whether new runs are taken (started, and not draining or stopping)."""
        with self._lock:
            return self._accepting

    def set_options(self, **changes: Any) -> None:
        """Change options before start (``memable worker --threads``, ``--queues``)."""
        with self._lock:
            if self.phase != "new":
                raise AlreadyStarted()
            self.options = attrs.evolve(self.options, **changes)

    def start(self) -> None:
        self.check_fork()
        with self._lock:
            if self.phase != "new":
                raise AlreadyStarted(phase=self.phase)
            queues = consumed(self.queues, self.options.queues)  # ValueError: undeclared
            if queues:
                self._consumer = QueueConsumer(
                    self.store, queues, sorted(self.workflows), self.clock,
                    capacity=self._capacity, run=self._run_claimed, telemetry=self.telemetry,
                    check_every=self.options.lease,
                )
                self._dispatcher = Dispatcher(
                    self._claim_queued, self.options.poll_interval, self.clock
                )
            self._executor = ThreadPoolExecutor(
                max_workers=self.options.max_workers, thread_name_prefix="memable-worker"
            )
            # The thread must look often enough to renew the lease in time.
            self._background = BackgroundThread(
                self._tick, min(self.options.poll_interval, self.options.lease / 3), self.clock
            )
            if self.options.retention is not None:
                self._purger = Purger(self.store, self.options.retention,
                                      self.options.poll_interval, self.clock)
            self.phase = "started"
            self._accepting = True
        now = self.clock.wall()
        # What it runs, for a tool to say why a queued instance waits.
        schedules = {k: v for ticker in self._tickers for k, v in ticker.declares().items()}
        declared = Declarations(sorted(self.workflows), queues, schedules)
        server = self.store.register_owner(self.options.lease, now, declared.to_json())
        self._judge_clock(now, server)
        self._next_heartbeat = now + self.options.lease / 3
        for ticker in self._tickers:
            ticker.start(now)
        # Its first tick fires what fell due while no engine ran, resumes
        # instances whose awaited signal or timer arrived meanwhile, and (with
        # recover) those whose owner died.
        self._background.start()
        if self._dispatcher is not None:
            self._dispatcher.start()
        if self._purger is not None:
            self._purger.start()
        self.store.listen(self._changed)
        if queues:
            names = [queue.name for queue in queues]
            self._unobserve = self.telemetry.observe_queues(lambda: self._queue_stats(names))
        log.info("engine started", extra={"workflows": sorted(self.workflows)})

    def _queue_stats(self, names: list[str]) -> list[QueueStats]:
        """What the queue gauges show of the queues this engine consumes (the meter's
        thread reads them)."""
        now = self.clock.wall()
        stats = []
        for name in names:
            queued, running, oldest = self.store.queue_stats(name, now)
            stats.append(QueueStats(name, queued, running, waited(oldest, now) or 0.0))
        return stats

    def wait_all(self) -> None:
        with self._lock:
            self._accepting = False
            started = self.phase == "started"
        while started:
            with self._lock:
                self._idle.wait_for(lambda: not self._active and not self._firing)
            # Timers that fell due meanwhile start runs too; drain those as well.
            self._tick(False)
            if self._consumer is not None and self._consumer.waiting():
                # Queued instances this engine can run: the queue thread takes them.
                self.kick()
                with self._lock:
                    self._idle.wait(self.poll_interval)
                continue
            with self._lock:
                if not self._active and not self._firing:
                    break
        self.stop()

    def stop(self) -> None:
        with self._lock:
            self._accepting = False
            if self.phase != "started":
                if self.phase == "new":
                    self.phase = "stopped"
                return
            self.phase = "stopped"
            executor, background = self._executor, self._background
            dispatcher, purger = self._dispatcher, self._purger
            # Runs waiting out a retry backoff stop waiting (and store the rest
            # of it as a timer for the next engine).
            for run in self._active.values():
                run.interrupt.set()
        self.store.listen(None)
        self._unobserve()
        if dispatcher is not None:
            dispatcher.stop()
        if purger is not None:  # a purge under way stops after its current batch
            purger.stop()
        if background is not None:
            background.stop()
        # Runs submitted before the phase changed still run; shutdown waits for
        # them and joins the worker threads.
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
            if self.phase == "closed":
                return False
            self.phase = "closed"
        return True

    def armed(self) -> None:
        if self._background is not None:
            self._background.armed()

    # ------------------------------------------------------------------ watches and runs

    def watch(self, workflow: str, instance_id: str) -> Watch:
        with self._lock:
            return self._watch(workflow, instance_id)

    def _watch(self, workflow: str, instance_id: str) -> Watch:
        # Caller holds _lock.
        key = (workflow, instance_id)
        watch = self._watches.get(key)
        if watch is None:
            watch = Watch(workflow, instance_id)
            self._watches[key] = watch
        return watch

    @contextmanager
    def signalling(self, workflow: str, instance_id: str, key: str) -> Iterator[None]:
        """Hold off steps starting while a signal to ``key`` is stored here.

        Raise SignalRejected if a run here is executing ``key``. A run marks
        its key in flight under this same lock and then looks at the keys
        signalled while it was active, so it either is seen here, or sees the
        signal and refuses the key; a run that starts later reads the signal
        with its steps.
        """
        with self._lock:
            run = self._active.get((workflow, instance_id))
            ctx = None if run is None else run.ctx
            if ctx is not None and key in ctx.attempts.in_flight:
                raise SignalRejected(workflow, instance_id, key, "the key is a step in flight")
            yield
            if run is not None:
                run.signalled.add(key)

    def start_run(
        self,
        workflow: Workflow,
        instance_id: str,
        fresh_input: tuple[Any] | None,
        *,
        claim: Claim = "resume",
        traceparent: str | None = None,
    ) -> Watch:
        """Submit a run the user asked for, unless one is active; return its Watch.

        User calls need the engine accepting; runs that timers and signals
        start (``wake``) only need it started: they go on while wait_all drains.
        """
        if fresh_input is None and claim == "resume":
            return self._resume(workflow, instance_id)
        with self._lock:
            if not self._accepting:
                raise NotStarted(workflow.name, self.phase)
            return self._submit(workflow, instance_id, fresh_input, claim, traceparent)

    def _resume(self, workflow: Workflow, instance_id: str) -> Watch:
        """Claim the instance on the caller's thread, then run it: ``resume()`` returns
        with its claim committed, at the engine's durability."""
        with self._lock:
            if not self._accepting:
                raise NotStarted(workflow.name, self.phase)
            active = self._active.get((workflow.name, instance_id))
            if active is not None:  # at most one run per instance
                return active.watch
            run = self._register(workflow, instance_id, None, "resume", None, reason="resume")
        try:
            run.snapshot = self.store.begin_run(
                workflow.name, instance_id, now=utc_text(self.clock), claim="resume"
            )
        except BaseException:
            self._ended(run, None)  # nothing claimed: the caller gets the error
            raise
        run.claimed = True
        if run.snapshot is not None:
            _log_recovery(run.snapshot.instance)
            if run.snapshot.instance.status == "queued":
                # It waits for a slot: nothing runs here now (its state reads Queued()).
                self._ended(run, None)
                return run.watch
        try:
            with self._lock:
                assert self._executor is not None
                self._executor.submit(self._execute, run)
        except RuntimeError:  # stopped meanwhile: its owner row goes, recovery runs it
            self._ended(run, None)
        return run.watch

    def _submit(
        self,
        workflow: Workflow,
        instance_id: str,
        fresh_input: tuple[Any] | None,
        claim: Claim,
        traceparent: str | None = None,
        reason: RunReason | None = None,
    ) -> Watch:
        # Caller holds _lock and has checked that the engine is started.
        assert self._executor is not None
        active = self._active.get((workflow.name, instance_id))
        if active is not None:  # at most one run per instance
            return active.watch
        run = self._register(workflow, instance_id, fresh_input, claim, None,
                             traceparent=traceparent, reason=reason)
        self._executor.submit(self._execute, run)
        return run.watch

    def _register(
        self,
        workflow: Workflow,
        instance_id: str,
        fresh_input: tuple[Any] | None,
        claim: Claim,
        snapshot: RunSnapshot | None,
        *,
        traceparent: str | None = None,
        reason: RunReason | None = None,
    ) -> Run:
        # Caller holds _lock and knows no run of the instance is active.
        watch = self._watch(workflow.name, instance_id)
        if reason is None and claim == "recover":
            reason = "recovery"
        run = Run(workflow, instance_id, watch, fresh_input, snapshot, claim=claim,
                  traceparent=traceparent, reason=reason)
        self._active[(workflow.name, instance_id)] = run
        self._turnover += 1
        watch.begin(claimed=fresh_input is not None or snapshot is not None)
        return run

    def start_made(
        self, make: Callable[[], Iterable[Made]], *, asked: bool = False
    ) -> list[Watch]:
        """Store instances this engine runs and start their runs, as one call: ``make``
        stores them (one store call) and returns those it made to run here; this starts
        their runs (``asked``: as ``start_run`` does for a user's call, which needs the
        engine accepting; else while it is started, as ``submit``: children, ticks).
        Until they are registered, the poll does not take one of them, stored as ours and
        not yet active, for a run whose end was lost."""
        with self._lock:
            self._claiming += 1
        try:
            watches = []
            for workflow, instance_id, fresh_input, traceparent, reason in make():
                if asked:
                    watches.append(self.start_run(workflow, instance_id, fresh_input,
                                                  traceparent=traceparent))
                    continue
                with self._lock:
                    if self.phase == "started":
                        watches.append(self._submit(workflow, instance_id, fresh_input,
                                                    "resume", traceparent, reason))
            return watches
        finally:
            with self._lock:
                self._claiming -= 1

    def kick(self) -> None:
        """An instance was queued, or a slot freed: the queue thread looks now."""
        if self._dispatcher is not None:
            self._dispatcher.kick()

    def _claim_queued(self) -> float | None:
        """The queue thread's look; counted as work under way, so wait_all waits for it."""
        assert self._consumer is not None
        with self._lock:
            self._firing += 1
            self._claiming += 1
        try:
            return self._consumer.claim()
        finally:
            with self._lock:
                self._firing -= 1
                self._claiming -= 1
                if not self._firing and not self._active:
                    self._idle.notify_all()

    def _capacity(self) -> int:
        with self._lock:
            return self.options.max_workers - len(self._active)

    def _run_claimed(self, snapshot: RunSnapshot) -> None:
        """Run an instance the queue thread claimed (it is running and ours)."""
        name, instance_id = snapshot.instance.workflow, snapshot.instance.instance_id
        with self._lock:
            if self.phase == "started" and (name, instance_id) not in self._active:
                assert self._executor is not None
                run = self._register(self.workflows[name], instance_id, None, "resume", snapshot)
                self._executor.submit(self._execute, run)
                return
        # Stopping: back in the queue, in its place, for the next engine.
        self.store.finish(name, instance_id, RunEnd("queued", utc_text(self.clock)))

    def submit(
        self, workflow: Workflow, instance_id: str, fresh_input: tuple[Any] | None,
        *, traceparent: str | None = None, reason: RunReason | None = None,
    ) -> None:
        """Run an instance here (a child a run starts or resumes, a schedule's tick) while
        the engine is started."""
        with self._lock:
            if self.phase == "started":
                self._submit(workflow, instance_id, fresh_input, "resume", traceparent, reason)

    def wake(self, name: str, instance_id: str, claim: Claim = "wake") -> None:
        """A key the instance may wait on completed (or its owner died): run it.

        Now, or when its active run here ends.
        """
        workflow = self.workflows.get(name)
        with self._lock:
            active = self._active.get((name, instance_id))
            if active is not None:
                active.rerun = active.rerun or claim == "wake"
            elif workflow is not None and self.phase == "started":
                self._submit(workflow, instance_id, None, claim)
            # Else another engine has the workflow, or this one stopped: the
            # next poll of whichever engine runs it picks the instance up.

    def ended_by_cancel(self, name: str, instance_id: str, ended: Ended) -> None:
        """A cancel stored (``Store.cancel``, or a workflow timeout): the runs here of the
        instance and its cancelled descendants stop, and a parent it settles goes on."""
        for workflow, cancelled_id in [(name, instance_id), *ended.cancelled]:
            self.cancelled(workflow, cancelled_id)
        if ended.wake is not None:  # a child cancelled: its parent goes on
            self.wake(*ended.wake)

    def cancelled(self, name: str, instance_id: str) -> None:
        """The instance was cancelled: its run here (if any) stops at once, and what
        waits on it here looks at the store again."""
        with self._lock:
            run = self._active.get((name, instance_id))
            if run is not None:
                run.cancel_requested = True
                run.interrupt.set()
            watch = self._watches.get((name, instance_id))
        if watch is not None:
            watch.changed()

    def _changed(self, kind: str, name: str | None, instance_id: str | None) -> None:
        """Another engine changed the store (it said so; see ``Store.listen``): act now."""
        background = self._background
        if kind == "queued":  # queued or freed a slot elsewhere
            self.kick()
        elif name is not None and instance_id is not None and kind in ("signal", "cancel"):
            (self.wake if kind == "signal" else self.cancelled)(name, instance_id)
        elif background is not None:  # a timer armed (look at deadlines again), or anything
            background.armed() if kind == "timer" else background.poll_soon()

    # ------------------------------------------------------------------ one run

    def _execute(self, first: Run) -> None:
        """Worker thread: run the workflow function and record how it ended.

        A run that ends at a wait whose key had already completed is followed
        by the next run of the instance on this same thread: no hand-off.
        """
        run: Run | None = first
        while run is not None:
            state: WorkflowState | None
            try:
                with self.store.session():  # one connection for the run, where pooled
                    state = self._run_workflow(run)
            except LeaseLost as lost:  # the store stayed unreachable past the lease
                log.warning("run stopped: %s", lost,
                            extra=where(run.workflow.name, run.instance_id))
                state = None  # watchers go on following the instance in the store
            except BaseException:  # the store failed while recording the end
                log.exception(
                    "run could not be recorded; it runs again from the store",
                    extra=where(run.workflow.name, run.instance_id),
                )
                state = None  # watchers go on following the instance in the store
            run = self._ended(run, state)

    def _ended(self, run: Run, state: WorkflowState | None) -> Run | None:
        """Record that ``run`` ended in ``state``; return the run to go on with here, if any."""
        release = False
        with self._lock:
            del self._active[(run.workflow.name, run.instance_id)]
            self._turnover += 1
            follow: Run | None = None
            if run.go_on is not None:
                if self.phase == "started":
                    # What it suspended at was there already: go on, still claimed.
                    follow = self._register(
                        run.workflow, run.instance_id, None, "wake", run.go_on
                    )
                    follow.cancel_requested = run.cancel_requested
                    follow.signalled = run.signalled
                else:
                    release = True
            elif (
                run.rerun and (state is None or isinstance(state, Suspended))
                and self.phase == "started"
            ):
                # A signal or timer arrived while it ran: go on right away.
                self._submit(run.workflow, run.instance_id, None, "wake")
        if release:
            state = release_instance(self.store, run, self.clock)
        run.watch.finish(state, run.output)
        with self._lock:
            if not self._active and not self._firing:
                self._idle.notify_all()
        self.kick()  # a worker is free, and maybe a slot of a queue
        return follow

    def _run_workflow(self, run: Run) -> WorkflowState | None:
        """Run the workflow function once; the state it ended in (None: not ended here)."""
        workflow, instance_id = run.workflow, run.instance_id
        name = workflow.name
        stored_status = None
        if run.fresh_input is not None:
            input_value, memo = run.fresh_input[0], {}
        else:
            snapshot = run.snapshot
            if snapshot is None and not run.claimed:
                snapshot = self.store.begin_run(
                    name, instance_id, now=utc_text(self.clock), claim=run.claim
                )
                if snapshot is not None:
                    _log_recovery(snapshot.instance)
            if snapshot is not None and snapshot.instance.status == "queued":
                # It waits for a slot; whichever engine consumes its queue runs it.
                # Nothing ran here: watchers follow the instance (None).
                self.kick()
                return None
            if snapshot is None:  # gone, or run by a live engine, or not waiting any more
                row = self.store.get_instance(name, instance_id)
                if row is None:
                    return Failed(str(InstanceNotFound(name, instance_id)))
                # Not claimed: nothing ran here, and nothing of this run to report.
                if row.status == "running" or run.claim != "resume":
                    return None
                return state_of(row)
            run.watch.claimed()  # running and ours: Started, for whoever asks
            memo, stored_status = snapshot.steps, snapshot.instance.status_message
            try:
                input_value = decode_for(
                    name, instance_id, "input", snapshot.instance.input,
                    snapshot.instance.input_type, workflow.input_hint,
                )
            except SerializationError as exc:
                return self._fail(run, f"input failed: {type(exc).__name__}: {exc}")
        if run.fresh_input is None:
            assert snapshot is not None
            traceparent = snapshot.instance.traceparent
            reason = run.reason or _woken_by(snapshot)
        else:
            traceparent, reason = run.traceparent, run.reason or "invoke"
        trace = self.telemetry.run(name, instance_id, traceparent, reason)
        ctx = Context(
            workflow=name, instance_id=instance_id, input=input_value, store=self.store,
            memo=memo, publish=run.watch.publish, run=run, options=self.options,
            flight_lock=self._lock, children=self.children,
            stored_status=stored_status, trace=trace, telemetry=self.telemetry,
        )
        began = self.clock.monotonic()
        state: WorkflowState | None = None
        try:
            state = self._call(run, ctx, input_value)
        finally:
            outcome = None if state is None else _OUTCOMES[type(state)]
            trace.end(outcome, ctx.replayed)
            if outcome is not None:
                self.telemetry.run_ended(name, outcome, self.clock.monotonic() - began)
        return state

    def _call(self, run: Run, ctx: Context, input_value: Any) -> WorkflowState | None:
        """Call the workflow function with ``ctx``; record how it ended."""
        workflow, instance_id = run.workflow, run.instance_id
        name = workflow.name
        run.ctx = ctx
        log.info("running", extra=where(name, instance_id))
        try:
            with ctx.attempts.trace.current():
                value = (workflow.fn(ctx, input_value) if workflow.takes_input
                         else workflow.fn(ctx))
        except Suspension as suspension:
            return self._suspend(run, suspension.waiting, suspension.message,
                                 suspension.deadline, suspension)
        except EngineStopping as stopping:
            return self._suspend(run, stopping.waiting, f"retry {stopping.waiting.key}",
                                 stopping.deadline, None)
        except (RunCancelled, LostInstance) as stop:
            # Cancelled (already recorded), or taken over by another engine:
            # nothing more to write but letting go of the instance.
            if isinstance(stop, LostInstance):
                log.warning("run stopped: the instance was taken over by another engine",
                            extra=where(name, instance_id))
            else:
                log.info("run stopped: cancelled", extra=where(name, instance_id))
            return self._finish(run, Cancelled(), status="cancelled", message=None)
        except LeaseLost:  # nothing can be written: the run stops (see _execute)
            raise
        except BaseException as exc:  # whatever else user code raises ends the run Failed
            failure = ctx._failure
            step = failure[0] if failure is not None and failure[1] is exc else None
            return self._fail(run, ctx._failure_message(exc), step, exc)
        finally:
            run.ctx = None
        ctx._end_replay()
        try:
            text, tag, _ = store_form(name, instance_id, "output", value, workflow.output_hint)
        except SerializationError as exc:
            return self._fail(run, f"output failed: {type(exc).__name__}: {exc}")
        log.info("completed", extra=where(name, instance_id))
        return self._finish(
            run, Completed(), status="completed", message=None, output=(text, tag)
        )

    def _suspend(
        self,
        run: Run,
        waiting: StepWrite,
        message: str,
        deadline: float | None,
        suspension: Suspension | None,
    ) -> WorkflowState | None:
        """Record the wait; if what it waits for is there already, go on in a new run."""
        at = where(run.workflow.name, run.instance_id, waiting.key)
        try:
            recorded = self.store.suspend(waiting, message, deadline, self.clock.wall())
        except LostInstance:
            log.warning("run stopped: the instance was taken over by another engine", extra=at)
            return stored_state(self.store, run)
        except InvalidKey as exc:  # the key is stored as another kind
            return self._fail(run, f"step {waiting.key!r} failed: {type(exc).__name__}: {exc}",
                              waiting.key)
        if recorded.outcome == "stopped":  # cancelled meanwhile: let go (and of its slot)
            return self._finish(run, Cancelled(), status="cancelled", message=None)
        if recorded.outcome == "ready":
            run.go_on = recorded.snapshot  # _execute starts the next run from it
            run.waited = suspension or Suspension(waiting.key, message, waiting, deadline)
            log.debug("went straight on past %s", waiting.key, extra=at)
        elif recorded.deadline is not None:
            self.armed()
        log.info("suspended: %s", message, extra=at)
        return Suspended(message)

    def _finish(
        self,
        run: Run,
        state: WorkflowState,
        *,
        status: StatusName,
        message: str | None,
        output: tuple[str, str | None] | None = None,
        traceback: str | None = None,
    ) -> WorkflowState | None:
        """Record how the run ended; if the instance is no longer ours, report what is stored."""
        ended = self.store.finish(run.workflow.name, run.instance_id, RunEnd(
            status, utc_text(self.clock), message, output, traceback=traceback,
        ))
        if not ended.recorded:
            return stored_state(self.store, run)
        if ended.wake is not None:  # a child's end: its parent goes on
            self.wake(*ended.wake)
        run.output = output  # result() decodes it without reading the row back
        return state

    def _fail(
        self, run: Run, message: str, step: str | None = None, exc: BaseException | None = None
    ) -> WorkflowState | None:
        log.warning(
            "failed: %s", message, extra=where(run.workflow.name, run.instance_id, step),
            exc_info=None if exc is None else (type(exc), exc, exc.__traceback__),
        )
        return self._finish(
            run, Failed(message), status="failed", message=message,
            traceback=None if exc is None else traceback_of(exc),
        )

    # ------------------------------------------------------------------ the timer thread's look

    def fire_due(self) -> int:
        """Fire the timers (and schedule ticks) due now and start the runs they resume or
        make; return how many."""
        self.check_fork()
        with self._lock:
            if self.phase != "started":
                raise NotStarted(phase=self.phase)
        fired, _, _ = self._fire_due()
        return fired

    def _fire_due(self) -> tuple[int, float, float | None]:
        """Fire the timers due now, and what the tickers find due; return how many, the
        wall-clock time used, and the seconds until a ticker needs its next look."""
        with self._lock:
            self._firing += 1
        try:
            # Read here, not higher up: see BackgroundThread on freezegun.
            now = self.clock.wall()
            fired = self.store.fire_due_timers(self.clock.wall, utc_text(self.clock))
            for name, instance_id, key, deadline in fired:
                log.info("timer fired: %s", key, extra=where(name, instance_id, key))
                self.telemetry.timer_fired(now - deadline)
                self.wake(name, instance_id)
            count, until = len(fired), None
            # The clock, not ``now``: the store reads it after the instances it judges
            # (``Store.time_out``), as a frozen test clock may have gone back since.
            for out in self.store.time_out(self.clock.wall, utc_text(self.clock)):
                log.warning("%s", out.message, extra=where(out.workflow, out.instance_id))
                self.ended_by_cancel(out.workflow, out.instance_id, out.ended)
                count += 1
            for ticker in self._tickers:
                made, wait = ticker.look(now)
                count += made
                if wait is not None and (until is None or wait < until):
                    until = wait
            return count, now, until
        finally:
            with self._lock:
                self._firing -= 1
                if not self._firing and not self._active:
                    self._idle.notify_all()

    def _tick(self, poll: bool) -> float | None:
        """Fire due timers (and ticks), and look at the store; return seconds to the next
        deadline."""
        self._renew()  # first: after an outage, the lease before anything else
        _, now, until = self._fire_due()
        if poll:
            self._look_around(now)
        deadline = self.store.next_deadline()
        waits = [w for w in (until, None if deadline is None else deadline - now) if w is not None]
        return min(waits) if waits else None

    def _heartbeat(self) -> None:
        """Renew the lease, and compare the wall clock with the store's as it did (read
        here, as ``_fire_due`` reads it: see BackgroundThread on freezegun)."""
        before = self.clock.wall()
        self._judge_clock(before, self.store.heartbeat(before))

    def _judge_clock(self, before: float, server: float | None) -> None:
        """Log a WARNING when the wall clock read at ``before`` (and now) differs from the
        store's clock ``server`` read between the two (None: the store has none of its
        own) by more than a second, once per difference (``_clock.Skew``)."""
        if server is not None and (said := self._skew.judge(before, server,
                                                            self.clock.wall())):
            log.warning("%s", said)

    def _renew(self) -> None:
        """Renew the engine's lease when its heartbeat is due, with the steps in flight."""
        # Read here, not higher up: see BackgroundThread on freezegun.
        now = self.clock.wall()
        if now >= self._next_heartbeat:
            self._heartbeat()
            self._next_heartbeat = now + self.options.lease / 3
            steps = [(w, i, k, t) for w, i, k, t in self.in_flight() if k and t]
            self.store.record_in_flight(steps)

    def in_flight(self) -> list[tuple[str, str, str | None, str | None]]:
        """(workflow, id, key, since) of each active run: the step it executes (None between)."""
        found: list[tuple[str, str, str | None, str | None]] = []
        with self._lock:  # also each run's flight lock
            for run in self._active.values():
                ctx = run.ctx
                now = None if ctx is None else ctx.attempts.in_flight_now()
                key, since = (None, None) if now is None else now
                found.append((run.workflow.name, run.instance_id, key, since))
        return found

    def _look_around(self, now: float) -> None:
        with self._lock:
            turnover = self._turnover
        look = self.store.look_around(sorted(self.workflows), now)
        for name, instance_id in look.ready:
            self.wake(name, instance_id)
        if self.options.recover:
            for name, instance_id in look.orphaned:
                # Logged by the run that wins the claim: every engine sees it.
                self.wake(name, instance_id, "recover")
        for name, instance_id in look.cancelled:
            self.cancelled(name, instance_id)
        # Instances this engine owns but no longer runs (a run whose end could
        # not be recorded): run them again, or, cancelled, let go of them (and
        # of their queue's slot). Only when no run here began or ended while the
        # store was read, and no queue claim is under way: else "owned, and not
        # active now" may be a run that ended meanwhile, or one claimed and not
        # yet begun, and the next poll looks again.
        with self._lock:
            # A queue claim under way has instances ours in the store and not yet
            # active here: look again at the next poll.
            if self._turnover != turnover or self._claiming:
                return
            lost = [key for key in look.mine if key not in self._active]
            dropped = [key for key in look.cancelled if key not in self._active]
        for name, instance_id in lost:
            if name in self.workflows:
                log.warning("running again an instance whose run here did not record its end",
                            extra=where(name, instance_id))
                self.wake(name, instance_id, "recover")
        for name, instance_id in dropped:
            # Its run stopped on the cancel and could not record that: the release
            # it would have written (``finish`` of a cancelled instance writes that
            # alone), so its queue's slot is free and the queue thread looks.
            log.warning("letting go of a cancelled instance whose run here did not record "
                        "its end", extra=where(name, instance_id))
            self.store.finish(name, instance_id, RunEnd("cancelled", utc_text(self.clock)))
            self.kick()



#: The outcome a run's span and metrics name, by the state it ended in.
_OUTCOMES: dict[type[WorkflowState], str] = {
    Completed: "completed", Failed: "failed", Cancelled: "cancelled", Suspended: "suspended",
}


def _woken_by(snapshot: RunSnapshot) -> RunReason:
    """Why a run that continues an instance began: what the claim that queued it said
    (a resume, a recovery), else judged by the key it stopped at last (the one of the
    highest seq): a signal, a timer or deadline, a retry backoff, a child's end; an
    instance with no key stored yet starts ("invoke", or its schedule's tick)."""
    said = snapshot.instance.run_reason  # the claim that queued it was a resume or recovery
    if said in ("resume", "recovery"):
        return said  # type: ignore[return-value]
    # A signal stored before the run reached its key has no place yet (UNREACHED).
    placed = [step for step in snapshot.steps.values() if step.seq != UNREACHED]
    if not placed:
        return "schedule" if snapshot.instance.schedule is not None else "invoke"
    last = max(placed, key=lambda step: step.seq)
    if last.kind == "signal":
        return "timer" if last.state == "timed_out" else "signal"
    if last.kind in ("child", "children"):
        return "child"
    if last.kind == "step" and last.state in ("waiting", "failed"):
        return "retry"
    return "timer" if last.kind == "timer" else "resume"


def _log_recovery(row: InstanceRow) -> None:
    """One WARNING from the engine whose claim took the instance from a dead owner
    (that claim alone returns ``lost_owner``), naming it by host and pid, how it was
    lost (died, or stalled past its lease), and the step lost in flight."""
    if row.lost_owner is None:
        return
    lost = row.lost_step
    # "host:pid died" or "host:pid stalled past its lease" (an older store: the id alone).
    name, _, how = (row.lost_by or f"{row.lost_owner} died").partition(" ")
    log.warning(
        "recovered the instance from engine %s, which %s%s", name, how,
        f"; step {lost!r} was in flight and runs again" if lost else "",
        extra=where(row.workflow, row.instance_id, lost),
    )
