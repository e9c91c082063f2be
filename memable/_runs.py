"""The life of a run: submitting it, running it on a worker, recording its end.

``RunLoop`` is the part of ``Engine`` that user calls do not see: it holds
no state of its own; the fields it uses are the engine's, declared here with
the lock that guards them.
"""

from __future__ import annotations

import inspect
import secrets
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import attrs

from . import _clock
from ._builder import _Options
from ._context import Context, RunCancelled, Suspension
from ._errors import InstanceNotFound, NotStarted, SerializationError, WorkflowNotFound
from ._invocation import Watch, state_of
from ._log import log, where
from ._records import StatusName
from ._serde import decode_for, hints_of, return_hint, store_form
from ._states import Cancelled, Completed, Failed, Suspended, WorkflowState
from ._store import Claim, LostInstance, RunSnapshot, Store, utcnow
from ._timers import TimerThread

Phase = Literal["new", "started", "stopped", "closed"]


@attrs.frozen
class _Workflow:
    name: str
    fn: Callable[..., Any]
    takes_input: bool
    input_hint: Any
    output_hint: Any

    @classmethod
    def of(cls, name: str, fn: Callable[..., Any]) -> _Workflow:
        params = [
            p for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if not 1 <= len(params) <= 2:
            raise TypeError(
                f"workflow {name!r} must take (ctx) or (ctx, input), "
                f"not {len(params)} positional parameters"
            )
        hints = hints_of(fn)
        input_hint = hints.get(params[1].name) if len(params) == 2 else None
        return cls(name, fn, len(params) == 2, input_hint, return_hint(fn))


@attrs.define
class _Run:
    """One execution of an instance's workflow function, from submit to end."""

    workflow: _Workflow
    instance_id: str
    watch: Watch
    # For a run of an instance created by this invoke: the input, already
    # validated; the run then needs to read nothing from the store.
    fresh_input: tuple[Any] | None = None
    # For a run that goes straight on from the one before it (what it waited
    # for had arrived): the instance is still claimed, its steps already read.
    snapshot: RunSnapshot | None = None
    # Set by this run when it ends at a wait whose key had completed: the
    # snapshot its successor starts from.
    go_on: RunSnapshot | None = None
    # How the run claims its instance (see Store.begin_run).
    claim: Claim = "resume"
    # Set under Engine._lock when a signal or timer completed a key while
    # this run was active: if it ends Suspended, run the instance again.
    rerun: bool = False
    # Set under Engine._lock when the instance was cancelled; read without the
    # lock by the run's thread at step boundaries (a stale read only means one
    # more step before it stops).
    cancel_requested: bool = False


def _new_instance_id() -> str:
    # Time-ordered (lists read oldest first) and random enough that several
    # processes on one file do not collide.
    return f"{int(time.time() * 1000):013d}-{secrets.token_hex(6)}"


class RunLoop:
    """Starting runs, running them on the worker pool, and recording how they end."""

    # The engine's fields this part uses; Engine.__init__ sets them. _lock
    # guards _phase, _accepting, _workflows, _active, _watches and _firing.
    _store: Store
    _options: _Options
    _lock: threading.Lock
    _idle: threading.Condition
    _phase: Phase
    _accepting: bool
    _workflows: dict[str, _Workflow]
    _active: dict[tuple[str, str], _Run]
    _watches: weakref.WeakValueDictionary[tuple[str, str], Watch]
    _executor: ThreadPoolExecutor | None
    _timers: TimerThread | None
    _firing: int
    _host: str
    _next_heartbeat: float

    # ------------------------------------------------------------------ runs

    def _workflow(self, name: str) -> _Workflow:
        workflow = self._workflows.get(name)
        if workflow is None:
            raise WorkflowNotFound(name)
        return workflow

    def _require_accepting(self, name: str) -> None:
        with self._lock:
            if not self._accepting:
                raise NotStarted(name)

    def _watch(self, workflow: str, instance_id: str) -> Watch:
        # Caller holds _lock.
        key = (workflow, instance_id)
        watch = self._watches.get(key)
        if watch is None:
            watch = Watch(workflow, instance_id)
            self._watches[key] = watch
        return watch

    def _start_run(
        self,
        workflow: _Workflow,
        instance_id: str,
        fresh_input: tuple[Any] | None,
        *,
        claim: Claim = "resume",
    ) -> Watch:
        """Submit a run the user asked for, unless one is active; return its Watch.

        User calls need the engine accepting; runs that timers and signals
        start (``_wake``) only need it started: they go on while wait_all drains.
        """
        with self._lock:
            if not self._accepting:
                raise NotStarted(workflow.name)
            return self._submit(workflow, instance_id, fresh_input, claim)

    def _submit(
        self,
        workflow: _Workflow,
        instance_id: str,
        fresh_input: tuple[Any] | None,
        claim: Claim,
        snapshot: RunSnapshot | None = None,
    ) -> Watch:
        # Caller holds _lock and has checked that the engine is started.
        assert self._executor is not None
        active = self._active.get((workflow.name, instance_id))
        if active is not None:  # at most one run per instance
            return active.watch
        run = self._register(workflow, instance_id, fresh_input, claim, snapshot)
        self._executor.submit(self._execute, run)
        return run.watch

    def _register(
        self,
        workflow: _Workflow,
        instance_id: str,
        fresh_input: tuple[Any] | None,
        claim: Claim,
        snapshot: RunSnapshot | None,
    ) -> _Run:
        # Caller holds _lock and knows no run of the instance is active.
        watch = self._watch(workflow.name, instance_id)
        run = _Run(workflow, instance_id, watch, fresh_input, snapshot, claim=claim)
        self._active[(workflow.name, instance_id)] = run
        watch.begin()
        return run

    def _wake(self, name: str, instance_id: str, claim: Claim = "wake") -> None:
        """A key the instance may wait on completed (or its owner died): run it.

        Now, or when its active run here ends.
        """
        workflow = self._workflows.get(name)
        with self._lock:
            active = self._active.get((name, instance_id))
            if active is not None:
                active.rerun = claim == "wake"
            elif workflow is not None and self._phase == "started":
                self._submit(workflow, instance_id, None, claim)
            # Else another engine has the workflow, or this one stopped: the
            # instance stays suspended with its key completed, and the poll of
            # whichever engine runs it next picks it up.

    def _fire_due(self) -> tuple[int, float]:
        """Fire the timers due now; return how many, and the wall-clock time used."""
        with self._lock:
            self._firing += 1
        try:
            # Read here, not higher up: see TimerThread on freezegun and call depth.
            now = _clock.wall()
            fired = self._store.fire_due_timers(now, utcnow().isoformat())
            for name, instance_id, key in fired:
                log.info("timer fired: %s", key, extra=where(name, instance_id, key))
                self._wake(name, instance_id)
            return len(fired), now
        finally:
            with self._lock:
                self._firing -= 1
                if not self._firing and not self._active:
                    self._idle.notify_all()

    def _tick(self, *, poll: bool) -> float | None:
        """Fire due timers, and look at the store; return seconds to the next deadline."""
        _, now = self._fire_due()
        if now >= self._next_heartbeat:
            self._store.heartbeat(now)
            self._next_heartbeat = now + self._options.lease / 3
        if poll:
            ready, orphaned, cancelled = self._store.look_around(
                sorted(self._workflows), now, self._host
            )
            for name, instance_id in ready:
                self._wake(name, instance_id)
            if self._options.recover:
                for name, instance_id in orphaned:
                    log.warning(
                        "recovering an instance whose owner died",
                        extra=where(name, instance_id),
                    )
                    self._wake(name, instance_id, "recover")
            with self._lock:
                for key in cancelled:
                    run = self._active.get(key)
                    if run is not None:
                        run.cancel_requested = True
        deadline = self._store.next_deadline()
        return None if deadline is None else deadline - now

    def _execute(self, first: _Run) -> None:
        """Worker thread: run the workflow function and record how it ended.

        A run that ends at a wait whose key had already completed is followed
        by the next run of the instance on this same thread: no hand-off.
        """
        run: _Run | None = first
        while run is not None:
            state: WorkflowState
            try:
                state = self._run_workflow(run)
            except BaseException as exc:  # the store failed while recording the end
                log.exception(
                    "run could not be recorded",
                    extra=where(run.workflow.name, run.instance_id),
                )
                state = Failed(f"the run could not be recorded: {type(exc).__name__}: {exc}")
            run = self._ended(run, state)

    def _ended(self, run: _Run, state: WorkflowState) -> _Run | None:
        """Record that ``run`` ended in ``state``; return the run to go on with here, if any."""
        with self._lock:
            del self._active[(run.workflow.name, run.instance_id)]
            run.watch.finish(state)
            follow: _Run | None = None
            if run.go_on is not None and self._phase == "started":
                # What it suspended at was there already: go on, still claimed.
                follow = self._register(run.workflow, run.instance_id, None, "wake", run.go_on)
            elif run.rerun and isinstance(state, Suspended) and self._phase == "started":
                # A signal or timer arrived while it ran: go on right away.
                self._submit(run.workflow, run.instance_id, None, "wake")
            if not self._active and not self._firing:
                self._idle.notify_all()
        return follow

    def _run_workflow(self, run: _Run) -> WorkflowState:
        workflow, instance_id = run.workflow, run.instance_id
        name = workflow.name
        if run.fresh_input is not None:
            input_value, memo = run.fresh_input[0], {}
        else:
            snapshot = run.snapshot or self._store.begin_run(
                name, instance_id, now=utcnow().isoformat(), claim=run.claim
            )
            if snapshot is None:  # gone, or run by a live engine, or not waiting any more
                row = self._store.get_instance(name, instance_id)
                if row is None:
                    return Failed(str(InstanceNotFound(name, instance_id)))
                return state_of(row)
            memo = snapshot.steps
            try:
                input_value = decode_for(
                    name, instance_id, "input", snapshot.instance.input,
                    snapshot.instance.input_type, workflow.input_hint,
                )
            except SerializationError as exc:
                return self._fail(run, f"input failed: {type(exc).__name__}: {exc}")
        ctx = Context(
            workflow=name, instance_id=instance_id, input=input_value, store=self._store,
            memo=memo, publish=run.watch.publish,
            cancelled=lambda: run.cancel_requested, retry=self._options.retry,
            sleep=self._options.sleep,
        )
        log.info("running", extra=where(name, instance_id))
        try:
            value = workflow.fn(ctx, input_value) if workflow.takes_input else workflow.fn(ctx)
        except Suspension as suspension:
            return self._suspend(run, suspension)
        except (RunCancelled, LostInstance) as stop:
            # Cancelled (already recorded), or taken over by another engine:
            # nothing more to write but letting go of the instance.
            log.info(
                "run stopped: %s", "cancelled" if isinstance(stop, RunCancelled) else "lost",
                extra=where(name, instance_id),
            )
            return self._finish(run, Cancelled(), status="cancelled", message=None)
        except BaseException as exc:  # whatever else user code raises ends the run Failed
            failure = ctx._failure
            step = failure[0] if failure is not None and failure[1] is exc else None
            return self._fail(run, ctx._failure_message(exc), step)
        ctx._end_replay()
        try:
            text, tag, _ = store_form(name, instance_id, "output", value, workflow.output_hint)
        except SerializationError as exc:
            return self._fail(run, f"output failed: {type(exc).__name__}: {exc}")
        log.info("completed", extra=where(name, instance_id))
        return self._finish(
            run, Completed(), status="completed", message=None, output=(text, tag)
        )

    def _suspend(self, run: _Run, suspension: Suspension) -> WorkflowState:
        """Record the wait; if what it waits for is there already, go on in a new run."""
        at = where(run.workflow.name, run.instance_id, suspension.key)
        recorded = self._store.suspend(
            suspension.waiting, suspension.message, suspension.deadline, _clock.wall()
        )
        if recorded.outcome == "stopped":
            row = self._store.get_instance(run.workflow.name, run.instance_id)
            return Failed("the instance vanished") if row is None else state_of(row)
        if recorded.outcome == "ready":
            run.go_on = recorded.snapshot  # _execute starts the next run from it
            log.debug("went straight on past %s", suspension.key, extra=at)
        elif recorded.deadline is not None and self._timers is not None:
            self._timers.armed(recorded.deadline)
        log.info("suspended: %s", suspension.message, extra=at)
        return Suspended(suspension.message)

    def _finish(
        self,
        run: _Run,
        state: WorkflowState,
        *,
        status: StatusName,
        message: str | None,
        output: tuple[str, str | None] | None = None,
        waiting_for: str | None = None,
    ) -> WorkflowState:
        """Record how the run ended; if the instance is no longer ours, report what is stored."""
        recorded = self._store.finish(
            run.workflow.name, run.instance_id, status=status, message=message,
            output=output, waiting_for=waiting_for, now=utcnow().isoformat(),
        )
        if recorded:
            return state
        row = self._store.get_instance(run.workflow.name, run.instance_id)
        return Failed("the instance vanished") if row is None else state_of(row)

    def _fail(self, run: _Run, message: str, step: str | None = None) -> WorkflowState:
        log.info("failed: %s", message, extra=where(run.workflow.name, run.instance_id, step))
        return self._finish(run, Failed(message), status="failed", message=message)
