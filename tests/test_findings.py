"""What a new user ran into (durations, signals, lifecycle, inputs), through the public API."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from helpers import dump

from memable import (
    AlreadyStarted,
    Context,
    Engine,
    InstanceNotFound,
    NotStarted,
    Retry,
    WorkflowNotFound,
)


def test_after_close_calls_say_the_engine_is_closed(make_engine: Callable[..., Engine]) -> None:
    """invoke and start on a closed engine say it is closed, not "call start()"."""
    engine = make_engine()
    engine.register("wf", lambda ctx: None)
    engine.start()
    engine.close()
    with pytest.raises(NotStarted, match="the engine is closed"):
        engine.invoke("wf")
    with pytest.raises(AlreadyStarted, match="closed and cannot start again"):
        engine.start()


def test_after_stop_start_says_make_a_new_engine(make_engine: Callable[..., Engine]) -> None:
    """start() after stop() says the engine cannot start again; invoke says it is stopped."""
    engine = make_engine()
    engine.register("wf", lambda ctx: None)
    engine.start()
    engine.stop()
    with pytest.raises(AlreadyStarted, match="stopped and cannot start again"):
        engine.start()
    with pytest.raises(NotStarted, match="the engine is stopped"):
        engine.invoke("wf")


def test_a_workflow_that_needs_an_input_refuses_an_invoke_without_one(
    make_engine: Callable[..., Engine],
) -> None:
    """No input for a parameter without a default: TypeError at invoke, nothing stored."""
    engine = make_engine()
    engine.register("needs", lambda ctx, order_id: order_id)
    engine.register("optional", lambda ctx, order_id=None: order_id)
    with engine:
        before = dump(engine)
        with pytest.raises(TypeError, match="'needs' takes an input and was invoked without one"):
            engine.invoke("needs")
        assert dump(engine) == before
        assert engine.invoke("needs", None).result(timeout=10) is None
        assert engine.invoke("optional").result(timeout=10) is None


def test_a_signal_to_an_unknown_workflow_is_workflow_not_found(
    make_engine: Callable[..., Engine],
) -> None:
    """A name neither registered nor stored: WorkflowNotFound; a known name, InstanceNotFound."""
    engine = make_engine()
    engine.register("wf", lambda ctx: ctx.suspend("go"))
    with engine:
        with pytest.raises(WorkflowNotFound, match="'nope'"):
            engine.signal("nope", "i-1", "go", 1)
        with pytest.raises(InstanceNotFound):
            engine.signal("wf", "i-1", "go", 1)


@pytest.mark.parametrize(
    "options",
    [{"poll_interval": timedelta(seconds=0.5)}, {"lease": timedelta(seconds=30)}],
)
def test_engine_durations_take_a_timedelta(
    make_engine: Callable[..., Engine], options: dict[str, object]
) -> None:
    """poll_interval and lease take a timedelta as well as seconds."""
    engine = make_engine(**options)
    engine.register("wf", lambda ctx: 1)
    with engine:
        assert engine.invoke("wf").result(timeout=timedelta(seconds=10)) == 1


@pytest.mark.parametrize(
    ("value", "error"),
    [("60", TypeError), (float("inf"), ValueError), (float("nan"), ValueError), (-1, ValueError)],
)
def test_bad_durations_are_refused_naming_the_argument(value: object, error: type) -> None:
    """Strings, infinity, NaN and negatives raise and name the argument."""
    with pytest.raises(error, match="poll_interval"):
        Engine.in_memory(poll_interval=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("duration", ["60", float("inf"), 1e12])
def test_a_bad_timer_fails_the_run_and_stores_no_timer(
    make_engine: Callable[..., Engine], duration: object
) -> None:
    """A timer of a str, infinity or past the year 9999 fails the run naming its key; no
    timer is armed."""
    engine = make_engine()

    def wf(ctx: Context) -> None:
        ctx.timer("far:v1", duration)  # type: ignore[arg-type]

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf", instance_id="w").wait(timeout=10)
        assert engine.steps("wf", "w") == []
    assert state.message is not None
    assert state.message.startswith("step 'far:v1' failed: ")
    assert "timer duration of 'far:v1'" in state.message


@pytest.mark.parametrize("value", [0, -1, timedelta(0)])
def test_step_timeouts_of_zero_and_below_get_one_rule(
    make_engine: Callable[..., Engine], value: object
) -> None:
    """timeout(0), timeout(-1) and a zero timedelta all say "> 0 seconds"."""
    engine = make_engine()
    engine.register("wf", lambda ctx: ctx.step("k").timeout(value).run(lambda: 1))
    with engine:
        state = engine.invoke("wf").wait(timeout=10)
    assert state.message is not None
    assert f"step timeout is > 0 seconds, not {value!r}" in state.message


def test_retry_delays_take_a_timedelta() -> None:
    """Retry(initial_delay=..., max_delay=...) take a timedelta."""
    policy = Retry(
        initial_delay=timedelta(seconds=2), max_delay=timedelta(minutes=1), jitter=False
    )
    assert policy.delay(1) == 2.0
    assert policy.delay(10) == 60.0
