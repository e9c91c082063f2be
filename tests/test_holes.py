"""Holes in Part 1 as corrected by Part 2: each test guards a fix, through the public API only.

Interleavings are forced with events inside step functions; the few loops that
poll (``wait_until``) look at something no event can signal, such as ``stop()``
having begun.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import attrs
import pytest

from memable import (
    Cancelled,
    Completed,
    Context,
    Engine,
    EngineError,
    Failed,
    Invocation,
    MetadataStatus,
    NotStarted,
    Retry,
    SignalRejected,
    StepRecord,
    Suspended,
    WorkflowFailed,
    WorkflowState,
)

#: Seconds any single wait in these tests may take before the test gives up.
PATIENCE = 10

shared_store_only = pytest.mark.parametrize("store_target", ["file", "postgres"], indirect=True)


def final_state(inv: Invocation, timeout: float = PATIENCE) -> WorkflowState:
    """The terminal state of an instance, waiting through suspensions and new runs."""
    try:
        inv.result(timeout=timeout)
    except WorkflowFailed as err:
        return err.state
    return inv.wait(timeout=timeout)


def record(engine: Engine, name: str, instance_id: str, key: str) -> StepRecord:
    """The StepRecord of ``key`` in an instance."""
    [found] = [r for r in engine.steps(name, instance_id) if r.key == key]
    return found


def wait_until(check: Callable[[], bool], timeout: float = PATIENCE) -> None:
    """Poll ``check`` until it holds, for what no event can signal; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def stopping(engine: Engine, name: str, instance_id: str) -> bool:
    """True once ``engine`` takes no new work (an idempotent invoke raises NotStarted)."""
    try:
        engine.invoke(name, instance_id=instance_id)
    except NotStarted:
        return True
    return False


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


# ---------------------------------------------------------------------- signals and step keys


def test_early_signal_for_a_step_key_fails_the_workflow_at_that_step(
    make_engine: Callable[..., Engine],
) -> None:
    """A signal stored early for a key later used as a step fails the run there, body unrun."""
    ran: list[int] = []

    def wf(ctx: Context) -> str:
        ctx.suspend("go")
        return ctx.step("b").run(lambda: ran.append(1) or "stepped")

    engine = make_engine()
    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        assert inv.wait(timeout=PATIENCE) == Suspended("go")
        engine.signal("wf", inv.instance_id, "b", "signalled").wait(timeout=PATIENCE)
        state = final_state(engine.signal("wf", inv.instance_id, "go", 1))
        assert isinstance(state, Failed), state
        assert "'b'" in str(state.message)
        assert ran == []
        assert record(engine, "wf", inv.instance_id, "b").kind == "signal"


def test_signal_for_a_step_in_flight_is_rejected(make_engine: Callable[..., Engine]) -> None:
    """A signal for the key of a step in flight raises SignalRejected; the step's value wins."""
    inside, release = threading.Event(), threading.Event()

    def body() -> str:
        inside.set()
        release.wait(PATIENCE)
        return "stepped"

    engine = make_engine()
    engine.register("wf", lambda ctx: ctx.step("s").run(body))
    with engine:
        inv = engine.invoke("wf")
        assert inside.wait(PATIENCE)
        try:
            with pytest.raises(SignalRejected):
                engine.signal("wf", inv.instance_id, "s", 1)
        finally:
            release.set()
        assert final_state(inv) == Completed()
        assert inv.result(timeout=PATIENCE) == "stepped"
        assert record(engine, "wf", inv.instance_id, "s").kind == "step"


def test_signal_for_a_completed_step_is_rejected(make_engine: Callable[..., Engine]) -> None:
    """A signal for a key that completed as a step raises SignalRejected and stores nothing."""
    def wf(ctx: Context) -> str:
        ctx.step("s").run(lambda: "stepped")
        return str(ctx.suspend("go"))

    engine = make_engine()
    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        assert inv.wait(timeout=PATIENCE) == Suspended("go")
        with pytest.raises(SignalRejected):
            engine.signal("wf", inv.instance_id, "s", 1)
        s = record(engine, "wf", inv.instance_id, "s")
        assert (s.kind, s.state, s.result) == ("step", "completed", "stepped")


def test_signal_for_a_failed_step_is_rejected(make_engine: Callable[..., Engine]) -> None:
    """A signal for a key that failed as a step (caught by the workflow) raises SignalRejected."""
    def boom() -> None:
        raise ValueError("no")

    def wf(ctx: Context) -> str:
        with contextlib.suppress(Exception):
            ctx.step("s").run(boom)
        return str(ctx.suspend("go"))

    engine = make_engine()
    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        assert inv.wait(timeout=PATIENCE) == Suspended("go")
        s = record(engine, "wf", inv.instance_id, "s")
        assert (s.kind, s.state) == ("step", "failed")
        with pytest.raises(SignalRejected):
            engine.signal("wf", inv.instance_id, "s", 1)
        s = record(engine, "wf", inv.instance_id, "s")
        assert (s.kind, s.state) == ("step", "failed")


# ---------------------------------------------------------------------- stop, timeouts, retries


@shared_store_only
def test_run_passing_a_satisfied_wait_during_stop_goes_on_in_the_next_engine(
    make_engine: Callable[..., Engine],
) -> None:
    """A run that passes a due zero timer while stop() drains is not left running forever."""
    calls = {"a": 0, "b": 0}
    inside, release = threading.Event(), threading.Event()

    def step_a() -> int:
        calls["a"] += 1
        inside.set()
        release.wait(PATIENCE)
        return 1

    def wf(ctx: Context) -> str:
        ctx.step("a").run(step_a)
        ctx.timer("z", 0)
        return ctx.step("b").run(lambda: calls.__setitem__("b", calls["b"] + 1) or "done")

    first = make_engine(recover=False, poll_interval=0.2)
    first.register("wf", wf)
    first.start()
    instance_id = first.invoke("wf").instance_id
    stopper = threading.Thread(target=first.stop)
    try:
        assert inside.wait(PATIENCE)
        stopper.start()
        wait_until(lambda: stopping(first, "wf", instance_id))
    finally:
        release.set()
    stopper.join(PATIENCE)
    assert not stopper.is_alive()
    left = first.get_metadata("wf", instance_id)
    assert left is not None
    assert (left.status, left.completed_at) == (MetadataStatus.Suspended("timer z"), None)

    second = make_engine(recover=False, poll_interval=0.2)
    second.register("wf", wf)
    with second:
        assert second.invocation("wf", instance_id).result(timeout=PATIENCE) == "done"
    assert calls == {"a": 1, "b": 1}


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
    engine: Engine, policy: Retry, succeed_on: int = 0
) -> tuple[Calls, threading.Event, list[float]]:
    """Register "wf": step "s" under ``policy`` raises until call ``succeed_on`` (never if 0).

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

    engine.register("wf", lambda ctx: ctx.step("s").retry(policy).run(body))
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
    first = make_engine()
    calls, failed, at = failing_with_retry(
        first, Retry(max_attempts=3, initial_delay=0.5, jitter=False), succeed_on=2
    )
    first.start()
    instance_id = first.invoke("wf").instance_id
    assert failed.wait(PATIENCE)
    first.stop()
    assert first.get_metadata("wf", instance_id).status == (  # type: ignore[union-attr]
        MetadataStatus.Suspended("retry s")
    )
    second = make_engine()
    second.register("wf", first._runner.workflows["wf"].fn)
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


# ---------------------------------------------------------------------- engines, classes, fork


@shared_store_only
def test_wait_from_another_engine_waits_for_the_run_to_end(
    make_engine: Callable[..., Engine],
) -> None:
    """An Invocation from an engine that is not running the instance never returns Started()."""
    inside, release, watching = threading.Event(), threading.Event(), threading.Event()

    def body() -> str:
        inside.set()
        release.wait(PATIENCE)
        return "ok"

    runner, watcher = make_engine(poll_interval=0.1), make_engine(poll_interval=0.1)
    for engine in (runner, watcher):
        engine.register("wf", lambda ctx: ctx.step("s").run(body))
        engine.start()
    got: list[object] = []

    def watch(inv: Invocation) -> None:
        watching.set()
        try:
            got.append(inv.wait(timeout=5))
        except BaseException as err:  # reported by the assertion below
            got.append(err)

    try:
        instance_id = runner.invoke("wf").instance_id
        assert inside.wait(PATIENCE)
        waiter = threading.Thread(target=watch, args=(watcher.invocation("wf", instance_id),))
        waiter.start()
        assert watching.wait(PATIENCE)
    finally:
        release.set()
    waiter.join(PATIENCE)
    runner.wait_all()
    assert got == [Completed()]


def make_point_class() -> type[Any]:
    """A function-local attrs class: each call makes a new class with the same qualified name."""
    @attrs.frozen
    class Point:
        x: int

    return Point


def test_a_class_defined_again_under_the_same_name_round_trips(
    make_engine: Callable[..., Engine],
) -> None:
    """Each run rebuilds its value as the class used in that run, not an older same-named one."""
    first, second = make_point_class(), make_point_class()
    assert first is not second
    current: list[type[Any]] = []
    engine = make_engine()
    engine.register("wf", lambda ctx: ctx.step("p").run(lambda: current[0](x=1)))
    with engine:
        for n, cls in enumerate((first, second), 1):
            current[:] = [cls]
            inv = engine.invoke("wf")
            assert final_state(inv) == Completed(), f"the run with class #{n}"
            value = inv.result(timeout=PATIENCE)
            assert type(value) is cls
            assert value == cls(x=1)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@shared_store_only
def test_an_engine_started_before_fork_refuses_work_in_the_child(
    make_engine: Callable[..., Engine],
) -> None:
    """In a forked child, invoke raises EngineError saying to make the engine after the fork.

    The message leads a gunicorn --preload user to the fix (a post_fork hook,
    or no --preload).
    """
    engine = make_engine()
    engine.register("wf", lambda ctx: "ok")
    engine.start()
    pid = os.fork()
    if pid == 0:  # the child: leave through os._exit on every path
        code = 3
        try:
            engine.invoke("wf")
            code = 1  # not refused
        except EngineError as err:
            says = ("before os.fork()", "after the fork", "post_fork", "--preload")
            code = 0 if all(words in str(err) for words in says) else 2
        except BaseException:
            code = 4
        finally:
            os._exit(code)
    deadline = time.monotonic() + PATIENCE
    while (reaped := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            reaped = os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    outcomes = {
        0: "refused", 1: "invoke worked", 2: "another EngineError", 4: "another error",
        -signal.SIGKILL: f"hung, killed after {PATIENCE} s",
    }
    code = os.waitstatus_to_exitcode(reaped[1])
    assert code == 0, f"the child's invoke: {outcomes.get(code, code)}"
    assert engine.invoke("wf").result(timeout=PATIENCE) == "ok"
    engine.wait_all()
