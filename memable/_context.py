"""What a workflow function sees of its run: ``Context`` and the step builder."""

from __future__ import annotations

import concurrent.futures
import threading
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any, ParamSpec, Protocol, TypeVar

import attrs

from ._control import EngineStopping, RunCancelled, Suspension
from ._errors import (
    DuplicateStepKey,
    EngineError,
    InvalidKey,
    SignalTimeout,
    StepTimeout,
    key_taken,
)
from ._options import Options
from ._records import StepKind
from ._retry import Retry
from ._serde import decode_for, return_hint, store_form
from ._states import InProgress, WorkflowState
from ._step import Step
from ._store import SETTLED, StepWrite, Store, StoredStep, utcnow
from ._validate import check_deadline, check_key, seconds_of

P = ParamSpec("P")
R = TypeVar("R")


#: Backoffs this long or longer end the run and wait as a durable timer.
DURABLE_BACKOFF = 1.0


class RunControl(Protocol):
    """What a Context sees of the run it belongs to (the runner's ``Run``)."""

    cancel_requested: bool
    interrupt: threading.Event
    #: Keys this engine stored signals for while the run was active.
    signalled: set[str]


class _NoRun:
    """The run of a Context made outside a runner (nothing cancels it)."""

    def __init__(self) -> None:
        self.cancel_requested = False
        self.interrupt = threading.Event()
        self.signalled: set[str] = set()


def traceback_of(exc: BaseException) -> str:
    """The traceback text of ``exc``, as stored with a failure."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


class Context:
    """The handle a workflow function gets for its run of one instance.

    A workflow is ``fn(ctx)`` or ``fn(ctx, input)``. Its steps go through
    ``ctx.step(key)``: the first run of a key executes the function and
    stores the result; every later run of the instance returns the stored
    result without calling it.

    >>> from memable import Context, Engine
    >>> def greet(ctx: Context, name: str) -> str:
    ...     ctx.set_status("greeting")
    ...     return ctx.step("greeting:v1").run(lambda: f"hello {name}")
    >>> engine = Engine.in_memory()
    >>> engine.register("greet", greet)
    >>> with engine:
    ...     engine.invoke("greet", "world").result()
    'hello world'
    """

    # A Context belongs to the one thread that runs its workflow function;
    # nothing in it is shared, so nothing in it is locked.

    def __init__(
        self,
        *,
        workflow: str,
        instance_id: str,
        input: Any,
        store: Store,
        memo: dict[str, StoredStep],
        publish: Callable[[WorkflowState], None],
        run: RunControl | None = None,
        options: Options | None = None,
        flight_lock: threading.Lock | None = None,
    ) -> None:
        options = options or Options()
        self._workflow = workflow
        self._instance_id = instance_id
        self._input = input
        self._store = store
        self._memo = memo
        self._publish = publish
        self._run = run or _NoRun()
        self._retry: Retry | None = options.retry
        self._sleep = options.sleep
        self._clock = options.clock
        self._seen: set[str] = set()
        # The key of the step whose function is running now, and since when
        # (for signals, and what an operator sees).
        self._in_flight: str | None = None
        self._in_flight_since = ""
        # Held while _in_flight is set: Engine.signal holds it (the runner's
        # lock) from its look at _in_flight until the signal is stored.
        self._flight_lock = flight_lock or threading.Lock()
        # Attempts that timed out and may still run, by key: the next attempt
        # waits for them (never two attempts of one step at once).
        self._abandoned: dict[str, concurrent.futures.Future[Any]] = {}
        self._next_seq = max((s.seq for s in memo.values()), default=-1) + 1
        # Replaying while the run reaches stored keys; live from the start if none.
        self._replaying = bool(memo)
        self._status: str | None = None
        # The key, exception and attempts of the step that failed last, for Failed.
        self._failure: tuple[str, BaseException, int | None] | None = None

    def __repr__(self) -> str:
        return f"<Context workflow={self._workflow!r} instance_id={self._instance_id!r}>"

    @property
    def workflow_name(self) -> str:
        """The name the workflow was registered under.

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.register("named", lambda ctx: ctx.workflow_name)
        >>> with engine:
        ...     engine.invoke("named").result()
        'named'
        """
        return self._workflow

    @property
    def instance_id(self) -> str:
        """The id of the instance this run belongs to.

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", lambda ctx: ctx.instance_id)
        >>> with engine:
        ...     engine.invoke("wf", instance_id="order-1").result()
        'order-1'
        """
        return self._instance_id

    @property
    def input(self) -> Any:
        """The instance's stored input (None when it was invoked without one).

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> def double(ctx, n: int) -> int:
        ...     return ctx.input * 2
        >>> engine.register("double", double)
        >>> with engine:
        ...     engine.invoke("double", 21).result()
        42
        """
        return self._input

    def set_status(self, message: str) -> None:
        """Publish ``InProgress(message)`` and store it with the next completed step.

        While the run replays stored steps the status is set silently; the
        current status is published once when replay ends.

        >>> from memable import Engine, InProgress
        >>> def wf(ctx):
        ...     ctx.set_status("loading")
        ...     ctx.step("load:v1").run(lambda: 1)
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", wf)
        >>> with engine:
        ...     inv = engine.invoke("wf")
        ...     _ = inv.wait()
        ...     engine.steps("wf", inv.instance_id)[0].status
        'loading'
        """
        if not isinstance(message, str):
            raise TypeError(f"set_status takes a str, not {type(message).__name__}")
        self._status = message
        if not self._replaying:
            # Stored now, so an operator sees it while the step after it runs.
            self._store.set_status(self._workflow, self._instance_id, message)
            self._publish(InProgress(message))

    def step(self, key: str) -> Step:
        """Start building the step stored under ``key``; finish with ``.run(fn)``.

        Keys are non-empty ``str`` unique within the instance; keys starting
        with ``_`` are reserved. Version keys (``"charge:v2"``) when a step's
        meaning changes, so old stored results are not reused for it.

        >>> from memable import Engine
        >>> def wf(ctx) -> int:
        ...     return ctx.step("answer:v1").returns(int).run(lambda: 42)
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", wf)
        >>> with engine:
        ...     engine.invoke("wf").result()
        42
        """
        return Step(self, check_key(key, self._workflow, self._instance_id))

    def suspend(
        self,
        key: str,
        status: str | None = None,
        returns: Any = None,
        timeout: float | timedelta | None = None,
    ) -> Any:
        """Return the payload signalled to ``key``; until there is one, suspend the instance.

        Suspending ends the run ``Suspended(status)`` (``Suspended(key)``
        without a status) and frees its worker thread;
        ``engine.signal(name, id, key, payload)`` stores the payload and runs
        the instance again, and this call then returns it, rebuilt as
        ``returns`` if given. A signal sent while the instance is still busy
        before this point is kept for when it gets here.

        With ``timeout`` (seconds or a timedelta) the first run to reach the
        key stores a deadline, fired like a timer; if no signal came by then,
        the key is recorded ``"timed_out"`` and this call raises
        ``SignalTimeout`` (in this run and every replay), which the workflow
        may catch. A signal that arrives first wins and drops the deadline;
        one that comes after it is rejected.

        >>> from memable import Engine, Suspended
        >>> def approval(ctx) -> str:
        ...     approved = ctx.suspend("approval:v1", status="waiting for a manager")
        ...     return "shipped" if approved else "cancelled"
        >>> engine = Engine.in_memory()
        >>> engine.register("approval", approval)
        >>> with engine:
        ...     inv = engine.invoke("approval")
        ...     print(inv.wait())
        ...     print(engine.signal("approval", inv.instance_id, "approval:v1", True).result())
        suspended: waiting for a manager
        shipped
        """
        key = check_key(key, self._workflow, self._instance_id)
        deadline = None
        if timeout is not None:
            seconds = seconds_of(timeout, "suspend timeout")
            deadline = check_deadline(self._clock.wall() + seconds, "suspend timeout", timeout)
        self._boundary()
        self._claim(key)
        stored = self._arrived(key, "signal")
        if stored is not None and stored.state == "completed":
            return self._replayed(key, stored, returns)
        if stored is not None and stored.state == "timed_out":
            exc = SignalTimeout(self._workflow, self._instance_id, key)
            self._failure = (key, exc, None)
            raise exc
        # A signal (or the deadline) that arrives after this look is found by
        # the transaction that records the suspension, which then runs the
        # instance again.
        self._end_replay()
        message = key if status is None else status
        raise Suspension(key, message, self._waiting(key, "signal", stored), deadline)

    def timer(self, key: str, duration: float | timedelta) -> None:
        """Wait ``duration`` (seconds or a timedelta) durably: return once the timer has fired.

        The first time the instance reaches ``key`` the deadline (now +
        duration, wall clock) is stored and the run ends
        ``Suspended("timer <key>")``, freeing its worker thread; the engine's
        timer thread runs the instance again when it is due. Later runs do
        not move the deadline.

        >>> from datetime import timedelta
        >>> from memable import Engine
        >>> def reminder(ctx) -> str:
        ...     ctx.timer("cool-off:v1", timedelta(hours=1))
        ...     return "reminded"
        >>> engine = Engine.in_memory()
        >>> engine.register("reminder", reminder)
        >>> with engine:
        ...     inv = engine.invoke("reminder")
        ...     print(inv.wait())
        ...     print(engine.get_metadata("reminder", inv.instance_id).status)
        suspended: timer cool-off:v1
        MetadataStatus.Suspended(message='timer cool-off:v1')
        """
        key = check_key(key, self._workflow, self._instance_id)
        seconds = seconds_of(duration, "timer duration")
        deadline = check_deadline(self._clock.wall() + seconds, "timer duration", duration)
        self._boundary()
        self._claim(key)
        # A due timer needs no second look: recording it fires it at once.
        stored = self._arrived(key, "timer", reread=seconds > 0)
        if stored is not None and stored.state == "completed":
            self._replayed(key, stored, None)
            return
        self._end_replay()
        waiting = self._waiting(key, "timer", stored)
        raise Suspension(key, f"timer {key}", waiting, deadline)

    # ------------------------------------------------------------------ engine side

    def _end_replay(self) -> None:
        """Leave replay: from now on statuses are live; publish the current one once."""
        if self._replaying:
            self._replaying = False
            if self._status is not None:
                self._publish(InProgress(self._status))

    def _failure_message(self, exc: BaseException) -> str:
        """The Failed message for ``exc`` escaping the workflow: step key and error."""
        error = f"{type(exc).__name__}: {exc}"
        if self._failure is not None and self._failure[1] is exc:
            key, _, attempts = self._failure
            plural = "" if attempts == 1 else "s"
            after = "" if attempts is None else f" after {attempts} attempt{plural}"
            return f"step {key!r} failed{after}: {error}"
        return f"workflow raised {error}"

    def _claim(self, key: str) -> None:
        if key in self._seen:
            exc = DuplicateStepKey(self._workflow, self._instance_id, key)
            self._failure = (key, exc, None)
            raise exc
        self._seen.add(key)

    def _run_step(
        self, step: Step, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        key = step.key
        self._boundary()
        self._claim(key)
        stored = self._memo.get(key)
        if stored is not None and stored.kind != "step":
            self._refuse_kind(key, stored.kind, "step")
        hint = step.result_type if step.result_type is not None else return_hint(fn)
        if stored is not None and stored.state == "completed":
            return self._replayed(key, stored, hint)
        self._end_replay()
        seq = stored.seq if stored is not None else self._take_seq()
        policy = step.retry_policy if step.retry_policy is not None else self._retry
        # A step waiting out a retry backoff goes on counting its attempts.
        waited = stored is not None and stored.state == "waiting"
        attempt = int(stored.result or 0) if stored is not None and waited else 0
        while True:
            attempt += 1
            started = utcnow().isoformat()
            with self._flight_lock:  # against a signal to the key (Engine.signal)
                self._in_flight, self._in_flight_since = key, started
            try:
                self._boundary_before(key)
                if self._abandoned:
                    self._await_abandoned(key, step.timeout_seconds)
            except BaseException:
                self._in_flight = None
                raise
            try:
                if step.timeout_seconds is None:
                    result = fn(*args, **kwargs)
                else:
                    result = self._call_with_timeout(key, step.timeout_seconds, fn, args, kwargs)
                text, tag, value = store_form(
                    self._workflow, self._instance_id, key, result, hint
                )
            except Exception as exc:
                self._in_flight = None
                self._store.save_step(self._write(key, seq, "failed", error=exc, started=started))
                if policy is not None and policy.should_retry(attempt, exc):
                    self._back_off(key, seq, attempt, policy.delay(attempt))
                    continue
                self._failure = (key, exc, None if policy is None else attempt)
                raise
            finally:
                self._in_flight = None
            try:
                done = self._write(key, seq, "completed", result=(text, tag), started=started)
                self._store.save_step(done)
            except InvalidKey as exc:  # a signal took the key while the step ran
                self._failure = (key, exc, None)
                raise
            return value

    def _await_abandoned(self, key: str, timeout: float | None) -> None:
        """Wait for an abandoned attempt of ``key`` before the next one starts.

        An attempt that timed out may still be running: the next one waits
        for it, up to the step's timeout again, and past that the step fails
        without another attempt.
        """
        previous = self._abandoned.pop(key, None)
        if previous is None or timeout is None:
            return
        done, _ = concurrent.futures.wait([previous], timeout=timeout)
        if not done:
            exc = StepTimeout(self._workflow, self._instance_id, key, timeout)
            exc.args = (
                f"{exc}; the attempt that timed out is still running, so no other starts",
            )
            self._failure = (key, exc, None)
            raise exc

    def _back_off(self, key: str, seq: int, attempt: int, delay: float) -> None:
        """Wait ``delay`` seconds before the next attempt of ``key``.

        A long backoff ends the run: the step waits as a durable timer and the
        run holds no thread. A short one waits on the worker, and a cancel or
        the engine stopping ends the wait at once.
        """
        self._boundary()
        if self._sleep is not None:  # a test's fake: every backoff goes through it
            self._sleep(delay)
            return
        waiting = attrs.evolve(
            self._write(key, seq, "waiting"), result=str(attempt)
        )
        deadline = self._clock.wall() + delay
        if delay >= DURABLE_BACKOFF:
            raise Suspension(key, f"retry {key}", waiting, deadline)
        if self._run.interrupt.wait(delay):
            self._boundary()  # cancelled: stop here
            raise EngineStopping(waiting, deadline)

    def _refuse_kind(self, key: str, stored: str, used: str) -> None:
        exc = key_taken(self._workflow, self._instance_id, key, stored, used)
        self._failure = (key, exc, None)
        raise exc

    def _arrived(self, key: str, kind: StepKind, reread: bool = True) -> StoredStep | None:
        """The stored row of a suspend point or timer, read again if it was not complete.

        A signal or timer may have completed it since this run read its steps;
        a read is much cheaper than suspending and running again (unless the
        wait cannot last: ``reread`` False). A row of another kind (a signal
        stored early for a timer's key) fails the run.
        """
        stored = self._memo.get(key)
        if reread and (stored is None or stored.state not in SETTLED):
            stored = self._store.read_step(self._workflow, self._instance_id, key) or stored
        if stored is not None and stored.kind != kind:
            self._refuse_kind(key, stored.kind, kind)
        return stored

    def _boundary(self) -> None:
        """Between steps: stop here if the instance was cancelled.

        The flag is set by a cancel in this engine and by the poll for one
        from elsewhere.
        """
        if self._run.cancel_requested:
            raise RunCancelled()

    def _boundary_before(self, key: str) -> None:
        """Before step ``key`` executes (already marked in flight): the boundary, and more.

        Also read the instance's status (the store may answer unread while
        nothing can have changed it), so a cancel from another process stops
        the run before the step starts; and refuse the key if this engine
        stored a signal for it since the run read its steps.
        """
        run = self._run
        if run.cancel_requested:
            raise RunCancelled()
        if key in run.signalled:
            self._refuse_kind(key, "signal", "step")
        if self._store.check_run(self._workflow, self._instance_id) == "cancelled":
            run.cancel_requested = True
            raise RunCancelled()

    def _replayed(self, key: str, stored: StoredStep, hint: Any) -> Any:
        if stored.status is not None:
            self._status = stored.status  # restored silently, like the replayed set_status
        try:
            return decode_for(
                self._workflow, self._instance_id, key, stored.result or "null",
                stored.result_type, hint,
            )
        except EngineError as exc:
            self._failure = (key, exc, None)
            raise

    def _call_with_timeout(
        self,
        key: str,
        seconds: float,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        # A thread of its own per call: a function past its timeout cannot be
        # killed, so it must not hold a pooled thread or block interpreter
        # exit. It is a daemon, finishes on its own, and its late result goes
        # nowhere: only this thread stores, and it has stopped waiting.
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def call() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(
            target=call,
            name=f"memable-step {self._workflow}/{self._instance_id}/{key}",
            daemon=True,
        ).start()
        try:
            return future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            self._abandoned[key] = future
            raise StepTimeout(self._workflow, self._instance_id, key, seconds) from None

    def _waiting(self, key: str, kind: StepKind, stored: StoredStep | None) -> StepWrite:
        seq = stored.seq if stored is not None else self._take_seq()
        write = self._write(key, seq, "waiting")
        return attrs.evolve(write, kind=kind)

    def _take_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def _write(
        self,
        key: str,
        seq: int,
        state: str,
        *,
        result: tuple[str, str | None] | None = None,
        error: BaseException | None = None,
        started: str | None = None,
    ) -> StepWrite:
        text, tag = result if result is not None else (None, None)
        return StepWrite(
            workflow=self._workflow,
            instance_id=self._instance_id,
            key=key,
            seq=seq,
            kind="step",
            state=state,  # type: ignore[arg-type]
            result=text,
            result_type=tag,
            status=self._status,
            error=None if error is None else f"{type(error).__name__}: {error}",
            at=utcnow().isoformat(),
            started=started,
            traceback=None if error is None else traceback_of(error),
        )
