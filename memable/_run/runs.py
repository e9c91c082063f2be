"""The runs in flight: an engine's active runs, from submit to recorded end.

``Runs``'s fields are guarded by the runner's one lock (``Registry.lock`` names all it guards)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

from .._errors import (
    InstanceNotFound,
    InvalidKey,
    NotStarted,
    SerializationError,
    SignalRejected,
    instance_finished,
)
from .._log import log, where
from .._observe.base import RunReason, Telemetry
from .._records import StatusName
from .._states import Cancelled, Completed, Failed, Suspended, WorkflowState
from .._store.control import LeaseLost, LostInstance, RunCancelled
from .._store.protocol import RunStore
from .._store.rows import TERMINAL, UNREACHED, Claim, InstanceRow, RunEnd, RunSnapshot, StepWrite
from .._store.serde import decode_for, store_form
from .attempts import traceback_of
from .children import Children
from .context import Context
from .control import EngineStopping, Suspension
from .invocation import Watch, state_of
from .registry import Registry
from .run import Run, stored_state
from .run import release as release_instance
from .workflow import Workflow

#: ``wake(workflow, instance_id)``: a key the instance may wait on completed (``Claims.wake``).
Wake = Callable[[str, str], None]


class Runs:
    """Starts runs on the worker pool, records how they end, and keeps watch.

    "The caller holds the lock" (the registry's) in a docstring: else the method takes it.

    >>> from memable._run.options import Options
    >>> from memable._sqlite.store import SQLiteStore
    >>> store = SQLiteStore(None, "full")
    >>> registry = Registry(Options())
    >>> runs = Runs(registry, registry.lock, store, Telemetry(),
    ...             Children({}, store, lambda *args, **kwargs: None, registry.options.clock),
    ...             wake=lambda name, instance_id: None, kick=lambda: None, armed=lambda: None)
    >>> runs.in_flight(), runs.capacity()
    ([], 8)
    >>> store.close()
    """

    def __init__(
        self, registry: Registry, lock: threading.Lock, store: RunStore, telemetry: Telemetry,
        children: Children, *, wake: Wake, kick: Callable[[], None], armed: Callable[[], None],
    ) -> None:
        self._registry = registry  # the phase, the options (read under lock)
        self._lock = lock  # the registry's: Registry.lock says what it guards
        self.store = store
        self.telemetry = telemetry
        self.clock = registry.options.clock  # the runner's (see Runner.clock)
        self.children = children  # what runs need to start and follow children
        self._wake = wake  # a child's end: its parent goes on (Claims.wake)
        self._kick = kick  # a worker or a queue's slot is free: the queue thread looks
        self._armed = armed  # a deadline stored: the timer thread looks at deadlines again
        # Under lock:
        self._idle = threading.Condition(lock)  # notified when drained() comes true
        self._active: dict[tuple[str, str], Run] = {}
        self._watches: weakref.WeakValueDictionary[tuple[str, str], Watch] = (
            weakref.WeakValueDictionary()
        )
        self.turnover = 0  # runs registered or ended so far (Claims.look_around reads it)
        # Timer firings and queue claims under way outside the lock that may submit runs here.
        self._firing = 0
        self._executor: ThreadPoolExecutor | None = None  # set by open(), at start

    def open(self, max_workers: int) -> None:
        """Make the worker pool (the engine starts; the caller holds the lock)."""
        self._executor = ThreadPoolExecutor(
            max_workers=max_workers, thread_name_prefix="memable-worker")

    @property
    def executor(self) -> ThreadPoolExecutor | None:
        """The worker pool, once open (for stop to shut down)."""
        return self._executor

    def interrupt_all(self) -> None:
        """Stop every run's retry backoff wait (the engine stops; the caller holds the lock)."""
        for run in self._active.values():
            run.interrupt.set()

    def drained(self) -> bool:
        """No active run and no work under way that may submit one (the caller holds the lock)."""
        return not self._active and not self._firing

    def wait_drained(self) -> None:
        """Wait until ``drained()`` (the caller holds the lock)."""
        self._idle.wait_for(lambda: not self._active and not self._firing)

    def wait_idle(self, timeout: float) -> None:
        """Wait up to ``timeout`` s for a run or work to end (the caller holds the lock)."""
        self._idle.wait(timeout)

    def work_began(self) -> None:
        """A timer firing or queue claim began: it may submit runs (the caller holds the lock)."""
        self._firing += 1

    def work_ended(self) -> None:
        """That work ended (the caller holds the lock): wake ``wait_drained`` if drained."""
        self._firing -= 1
        if not self._firing and not self._active:
            self._idle.notify_all()

    def get(self, workflow: str, instance_id: str) -> Run | None:
        """The active run of the instance, if any (the caller holds the lock)."""
        return self._active.get((workflow, instance_id))

    def capacity(self) -> int:
        """How many more runs the worker pool takes now."""
        with self._lock:
            return self._registry.options.max_workers - len(self._active)

    def in_flight(self) -> list[tuple[str, str, str | None, float | None]]:
        """(workflow, id, key, since) of each active run: the step it executes, since (epoch s)."""
        found: list[tuple[str, str, str | None, float | None]] = []
        with self._lock:  # also each run's flight lock
            for run in self._active.values():
                ctx = run.ctx
                now = None if ctx is None else ctx.attempts.in_flight_now()
                key, since = (None, None) if now is None else now
                found.append((run.workflow.name, run.instance_id, key, since))
        return found

    def watch(self, workflow: str, instance_id: str) -> Watch:
        """The watch on the instance (made if none is held)."""
        with self._lock:
            return self._watch(workflow, instance_id)

    def _watch(self, workflow: str, instance_id: str) -> Watch:  # the caller holds the lock
        key = (workflow, instance_id)
        watch = self._watches.get(key)
        if watch is None:
            watch = Watch(workflow, instance_id)
            self._watches[key] = watch
        return watch

    @contextmanager
    def signalling(self, workflow: str, instance_id: str, key: str) -> Iterator[None]:
        """Hold off steps starting while a signal to ``key`` is stored here.

        Raise SignalRejected if a run here is executing ``key``, or InstanceFinished if its
        instance has ended meanwhile (a cancel lets the step in flight finish), as the store
        answers an ended instance first. A run marks its key in flight under this same lock and
        then looks at the keys signalled while it was active, so it either is seen here, or sees
        the signal and refuses the key; a run that starts later reads the signal with its steps."""
        with self._lock:
            run = self._active.get((workflow, instance_id))
            ctx = None if run is None else run.ctx
            if ctx is not None and key in ctx.attempts.in_flight:
                stored = self.store.get_instance(workflow, instance_id)
                if stored is not None and stored.status in TERMINAL:
                    raise instance_finished(workflow, instance_id, stored.status)
                raise SignalRejected(workflow, instance_id, key, "the key is a step in flight")
            yield
            if run is not None:
                run.signalled.add(key)

    def start_run(
        self, workflow: Workflow, instance_id: str, fresh_input: tuple[Any] | None, *,
        claim: Claim = "resume", traceparent: str | None = None,
    ) -> Watch:
        """Submit a run the user asked for, unless one is active; return its Watch (the engine
        accepting: a ``wake`` run only needs it started, and goes on while wait_all drains)."""
        if fresh_input is None and claim == "resume":
            return self._resume(workflow, instance_id)
        with self._lock:
            if not self._registry.accepting:
                raise NotStarted(workflow.name, self._registry.phase)
            return self.submit_locked(workflow, instance_id, fresh_input, claim, traceparent)

    def _resume(self, workflow: Workflow, instance_id: str) -> Watch:
        """Claim the instance on the caller's thread, then run it: ``resume()`` returns
        with its claim committed, at the engine's durability."""
        with self._lock:
            if not self._registry.accepting:
                raise NotStarted(workflow.name, self._registry.phase)
            active = self._active.get((workflow.name, instance_id))
            if active is not None:  # at most one run per instance
                return active.watch
            run = self._register(workflow, instance_id, None, "resume", None, reason="resume")
        try:
            run.snapshot = self.store.begin_run(
                workflow.name, instance_id, now=self.clock.wall(), claim="resume")
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

    def submit_locked(
        self, workflow: Workflow, instance_id: str, fresh_input: tuple[Any] | None, claim: Claim,
        traceparent: str | None = None, reason: RunReason | None = None,
    ) -> Watch:
        """Submit a run of the instance unless one is active; return its Watch (the caller
        holds the lock and has checked that the engine is started)."""
        assert self._executor is not None
        active = self._active.get((workflow.name, instance_id))
        if active is not None:  # at most one run per instance
            return active.watch
        run = self._register(workflow, instance_id, fresh_input, claim, None,
                             traceparent=traceparent, reason=reason)
        self._executor.submit(self._execute, run)
        return run.watch

    def _register(
        self, workflow: Workflow, instance_id: str, fresh_input: tuple[Any] | None, claim: Claim,
        snapshot: RunSnapshot | None, *, traceparent: str | None = None,
        reason: RunReason | None = None,
    ) -> Run:
        # Caller holds the lock and knows no run of the instance is active.
        watch = self._watch(workflow.name, instance_id)
        if reason is None and claim == "recover":
            reason = "recovery"
        run = Run(workflow, instance_id, watch, fresh_input, snapshot, claim=claim,
                  traceparent=traceparent, reason=reason)
        self._active[(workflow.name, instance_id)] = run
        self.turnover += 1
        watch.begin(claimed=fresh_input is not None or snapshot is not None)
        return run

    def submit_claimed(self, workflow: Workflow, instance_id: str, snapshot: RunSnapshot) -> None:
        """Run an instance claimed (running and ours) from ``snapshot``, no run of it being
        active (the caller holds the lock and has checked that the engine is started)."""
        assert self._executor is not None
        run = self._register(workflow, instance_id, None, "resume", snapshot)
        self._executor.submit(self._execute, run)

    def submit(
        self, workflow: Workflow, instance_id: str, fresh_input: tuple[Any] | None,
        *, traceparent: str | None = None, reason: RunReason | None = None,
    ) -> None:
        """Run an instance here if started (a child a run starts or resumes, a schedule's tick)."""
        with self._lock:
            if self._registry.phase == "started":
                self.submit_locked(workflow, instance_id, fresh_input, "resume", traceparent,
                                   reason)

    def cancelled(self, name: str, instance_id: str) -> None:
        """The instance was cancelled: its run here stops at once; what waits on it here looks
        again."""
        with self._lock:
            run = self._active.get((name, instance_id))
            if run is not None:
                run.cancel_requested = True
                run.interrupt.set()
            watch = self._watches.get((name, instance_id))
        if watch is not None:
            watch.changed()

    def _execute(self, first: Run) -> None:
        """Worker thread: run the workflow and record how it ended; a run that ends at a wait
        already satisfied is followed by the instance's next run here, no hand-off."""
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
                log.exception("run could not be recorded; it runs again from the store",
                    extra=where(run.workflow.name, run.instance_id))
                state = None  # watchers go on following the instance in the store
            run = self._ended(run, state)

    def _ended(self, run: Run, state: WorkflowState | None) -> Run | None:
        """Record that ``run`` ended in ``state``; return the run to go on with here, if any."""
        release = False
        with self._lock:
            del self._active[(run.workflow.name, run.instance_id)]
            self.turnover += 1
            follow: Run | None = None
            if run.go_on is not None:
                if self._registry.phase == "started":
                    # What it suspended at was there already: go on, still claimed.
                    follow = self._register(run.workflow, run.instance_id, None, "wake", run.go_on)
                    follow.cancel_requested = run.cancel_requested
                    follow.signalled = run.signalled
                else:
                    release = True
            elif (run.rerun and (state is None or isinstance(state, Suspended))
                    and self._registry.phase == "started"):
                # A signal or timer arrived while it ran: go on right away.
                self.submit_locked(run.workflow, run.instance_id, None, "wake")
        if release:
            state = release_instance(self.store, run, self.clock)
        run.watch.finish(state, run.output)
        with self._lock:
            if not self._active and not self._firing:
                self._idle.notify_all()
        self._kick()  # a worker is free, and maybe a slot of a queue
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
                    name, instance_id, now=self.clock.wall(), claim=run.claim)
                if snapshot is not None:
                    _log_recovery(snapshot.instance)
            if snapshot is not None and snapshot.instance.status == "queued":
                # It waits for a slot, for whichever engine consumes its queue: nothing ran here.
                self._kick()
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
                input_value = decode_for(name, instance_id, "input", snapshot.instance.input,
                    snapshot.instance.input_type, workflow.input_hint)
            except SerializationError as exc:
                return self._fail(run, f"input failed: {type(exc).__name__}: {exc}")
        if run.fresh_input is None:
            assert snapshot is not None
            traceparent = snapshot.instance.traceparent
            reason = run.reason or _woken_by(snapshot)
        else:
            traceparent, reason = run.traceparent, run.reason or "invoke"
        trace = self.telemetry.run(name, instance_id, traceparent, reason)
        ctx = Context(workflow=name, instance_id=instance_id, input=input_value, store=self.store,
            memo=memo, publish=run.watch.publish, run=run, options=self._registry.options,
            flight_lock=self._lock, children=self.children, stored_status=stored_status,
            trace=trace, telemetry=self.telemetry)
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
            # Cancelled (already recorded) or taken over: nothing to write but letting go.
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
        return self._finish(run, Completed(), status="completed", message=None, output=(text, tag))

    def _suspend(
        self, run: Run, waiting: StepWrite, message: str, deadline: float | None,
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
            self._armed()
        log.info("suspended: %s", message, extra=at)
        return Suspended(message)

    def _finish(
        self, run: Run, state: WorkflowState, *, status: StatusName, message: str | None,
        output: tuple[str, str | None] | None = None, traceback: str | None = None,
    ) -> WorkflowState | None:
        """Record how the run ended; if the instance is no longer ours, report what is stored."""
        read = None if run.snapshot is None else run.snapshot.instance
        ended = self.store.finish(run.workflow.name, run.instance_id,
            RunEnd(status, self.clock.wall(), message, output, traceback=traceback, read=read))
        if not ended.recorded:
            return stored_state(self.store, run)
        if ended.wake is not None:  # a child's end: its parent goes on
            self._wake(*ended.wake)
        run.output = output  # result() decodes it without reading the row back
        return state

    def _fail(
        self, run: Run, message: str, step: str | None = None, exc: BaseException | None = None
    ) -> WorkflowState | None:
        log.warning("failed: %s", message, extra=where(run.workflow.name, run.instance_id, step),
            exc_info=None if exc is None else (type(exc), exc, exc.__traceback__))
        return self._finish(run, Failed(message), status="failed", message=message,
            traceback=None if exc is None else traceback_of(exc))


#: The outcome a run's span and metrics name, by the state it ended in.
_OUTCOMES: dict[type[WorkflowState], str] = {
    Completed: "completed", Failed: "failed", Cancelled: "cancelled", Suspended: "suspended"}


def _woken_by(snapshot: RunSnapshot) -> RunReason:
    """Why a run that continues an instance began: what the claim that queued it said (a resume, a
    recovery), else judged by the key of the highest seq (a signal, a timer or deadline, a retry
    backoff, a child's end); with no key stored yet, "invoke" or "schedule"."""
    said = snapshot.instance.run_reason
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
    """One WARNING from the claim that took the instance from a dead owner (it alone returns
    ``lost_owner``): who, how it was lost, and the step lost in flight."""
    if row.lost_owner is None:
        return
    lost = row.lost_step
    # "host:pid died" or "host:pid stalled past its lease" (an older store: the id alone).
    name, _, how = (row.lost_by or f"{row.lost_owner} died").partition(" ")
    log.warning("recovered the instance from engine %s, which %s%s", name, how,
        f"; step {lost!r} was in flight and runs again" if lost else "",
        extra=where(row.workflow, row.instance_id, lost))
