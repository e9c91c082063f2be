"""Retry policies: backoff math, the retry loop, permanent errors and the attempt count.

Every engine here gets a fake ``sleep`` that records the backoff delays, so
no test waits for real backoff, except in the section "real backoffs": there
cancel() and stop() cut short backoffs of under a second, a longer one is a
durable timer, and timed-out attempts never overlap.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import timedelta

import attrs
import pytest
from helpers import PATIENCE, clocked_engine, final_state, shared_store_only, until

from memable import (
    Cancelled,
    Completed,
    Context,
    Engine,
    Failed,
    MetadataStatus,
    Retry,
    StepError,
    StepRecord,
    Suspended,
)


class Flaky:
    """A step function that raises ``errors[n]`` on call n, then returns ``"ok"``."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.calls <= len(self.errors):
            raise self.errors[self.calls - 1]
        return "ok"


def only_step(engine: Engine, name: str, instance_id: str) -> StepRecord:
    """The single StepRecord of an instance."""
    [record] = engine.steps(name, instance_id)
    return record


# ---------------------------------------------------------------------- Retry as a value


def test_defaults_are_the_documented_ones() -> None:
    """Retry() has max_attempts 3, delays 0.1 to 30 s, multiplier 2 and jitter on."""
    policy = Retry()
    assert (
        policy.max_attempts, policy.initial_delay, policy.max_delay, policy.multiplier,
        policy.jitter,
    ) == (3, 0.1, 30.0, 2.0, True)


def test_delay_without_jitter_grows_exponentially_up_to_max_delay() -> None:
    """Without jitter the delay after attempt n is initial * multiplier**(n-1), capped."""
    policy = Retry(initial_delay=1.0, multiplier=2.0, max_delay=5.0, jitter=False)
    assert [policy.delay(n) for n in (1, 2, 3, 4, 5)] == [1.0, 2.0, 4.0, 5.0, 5.0]


def test_delay_without_jitter_never_draws() -> None:
    """With jitter off the draw function is not called at all."""
    draws: list[tuple[float, float]] = []

    def draw(low: float, high: float) -> float:
        draws.append((low, high))
        return 0.0

    assert Retry(initial_delay=0.5, jitter=False).delay(2, draw) == 1.0
    assert draws == []


def test_delay_with_jitter_draws_between_zero_and_the_capped_delay() -> None:
    """With jitter, draw(0, base) is called once per delay and its value is the delay."""
    draws: list[tuple[float, float]] = []

    def draw(low: float, high: float) -> float:
        draws.append((low, high))
        return 0.25

    policy = Retry(initial_delay=1.0, multiplier=3.0, max_delay=5.0, jitter=True)
    assert policy.delay(2, draw) == 0.25
    assert policy.delay(3, draw) == 0.25
    assert draws == [(0.0, 3.0), (0.0, 5.0)]


def test_delay_with_the_default_draw_stays_within_zero_and_base() -> None:
    """The default draw keeps every jittered delay inside [0, base]."""
    policy = Retry(initial_delay=2.0, multiplier=2.0, max_delay=3.0)
    delays = [policy.delay(n) for n in (1, 2, 3) for _ in range(200)]
    assert all(0.0 <= d <= 2.0 for d in delays[:200])
    assert all(0.0 <= d <= 3.0 for d in delays[200:])


def test_should_retry_is_true_below_max_attempts_and_false_at_it() -> None:
    """should_retry(max_attempts - 1) is True and should_retry(max_attempts) is False."""
    policy = Retry(max_attempts=3)
    error = ConnectionError("reset")
    assert [policy.should_retry(n, error) for n in (1, 2, 3, 4)] == [True, True, False, False]


def test_should_retry_with_one_attempt_never_retries() -> None:
    """max_attempts=1 means the first failure is the last."""
    assert Retry(max_attempts=1).should_retry(1, ConnectionError("reset")) is False


def test_should_retry_refuses_permanent_and_takes_retryable_step_errors() -> None:
    """StepError.permanent is never retried; StepError.retryable is, like any error."""
    policy = Retry(max_attempts=5)
    assert policy.should_retry(1, StepError.permanent("card declined")) is False
    assert policy.should_retry(1, StepError.retryable("connection reset")) is True


@pytest.mark.parametrize(
    "options",
    [
        {"max_attempts": 0},
        {"max_attempts": -1},
        {"max_attempts": 2.5},
        {"initial_delay": -0.1},
        {"max_delay": -1.0},
        {"multiplier": -2.0},
        {"initial_delay": float("nan")},
        {"max_delay": float("inf")},
        {"max_attempts": True},
    ],
)
def test_invalid_policies_raise_value_error(options: dict[str, float]) -> None:
    """Bad max_attempts (0, negative, fractional, bool), negative/NaN/inf delays: ValueError."""
    with pytest.raises(ValueError, match=f"Retry.{next(iter(options))}"):
        Retry(**options)  # type: ignore[arg-type]


def test_construction_is_keyword_only() -> None:
    """Retry(3) is refused: every field is passed by keyword."""
    with pytest.raises(TypeError):
        Retry(3)  # type: ignore[misc]


def test_policies_are_equal_by_value_and_hashable() -> None:
    """Two Retry with the same fields are equal and hash alike; another field differs."""
    assert Retry(max_attempts=4, jitter=False) == Retry(max_attempts=4, jitter=False)
    assert hash(Retry(max_attempts=4)) == hash(Retry(max_attempts=4))
    assert Retry(max_attempts=4) != Retry(max_attempts=5)


def test_policies_are_frozen() -> None:
    """Assigning a field of a Retry raises FrozenInstanceError."""
    policy = Retry()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        policy.max_attempts = 10  # type: ignore[misc]
    assert policy.max_attempts == 3


def test_retry_delays_take_a_timedelta() -> None:
    """Retry(initial_delay=..., max_delay=...) take a timedelta."""
    policy = Retry(
        initial_delay=timedelta(seconds=2), max_delay=timedelta(minutes=1), jitter=False
    )
    assert policy.delay(1) == 2.0
    assert policy.delay(10) == 60.0


# ---------------------------------------------------------------------- the retry loop


def test_a_step_failing_twice_then_succeeding_completes(
    make_engine: Callable[..., Engine],
) -> None:
    """Two failures then a success under max_attempts=3: completed after exactly 3 calls."""
    slept: list[float] = []
    engine = make_engine(sleep=slept.append)
    fn = Flaky(ConnectionError("reset 1"), ConnectionError("reset 2"))
    policy = Retry(max_attempts=3, initial_delay=1, multiplier=2, jitter=False)

    def wf(ctx: Context) -> str:
        return ctx.step("call:v1").retry(policy).run(fn)

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf", instance_id="job-1")
        assert inv.result(timeout=10) == "ok"
        assert inv.wait(timeout=10) == Completed()
        record = only_step(engine, "wf", "job-1")
    assert fn.calls == 3
    assert slept == [1.0, 2.0]
    # The completed write clears the error of the failed attempts before it.
    assert (record.state, record.result, record.error, record.attempts) == (
        "completed", "ok", None, 3,
    )


def test_a_step_failing_every_time_fails_the_run_after_max_attempts(
    make_engine: Callable[..., Engine],
) -> None:
    """Three failures under max_attempts=3: Failed naming key, attempt count and last error."""
    slept: list[float] = []
    engine = make_engine(sleep=slept.append)
    fn = Flaky(*(ConnectionError(f"reset {n}") for n in (1, 2, 3, 4)))
    policy = Retry(max_attempts=3, initial_delay=1, multiplier=2, jitter=False)

    def wf(ctx: Context) -> str:
        return ctx.step("call:v1").retry(policy).run(fn)

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf", instance_id="job-1").wait(timeout=10)
        record = only_step(engine, "wf", "job-1")
    assert state == Failed("step 'call:v1' failed after 3 attempts: ConnectionError: reset 3")
    assert fn.calls == 3
    assert slept == [1.0, 2.0]
    assert (record.state, record.result, record.error, record.attempts) == (
        "failed", None, "ConnectionError: reset 3", 3,
    )


def test_a_permanent_step_error_is_not_retried(make_engine: Callable[..., Engine]) -> None:
    """StepError.permanent under a policy fails at once: one call, no sleep, 1 attempt."""
    slept: list[float] = []
    engine = make_engine(sleep=slept.append)
    fn = Flaky(StepError.permanent("card declined"))

    def wf(ctx: Context) -> str:
        return ctx.step("charge:v1").retry(Retry(max_attempts=5, jitter=False)).run(fn)

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf", instance_id="job-1").wait(timeout=10)
        record = only_step(engine, "wf", "job-1")
    assert state == Failed("step 'charge:v1' failed after 1 attempt: StepError: card declined")
    assert fn.calls == 1
    assert slept == []
    assert (record.state, record.error, record.attempts) == (
        "failed", "StepError: card declined", 1,
    )


class Connection:
    """A plain object: neither JSON, nor an attrs class, nor a dataclass."""


def test_a_result_that_cannot_be_stored_is_not_retried(
    make_engine: Callable[..., Engine],
) -> None:
    """A step whose result is unstorable fails at once under any policy: its side effect
    ran once, and the Failed message says how to make the value storable."""
    slept: list[float] = []
    engine = make_engine(sleep=slept.append, retry=Retry(max_attempts=4, jitter=False))
    effects: list[str] = []

    def connect() -> Connection:
        effects.append("charged")
        return Connection()

    def wf(ctx: Context) -> None:
        ctx.step("charge:v1").retry(Retry(max_attempts=3, jitter=False)).run(connect)

    def by_default(ctx: Context) -> None:  # under the engine's policy
        ctx.step("charge:v1").run(connect)

    engine.register("wf", wf)
    engine.register("by-default", by_default)
    with engine:
        state = engine.invoke("wf", instance_id="job-1").wait(timeout=10)
        record = only_step(engine, "wf", "job-1")
        assert effects == ["charged"]
        other = engine.invoke("by-default", instance_id="job-2").wait(timeout=10)
        assert effects == ["charged", "charged"]
        assert isinstance(other, Failed)
        assert "after 1 attempt: SerializationError" in other.message
    assert slept == []
    assert isinstance(state, Failed)
    assert state.message.startswith(
        "step 'charge:v1' failed after 1 attempt: SerializationError: cannot store a value "
        "of type Connection ("
    )
    assert ("make it an attrs class or a dataclass, or plain JSON types (dict, list, str, int, "
            "float, bool, None), and name its type with .returns(T)") in state.message
    assert (record.state, record.attempts) == ("failed", 1)
    assert record.error is not None
    assert record.error.startswith("SerializationError: ")


def test_a_retryable_step_error_is_retried(make_engine: Callable[..., Engine]) -> None:
    """StepError.retryable is retried like any other error, and the step completes."""
    slept: list[float] = []
    engine = make_engine(sleep=slept.append)
    fn = Flaky(StepError.retryable("busy"), StepError.retryable("busy"))
    policy = Retry(max_attempts=3, initial_delay=0.5, multiplier=3, jitter=False)

    def wf(ctx: Context) -> str:
        return ctx.step("call:v1").retry(policy).run(fn)

    engine.register("wf", wf)
    with engine:
        assert engine.invoke("wf").result(timeout=10) == "ok"
    assert fn.calls == 3
    assert slept == [0.5, 1.5]


def test_jittered_backoff_sleeps_within_the_delay(make_engine: Callable[..., Engine]) -> None:
    """With jitter on, each slept delay lies in [0, the un-jittered delay]."""
    slept: list[float] = []
    engine = make_engine(sleep=slept.append)
    fn = Flaky(ConnectionError("a"), ConnectionError("b"))
    policy = Retry(max_attempts=3, initial_delay=1.0, multiplier=2.0)

    def wf(ctx: Context) -> str:
        return ctx.step("call:v1").retry(policy).run(fn)

    engine.register("wf", wf)
    with engine:
        assert engine.invoke("wf").result(timeout=10) == "ok"
    assert len(slept) == 2
    assert 0.0 <= slept[0] <= 1.0
    assert 0.0 <= slept[1] <= 2.0


def test_without_a_policy_the_first_error_fails_the_run(
    make_engine: Callable[..., Engine],
) -> None:
    """No step policy and no engine default: one call, no sleep, Failed without a count."""
    slept: list[float] = []
    engine = make_engine(sleep=slept.append)
    fn = Flaky(ConnectionError("reset"))

    def wf(ctx: Context) -> str:
        return ctx.step("call:v1").run(fn)

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf", instance_id="job-1").wait(timeout=10)
        record = only_step(engine, "wf", "job-1")
    assert state == Failed("step 'call:v1' failed: ConnectionError: reset")
    assert fn.calls == 1
    assert slept == []
    assert (record.state, record.attempts) == ("failed", 1)


def test_the_engine_default_policy_applies_to_steps_without_one(
    make_engine: Callable[..., Engine],
) -> None:
    """make_engine(retry=...) retries a step that sets no policy of its own."""
    slept: list[float] = []
    default = Retry(max_attempts=4, initial_delay=0.5, multiplier=2, jitter=False)
    engine = make_engine(retry=default, sleep=slept.append)
    fn = Flaky(*(ConnectionError(f"reset {n}") for n in range(1, 10)))

    def wf(ctx: Context) -> str:
        return ctx.step("call:v1").run(fn)

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf").wait(timeout=10)
    assert state == Failed("step 'call:v1' failed after 4 attempts: ConnectionError: reset 4")
    assert fn.calls == 4
    assert slept == [0.5, 1.0, 2.0]


def test_a_step_policy_overrides_the_engine_default(make_engine: Callable[..., Engine]) -> None:
    """A step's own .retry() wins over the engine's retry option."""
    slept: list[float] = []
    default = Retry(max_attempts=4, initial_delay=0.5, jitter=False)
    engine = make_engine(retry=default, sleep=slept.append)
    fn = Flaky(*(ConnectionError(f"reset {n}") for n in range(1, 10)))
    own = Retry(max_attempts=2, initial_delay=7.0, jitter=False)

    def wf(ctx: Context) -> str:
        return ctx.step("call:v1").retry(own).run(fn)

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf").wait(timeout=10)
    assert state == Failed("step 'call:v1' failed after 2 attempts: ConnectionError: reset 2")
    assert fn.calls == 2
    assert slept == [7.0]


def test_the_builder_takes_retry_and_sleep() -> None:
    """Engine.builder().retry(...).sleep(...) sets the default policy and the backoff sleep."""
    slept: list[float] = []
    engine = (
        Engine.builder().in_memory()
        .retry(Retry(max_attempts=3, initial_delay=0.25, jitter=False))
        .sleep(slept.append)
        .build()
    )
    fn = Flaky(ConnectionError("a"), ConnectionError("b"))
    engine.register("wf", lambda ctx: ctx.step("call:v1").run(fn))
    try:
        with engine:
            assert engine.invoke("wf").result(timeout=10) == "ok"
    finally:
        engine.close()
    assert fn.calls == 3
    assert slept == [0.25, 0.5]


def test_a_timed_out_attempt_is_retried(make_engine: Callable[..., Engine]) -> None:
    """A first call that times out is retried once it returned; the second completes the step.

    The backoff releases the timed-out call, so the next attempt starts only
    after it ended: attempts of one step never overlap.
    """
    release = threading.Event()
    slept: list[float] = []

    def sleep(delay: float) -> None:
        slept.append(delay)
        release.set()  # the timed-out first call may now return

    engine = make_engine(sleep=sleep)
    calls: list[int] = []

    def slow_once() -> str:
        calls.append(1)
        if len(calls) == 1:
            release.wait(10)
            return "late"
        return "in time"

    policy = Retry(max_attempts=2, initial_delay=0, jitter=False)

    def wf(ctx: Context) -> str:
        return ctx.step("slow:v1").timeout(0.5).retry(policy).run(slow_once)

    engine.register("wf", wf)
    try:
        with engine:
            inv = engine.invoke("wf", instance_id="job-1")
            assert inv.result(timeout=10) == "in time"
            record = only_step(engine, "wf", "job-1")
    finally:
        release.set()
    assert len(calls) == 2
    assert slept == [0]
    assert (record.state, record.result, record.error, record.attempts) == (
        "completed", "in time", None, 2,
    )


def test_timeouts_count_against_max_attempts(make_engine: Callable[..., Engine]) -> None:
    """A step that times out on every attempt fails with StepTimeout after max_attempts."""
    first, second = threading.Event(), threading.Event()
    slept: list[float] = []

    def sleep(delay: float) -> None:
        slept.append(delay)
        first.set()  # the first call returns before the second attempt starts

    engine = make_engine(sleep=sleep)
    calls: list[int] = []

    def hang() -> None:
        calls.append(1)
        (first if len(calls) == 1 else second).wait(10)

    policy = Retry(max_attempts=2, initial_delay=0, jitter=False)

    def wf(ctx: Context) -> None:
        ctx.step("slow:v1").timeout(0.2).retry(policy).run(hang)

    engine.register("wf", wf)
    try:
        with engine:
            state = engine.invoke("wf", instance_id="job-1").wait(timeout=10)
            record = only_step(engine, "wf", "job-1")
    finally:
        first.set()
        second.set()
    assert state == Failed(
        "step 'slow:v1' failed after 2 attempts: StepTimeout: timed out after 0.2 s: "
        "workflow 'wf', instance 'job-1', step 'slow:v1'"
    )
    assert len(calls) == 2
    assert (record.state, record.attempts) == ("failed", 2)


def test_no_attempt_starts_while_a_timed_out_one_still_runs(
    make_engine: Callable[..., Engine],
) -> None:
    """A timed-out call still running after another timeout's wait fails the step: one call."""
    release = threading.Event()
    engine = make_engine(sleep=lambda delay: None)
    calls: list[int] = []

    def hang() -> None:
        calls.append(1)
        release.wait(10)

    policy = Retry(max_attempts=3, initial_delay=0, jitter=False)

    def wf(ctx: Context) -> None:
        ctx.step("slow:v1").timeout(0.1).retry(policy).run(hang)

    engine.register("wf", wf)
    try:
        with engine:
            state = engine.invoke("wf", instance_id="job-1").wait(timeout=10)
    finally:
        release.set()
    assert isinstance(state, Failed)
    assert state.message is not None
    assert "the attempt that timed out is still running" in state.message
    assert len(calls) == 1


def test_a_cancel_during_backoff_stops_the_retries(make_engine: Callable[..., Engine]) -> None:
    """Cancelling the instance while it sleeps before a retry ends the run Cancelled."""
    engine: Engine
    slept: list[float] = []

    def sleep_and_cancel(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 1:
            engine.cancel("wf", "job-1")

    engine = make_engine(sleep=sleep_and_cancel)
    fn = Flaky(*(ConnectionError(f"reset {n}") for n in range(1, 10)))
    policy = Retry(max_attempts=5, initial_delay=1, jitter=False)

    def wf(ctx: Context) -> str:
        return ctx.step("call:v1").retry(policy).run(fn)

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf", instance_id="job-1").wait(timeout=10)
        record = only_step(engine, "wf", "job-1")
    assert state == Cancelled()
    assert fn.calls == 1
    assert slept == [1.0]
    assert (record.state, record.error, record.attempts) == (
        "failed", "ConnectionError: reset 1", 1,
    )


def test_retry_with_something_else_than_a_retry_fails_the_run(engine: Engine) -> None:
    """.retry("x") raises TypeError in the workflow, which fails the run and says so."""
    calls: list[int] = []

    def wf(ctx: Context) -> None:
        ctx.step("call:v1").retry("x").run(lambda: calls.append(1))  # type: ignore[arg-type]

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf", instance_id="job-1")
        state = inv.wait(timeout=10)
        assert engine.steps("wf", "job-1") == []
    assert state == Failed("workflow raised TypeError: retry takes a Retry, not str")
    assert calls == []


@pytest.mark.parametrize("name", ["initial_delay", "max_delay", "multiplier"])
@pytest.mark.parametrize("value", ["1", None, [1]])
def test_a_delay_of_the_wrong_type_is_a_type_error_naming_it(name: str, value: object) -> None:
    """Retry(initial_delay="1") and the like: a TypeError that names the field."""
    with pytest.raises(TypeError, match=f"^Retry.{name} is .*, not {type(value).__name__}"):
        Retry(**{name: value})  # type: ignore[arg-type]


# ---------------------------------------------------------------------- real backoffs


class Calls:
    """Counts calls of a step function and the most of them running at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards every field
        self.count = 0
        self.now = 0
        self.most = 0

    def enter(self) -> int:
        """Record a call starting; return its number (1 for the first)."""
        with self._lock:
            self.count += 1
            self.now += 1
            self.most = max(self.most, self.now)
            return self.count

    def leave(self) -> None:
        with self._lock:
            self.now -= 1


def test_timed_out_attempts_of_a_retried_step_never_overlap(
    make_engine: Callable[..., Engine],
) -> None:
    """With .timeout().retry(), a new attempt never runs beside an abandoned one."""
    calls = Calls()
    release = threading.Event()

    def body() -> str:
        n = calls.enter()
        try:
            if n <= 2:  # outlives its 0.1 s timeout, then ends on its own
                release.wait(0.5)
            return "ok"
        finally:
            calls.leave()

    policy = Retry(max_attempts=4, initial_delay=0, jitter=False)
    engine = make_engine()
    engine.register("wf", lambda ctx: ctx.step("s").timeout(0.1).retry(policy).run(body))
    try:
        with engine:
            state = final_state(engine.invoke("wf"), timeout=30)
    finally:
        release.set()
    assert calls.most == 1
    assert state == Completed() or (isinstance(state, Failed) and "timed out" in str(state))


def failing_with_retry(
    engine: Engine, policy: Retry, succeed_on: int = 0, *, also: Engine | None = None,
) -> tuple[Calls, threading.Event, list[float]]:
    """Register "wf": step "s" under ``policy`` raises until call ``succeed_on`` (never if 0),
    on ``engine`` and on ``also`` if given (the same workflow, counting calls as one).

    Return its call counter, an event set by the first failing call, and the
    monotonic time of each call.
    """
    calls, failed, at = Calls(), threading.Event(), []

    def body() -> str:
        n = calls.enter()
        calls.leave()
        at.append(time.monotonic())
        if n == succeed_on:
            return "ok"
        failed.set()
        raise ConnectionError("down")

    for each in (engine,) if also is None else (engine, also):
        each.register("wf", lambda ctx: ctx.step("s").retry(policy).run(body))
    return calls, failed, at


def test_cancel_ends_a_retry_backoff_at_once(make_engine: Callable[..., Engine]) -> None:
    """cancel() during a 0.9 s backoff ends the run Cancelled at once, with no further attempt."""
    engine = make_engine()
    calls, failed, _ = failing_with_retry(
        engine, Retry(max_attempts=3, initial_delay=0.9, jitter=False)
    )
    with engine:
        inv = engine.invoke("wf")
        assert failed.wait(PATIENCE)
        began = time.monotonic()
        engine.cancel("wf", inv.instance_id)
        state = inv.wait(timeout=PATIENCE)
        took = time.monotonic() - began
    assert (state, calls.count) == (Cancelled(), 1)
    assert took < 0.45  # half the backoff: it was interrupted, not waited out


def test_stop_ends_a_retry_backoff_at_once(make_engine: Callable[..., Engine]) -> None:
    """stop() during a 0.9 s backoff (default sleep) returns at once, with no further attempt."""
    engine = make_engine()
    calls, failed, _ = failing_with_retry(
        engine, Retry(max_attempts=3, initial_delay=0.9, jitter=False)
    )
    engine.start()
    engine.invoke("wf")
    assert failed.wait(PATIENCE)
    began = time.monotonic()
    engine.stop()
    took = time.monotonic() - began
    assert took < 0.45  # half the backoff: it was interrupted, not waited out
    assert calls.count == 1


@shared_store_only
def test_a_backoff_ended_by_stop_is_resumed_by_the_next_engine(
    make_engine: Callable[..., Engine],
) -> None:
    """The rest of a backoff cut by stop() is a timer: the next engine makes the attempt."""
    first, second = make_engine(), make_engine()
    calls, failed, at = failing_with_retry(
        first, Retry(max_attempts=3, initial_delay=0.5, jitter=False), succeed_on=2,
        also=second,
    )
    first.start()
    instance_id = first.invoke("wf").instance_id
    assert failed.wait(PATIENCE)
    first.stop()
    assert first.get_metadata("wf", instance_id).status == (  # type: ignore[union-attr]
        MetadataStatus.Suspended("retry s")
    )
    with second:
        assert second.invocation("wf", instance_id).result(timeout=PATIENCE) == "ok"
    assert calls.count == 2
    assert at[1] - at[0] >= 0.45


def test_a_long_retry_backoff_is_a_durable_timer(make_engine: Callable[..., Engine]) -> None:
    """A 1.5 s backoff ends the run Suspended("retry s"), holding no worker; a timer resumes it."""
    engine = make_engine(max_workers=1)
    calls, failed, at = failing_with_retry(
        engine, Retry(max_attempts=2, initial_delay=1.5, jitter=False), succeed_on=2
    )
    engine.register("quick", lambda ctx: "quick")
    with engine:
        inv = engine.invoke("wf")
        assert failed.wait(PATIENCE)
        assert inv.wait(timeout=PATIENCE) == Suspended("retry s")
        # The only worker is free: another workflow runs during the backoff.
        assert engine.invoke("quick").result(timeout=1) == "quick"
        assert inv.result(timeout=PATIENCE) == "ok"
    assert calls.count == 2
    assert at[1] - at[0] >= 1.4


def test_a_durable_backoff_of_exactly_one_second_keeps_counting_attempts() -> None:
    """1 s is durable (the run suspends), and the attempts go on counting across each wait.

    The engine's clock is the test's: each backoff ends when the test moves
    the clock and fires the timer, and the third attempt is the last.
    """
    engine, now = clocked_engine()
    calls: list[int] = []

    def flaky() -> None:
        calls.append(1)
        raise ConnectionError("down")

    retry = Retry(max_attempts=3, initial_delay=1.0, multiplier=2.0, jitter=False)
    engine.register("wf", lambda ctx: ctx.step("s").retry(retry).run(flaky))
    with engine:
        inv = engine.invoke("wf", instance_id="x")
        assert inv.wait(timeout=10) == Suspended("retry s")
        assert len(calls) == 1
        for attempt, delay in ((2, 1.0), (3, 2.0)):
            now[0] += delay
            # This call fires the backoff, or the timer thread did the moment the
            # clock moved (its sleep to the deadline may end then): 0 or 1.
            assert engine.fire_due_timers() in (0, 1)
            until(lambda attempt=attempt: len(calls) == attempt)  # the next attempt ran
            state = inv.wait(timeout=10)
        assert state == Failed("step 's' failed after 3 attempts: ConnectionError: down")
        assert len(calls) == 3
    engine.close()
