"""The attempts of one step key: its function, timeout, retries, backoffs and stored outcomes.

``Attempts`` belongs to one run (one ``Context``). Several threads of that run may use it at once
(``ctx.step(key).map``), each for keys of its own; what they share is locked where declared."""

from __future__ import annotations

import concurrent.futures
import threading
import traceback
from collections.abc import Callable
from typing import Any, Protocol

import attrs

from .._clock import Clock
from .._errors import InvalidKey, StepTimeout, key_taken
from .._observe.base import RunTrace, Telemetry
from .._retry import Retry
from .._store.control import RunCancelled
from .._store.protocol import RunStore
from .._store.rows import StepWrite, StoredStep
from .._store.serde import store_form
from .control import EngineStopping, Suspension

#: Backoffs this long or longer end the run and wait as a durable timer.
DURABLE_BACKOFF = 1.0

#: How a failure is noted for the run's Failed message: (key, exception, attempts).
Note = Callable[[str, BaseException, "int | None"], None]


class RunControl(Protocol):
    """What the steps of a run see of it (the runner's ``Run``)."""

    cancel_requested: bool
    interrupt: threading.Event
    #: Keys this engine stored signals for while the run was active.
    signalled: set[str]


class NoRun:
    """The run of a Context made outside a runner (nothing cancels it)."""

    def __init__(self) -> None:
        self.cancel_requested = False
        self.interrupt = threading.Event()
        self.signalled: set[str] = set()


def traceback_of(exc: BaseException) -> str:
    """The traceback text of ``exc``, as stored with a failure."""
    return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))


class Attempts:
    """Runs the attempts of a run's step keys and stores each outcome.

    >>> from memable._sqlite.store import SQLiteStore
    >>> from memable._clock import Clock
    >>> store = SQLiteStore(None, "full")
    >>> attempts = Attempts(workflow="wf", instance_id="i-1", store=store, run=NoRun(),
    ...                     clock=Clock(), sleep=None)
    >>> attempts.write("k", 0, "failed", None, error=ValueError("no")).error
    'ValueError: no'
    >>> store.close()
    """

    def __init__(
        self, *, workflow: str, instance_id: str, store: RunStore, run: RunControl, clock: Clock,
        sleep: Callable[[float], None] | None, flight_lock: threading.Lock | None = None,
        trace: RunTrace | None = None, telemetry: Telemetry | None = None,
    ) -> None:
        #: The run's span (each executed attempt is a child span), and where metrics go.
        self.trace = trace or RunTrace()
        self.telemetry = telemetry or Telemetry()
        self.workflow = workflow
        self.instance_id = instance_id
        self.store = store
        self.run = run
        self._clock = clock
        self._sleep = sleep
        # flight_lock guards in_flight: the runner's lock (``Registry.lock``), which Engine.signal
        # holds from its look at in_flight until the signal is stored.
        self.flight_lock = flight_lock or threading.Lock()
        #: The keys whose function runs now, and since when (epoch seconds, UTC).
        self.in_flight: dict[str, float] = {}
        # _lock guards _abandoned: attempts that timed out and may still run, by
        # key; the key's next attempt waits for them (never two at once).
        self._lock = threading.Lock()
        self._abandoned: dict[str, concurrent.futures.Future[Any]] = {}

    def in_flight_now(self) -> tuple[str, float] | None:
        """The key in flight longest and since when, or None; the caller holds flight_lock."""
        if not self.in_flight:
            return None
        key = min(self.in_flight, key=lambda k: self.in_flight[k])
        return key, self.in_flight[key]

    def boundary(self) -> None:
        """Between steps: stop here if the instance was cancelled (here, or found by the poll)."""
        if self.run.cancel_requested:
            raise RunCancelled()

    def execute(
        self, key: str, seq: int, stored: StoredStep | None, *, hint: Any, policy: Retry | None,
        timeout: float | None, call: Callable[[], Any], status: str | None, note: Note,
    ) -> Any:
        """Run ``call`` for ``key`` until it succeeds or its retries end; return its value. Each
        outcome is stored before the next attempt; the error that ends the retries is noted."""
        # A step waiting out a retry backoff goes on counting its attempts.
        waited = stored is not None and stored.state == "waiting"
        attempt = int(stored.result or 0) if stored is not None and waited else 0
        while True:
            attempt += 1
            started = self._clock.wall()
            with self.flight_lock:  # against a signal to the key (Engine.signal)
                self.in_flight[key] = started
            try:
                self._before(key, note)
                self._await_abandoned(key, timeout, note)
            except BaseException:
                self._landed(key)
                raise
            span, began = self.trace.step(key, attempt), self._clock.monotonic()
            try:
                result = call() if timeout is None else self._with_timeout(key, timeout, call)
                text, tag, value = store_form(self.workflow, self.instance_id, key, result, hint)
            except Exception as exc:
                self._landed(key)
                span.failed(exc)
                span.end()
                self.telemetry.step_ended(
                    self.workflow, "timed_out" if isinstance(exc, StepTimeout) else "failed",
                    self._clock.monotonic() - began)
                self.store.save_step(self.write(key, seq, "failed", status, error=exc,
                                                started=started))
                if policy is not None and policy.should_retry(attempt, exc):
                    self.telemetry.step_retried(self.workflow)
                    self._back_off(key, seq, attempt, policy.delay(attempt), status)
                    continue
                note(key, exc, None if policy is None else attempt)
                raise
            except BaseException:  # the run is unwound (cancelled, say): the span ends
                span.end()
                raise
            finally:
                self._landed(key)
            span.end()
            self.telemetry.step_ended(self.workflow, "completed", self._clock.monotonic() - began)
            try:
                done = self.write(key, seq, "completed", status, result=(text, tag),
                                  started=started)
                self.store.save_step(done)
            except InvalidKey as exc:  # a signal took the key while the step ran
                note(key, exc, None)
                raise
            return value

    def _landed(self, key: str) -> None:
        """``key``'s function is not running any more (or never started)."""
        with self.flight_lock:
            self.in_flight.pop(key, None)

    def _before(self, key: str, note: Note) -> None:
        """Before ``key`` executes (marked in flight): stop if the instance was cancelled, here or
        in another process; refuse the key if this engine stored a signal for it since the run
        read its steps."""
        run = self.run
        if run.cancel_requested:
            raise RunCancelled()
        if key in run.signalled:
            self.refuse_kind(key, "signal", "step", note)
        if self.store.check_run(self.workflow, self.instance_id) == "cancelled":
            run.cancel_requested = True
            raise RunCancelled()

    def refuse_kind(self, key: str, stored: str, used: str, note: Note) -> None:
        """Fail the run at ``key``: it is stored as another kind than the workflow uses."""
        exc = key_taken(self.workflow, self.instance_id, key, stored, used)
        note(key, exc, None)
        raise exc

    def _await_abandoned(self, key: str, timeout: float | None, note: Note) -> None:
        """Wait for an attempt of ``key`` that timed out and may still run, up to the step's
        timeout again; past that the step fails without another attempt."""
        with self._lock:
            previous = self._abandoned.pop(key, None)
        if previous is None or timeout is None:
            return
        done, _ = concurrent.futures.wait([previous], timeout=timeout)
        if not done:
            exc = StepTimeout(self.workflow, self.instance_id, key, timeout)
            exc.args = (f"{exc}; the attempt that timed out is still running, so no other starts",)
            note(key, exc, None)
            raise exc

    def _back_off(
        self, key: str, seq: int, attempt: int, delay: float, status: str | None
    ) -> None:
        """Wait ``delay`` seconds before the next attempt of ``key``: a long backoff as a durable
        timer, a short one on the thread (a cancel or the engine stopping ends it at once)."""
        self.boundary()
        if self._sleep is not None:  # a test's fake: every backoff goes through it
            self._sleep(delay)
            return
        waiting = attrs.evolve(self.write(key, seq, "waiting", status), result=str(attempt))
        deadline = self._clock.wall() + delay
        if delay >= DURABLE_BACKOFF:
            raise Suspension(key, f"retry {key}", waiting, deadline)
        if self.run.interrupt.wait(delay):
            self.boundary()  # cancelled: stop here
            raise EngineStopping(waiting, deadline)

    def _with_timeout(self, key: str, seconds: float, call: Callable[[], Any]) -> Any:
        # A daemon thread of its own per call: a function past its timeout cannot be killed, so
        # it must not hold a pooled thread or block interpreter exit. Its late result goes
        # nowhere: only the waiting thread stores, and it has stopped waiting.
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()

        def attempt() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                future.set_result(call())
            except BaseException as exc:
                future.set_exception(exc)

        threading.Thread(target=attempt,
            name=f"memable-step {self.workflow}/{self.instance_id}/{key}", daemon=True).start()
        try:
            return future.result(timeout=seconds)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self._abandoned[key] = future
            raise StepTimeout(self.workflow, self.instance_id, key, seconds) from None

    def write(
        self, key: str, seq: int, state: str, status: str | None, *,
        result: tuple[str, str | None] | None = None, error: BaseException | None = None,
        started: float | None = None,
    ) -> StepWrite:
        """The row to store for ``key`` in ``state`` (kind "step"; evolve it for another)."""
        text, tag = result if result is not None else (None, None)
        return StepWrite(
            workflow=self.workflow, instance_id=self.instance_id, key=key, seq=seq, kind="step",
            state=state,  # type: ignore[arg-type]
            result=text, result_type=tag, status=status,
            error=None if error is None else f"{type(error).__name__}: {error}",
            at=self._clock.wall(), started=started,
            traceback=None if error is None else traceback_of(error))
