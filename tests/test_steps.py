"""Steps: a step's function runs once and its result is stored under its key; a resume
replays the stored steps from the store (silently, restoring their status) and runs the rest."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

from helpers import flaky_once

from memable import (
    Completed,
    Context,
    Engine,
    Failed,
    InProgress,
    StepError,
)

#: Upper bound for any wait in these tests; a healthy run ends in milliseconds.
TIMEOUT = 10.0


def test_simple_workflow_completes(engine: Engine) -> None:
    """A workflow of two steps runs to Completed and its steps' results reach the workflow."""

    def add(ctx: Context) -> int:
        a: int = ctx.step("a").run(lambda: 1)
        b: int = ctx.step("b").run(lambda: 2)
        return a + b

    engine.register("add", add)
    engine.start()

    inv = engine.invoke("add")
    assert inv.wait(TIMEOUT) == Completed()
    assert inv.result(TIMEOUT) == 3


def test_step_error_produces_failed_state(engine: Engine) -> None:
    """A step raising a permanent StepError fails the workflow with a message naming the step
    and the error.
    """

    def boom() -> str:
        raise StepError.permanent("boom")

    def failing(ctx: Context) -> None:
        ctx.step("fail").run(boom)

    engine.register("fail", failing)
    engine.start()

    state = engine.invoke("fail").wait(TIMEOUT)
    assert isinstance(state, Failed)
    assert "'fail'" in state.message
    assert "boom" in state.message


def test_a_step_passes_keyword_arguments_to_its_function() -> None:
    """``run(fn, *args, **kwargs)`` hands the step's function its keyword arguments too."""
    engine = Engine.in_memory()
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda a, *, b: a + b, 1, b=2))
    with engine:
        assert engine.invoke("wf").result(timeout=10) == 3
    engine.close()


def test_a_stored_step_keeps_when_its_execution_started(tmp_path: Path) -> None:
    """A completed step's row holds the time its execution began."""
    engine = Engine.open(tmp_path / "db")
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda: 1))
    with engine:
        assert engine.invoke("wf").result(timeout=10) == 1
    engine.close()
    with closing(sqlite3.connect(tmp_path / "db")) as reader:
        [(started_at,)] = reader.execute("SELECT started_at FROM memable_steps").fetchall()
    assert started_at is not None


def test_memoisation_on_resume(engine: Engine) -> None:
    """Resuming a failed instance returns the completed step from the store and re-runs only
    the failed one.
    """
    calls: list[str] = []

    def s1() -> str:
        calls.append("s1")
        return "hello"

    s2 = flaky_once(calls, "s2", "world", "transient")

    def memo(ctx: Context) -> str:
        first: str = ctx.step("s1").run(s1)
        second = ctx.step("s2").run(s2)
        return f"{first} {second}"

    engine.register("memo", memo)
    engine.start()

    inv = engine.invoke("memo")
    state = inv.wait(TIMEOUT)
    assert isinstance(state, Failed)
    assert "s2" in state.message
    assert "transient" in state.message
    assert calls == ["s1", "s2"]

    calls.clear()
    resumed = engine.resume("memo", inv.instance_id)
    assert resumed.wait(TIMEOUT) == Completed()
    assert resumed.result(TIMEOUT) == "hello world"
    assert calls == ["s2"]


def test_different_instances_have_separate_caches(engine: Engine) -> None:
    """The same step key in two instances of one workflow executes once in each."""
    calls: list[str] = []

    def wf(ctx: Context) -> None:
        ctx.step("x").run(calls.append, ctx.instance_id)

    engine.register("wf", wf)
    engine.start()

    first = engine.invoke("wf")
    assert first.wait(TIMEOUT) == Completed()
    second = engine.invoke("wf")
    assert second.wait(TIMEOUT) == Completed()

    assert first.instance_id != second.instance_id
    assert calls == [first.instance_id, second.instance_id]


def test_step_without_status_stores_none(engine: Engine) -> None:
    """A step run without any set_status is stored with no status, and a resume replays it
    without executing it.
    """
    calls: list[str] = []

    def s1() -> int:
        calls.append("s1")
        return 42

    def no_status(ctx: Context) -> int:
        value: int = ctx.step("s1").run(s1)
        return value

    engine.register("no-status", no_status)
    engine.start()

    inv = engine.invoke("no-status")
    assert inv.wait(TIMEOUT) == Completed()
    assert calls == ["s1"]

    [record] = engine.steps("no-status", inv.instance_id)
    assert record.key == "s1"
    assert record.state == "completed"
    assert record.result == 42
    assert record.status is None

    calls.clear()
    resumed = engine.resume("no-status", inv.instance_id)
    assert resumed.wait(TIMEOUT) == Completed()
    assert resumed.result(TIMEOUT) == 42
    assert calls == []
    [record] = engine.steps("no-status", inv.instance_id)
    assert record.status is None


def test_status_persisted_and_restored_on_resume(engine: Engine) -> None:
    """The status set before a step is stored with it, and a resume replays that step from the
    store and re-runs only the failed one.
    """
    calls: list[str] = []

    def s1() -> str:
        calls.append("s1")
        return "one"

    s2 = flaky_once(calls, "s2", "two", "transient")

    def status_wf(ctx: Context) -> None:
        ctx.set_status("step-one")
        ctx.step("s1").run(s1)
        ctx.set_status("step-two")
        ctx.step("s2").run(s2)

    engine.register("status-wf", status_wf)
    engine.start()

    inv = engine.invoke("status-wf")
    state = inv.wait(TIMEOUT)
    assert isinstance(state, Failed)
    assert "s2" in state.message
    assert "transient" in state.message
    assert calls == ["s1", "s2"]

    steps = {record.key: record for record in engine.steps("status-wf", inv.instance_id)}
    assert steps["s1"].state == "completed"
    assert steps["s1"].status == "step-one"
    assert steps["s2"].state == "failed"

    calls.clear()
    assert engine.resume("status-wf", inv.instance_id).wait(TIMEOUT) == Completed()
    assert calls == ["s2"]

    records = engine.steps("status-wf", inv.instance_id)
    assert [(r.key, r.state, r.status) for r in records] == [
        ("s1", "completed", "step-one"),
        ("s2", "completed", "step-two"),
    ]


def test_subscribers_not_notified_during_replay(engine: Engine) -> None:
    """A resumed run replays its stored steps silently: watchers see only the status current
    when replay ends, then the end state.
    """
    gate = threading.Event()
    gate.set()  # the first run goes straight through
    calls: list[str] = []
    s2 = flaky_once(calls, "s2", 2, "fail first time")

    def silent_replay(ctx: Context) -> None:
        if not gate.wait(TIMEOUT):
            raise RuntimeError("the test never opened the gate")
        ctx.set_status("phase-1")
        ctx.step("s1").run(lambda: 1)
        ctx.set_status("phase-2")
        ctx.step("s2").run(s2)

    engine.register("silent-replay", silent_replay)
    engine.start()

    inv = engine.invoke("silent-replay")
    assert isinstance(inv.wait(TIMEOUT), Failed)

    gate.clear()  # hold the resumed run before it does anything
    resumed = engine.resume("silent-replay", inv.instance_id)
    updates = resumed.updates()  # subscribes now, before the run can publish
    gate.set()

    assert list(updates) == [InProgress("phase-2"), Completed()]
    assert calls == ["s2", "s2"]


def test_a_replay_restores_the_status_a_step_was_stored_with(
    make_engine: Callable[..., Engine],
) -> None:
    """The status set before a stored step (by code that does not set it again) is published
    once the resumed run leaves replay."""
    engine = make_engine()
    first_run, entered, release = [True], threading.Event(), threading.Event()

    def wf(ctx: Context) -> int:
        if first_run[0]:
            ctx.set_status("first run only")
        ctx.step("a").run(lambda: 1)
        if first_run[0]:
            ctx.step("b").run(lambda: 1 / 0)
        return int(ctx.step("c").run(lambda: entered.set() or release.wait(10)))

    engine.register("wf", wf)
    with engine:
        assert isinstance(engine.invoke("wf", instance_id="x").wait(timeout=10), Failed)
        first_run[0] = False
        resumed = engine.resume("wf", "x")
        try:
            assert entered.wait(10)
            assert resumed.state == InProgress("first run only")
        finally:
            release.set()
        assert resumed.result(timeout=10) == 1
