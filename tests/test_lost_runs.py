"""Runs the poll takes for lost: one whose end could not be recorded runs again to its end;
one that has just ended, or whose run is not registered yet, is left alone.

Each forces the race by wrapping one store operation, so it happens every time.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import build, runner_of, store_of

from memable import Context, Engine, StorageError


@pytest.mark.parametrize("store", ["memory", "file"])
def test_a_run_whose_end_could_not_be_recorded_runs_again_and_completes(
    tmp_path: Path, store: str
) -> None:
    """The end write fails once: watchers keep following; the engine runs it again to the end."""
    engine, engine_store = build(None if store == "memory" else tmp_path / "db",
                                 poll_interval=0.05)
    ran: list[int] = []
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda: ran.append(1) or 7))
    real = engine_store.finish
    failures: list[str] = []

    def finish_failing_once(*args: Any, **kwargs: Any) -> bool:
        if not failures:
            failures.append("failed")
            raise StorageError("cannot record the run (forced)")
        return real(*args, **kwargs)

    engine_store.finish = finish_failing_once  # type: ignore[method-assign]
    with engine:
        inv = engine.invoke("wf", instance_id="x")
        assert inv.result(timeout=10) == 7
    engine.close()
    assert failures == ["failed"]
    assert ran == [1]


def test_a_run_that_ends_while_the_poll_reads_the_store_is_not_taken_for_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The poll sees the instance owned and running; the run ends before it checks: no re-run.

    Without the guard, the poll took the ended run for one whose end was not
    recorded and started a spurious recovery run that watchers saw.
    """
    engine, store = build(tmp_path / "db", poll_interval=60, lease=600)
    inside, release = threading.Event(), threading.Event()

    def wf(ctx: Context) -> str:
        ctx.step("a").run(lambda: inside.set() or release.wait(10))
        return str(ctx.suspend("gate"))

    engine.register("wf", wf)
    runner = runner_of(engine)
    real = store.look_around
    invocation: list[Any] = []

    def look_then_let_the_run_end(*args: Any) -> Any:
        look = real(*args)
        assert ("wf", "x") in look.mine
        release.set()
        assert str(invocation[0].wait(timeout=10)) == "suspended: gate"
        return look

    with engine:
        invocation.append(engine.invoke("wf", instance_id="x"))
        assert inside.wait(10)
        store.look_around = look_then_let_the_run_end  # type: ignore[method-assign]
        runner.claims.look_around(0.0)
        store.look_around = real  # type: ignore[method-assign]
        assert runner.runs._active == {}
        assert "did not record its end" not in caplog.text
        assert engine.signal("wf", "x", "gate", 5).result(timeout=10) == "5"
    engine.close()


def _poll_inside(engine: Engine, operation: str) -> list[int]:
    """Wrap the store's ``operation`` (which makes instances this engine owns) so the
    engine's poll looks at the store right after it, before their runs are registered;
    return the list the number of runs the poll took for lost is added to."""
    store = store_of(engine)
    real = getattr(store, operation)
    taken: list[int] = []
    runner = runner_of(engine)

    def then_poll(*args: Any, **kwargs: Any) -> Any:
        made = real(*args, **kwargs)
        before = runner.runs.turnover
        runner.claims.look_around(runner.clock.wall())
        taken.append(runner.runs.turnover - before)
        return made

    setattr(store, operation, then_poll)
    return taken


def test_an_invoked_instance_is_not_taken_for_lost_before_its_run_is_registered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The poll reads the new instance as this engine's and running, with no run here yet:
    it must wait, not run it again as one whose end was lost."""
    engine = build(poll_interval=60).engine
    engine.register("wf", lambda ctx: "done")
    taken = _poll_inside(engine, "create_instance")
    with engine:
        assert engine.invoke("wf", instance_id="w").result(10) == "done"
    assert taken == [0]
    assert "did not record its end" not in caplog.text


def test_a_schedule_tick_is_not_taken_for_lost_before_its_run_is_registered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """An hourly schedule's tick makes its instance this engine's and running; the poll
    reads the store right then, before the run is registered: it waits, no re-run."""
    from freezegun import freeze_time

    engine = build(poll_interval=60).engine
    engine.register("job", lambda ctx: "done")
    engine.schedule("hourly", "0 * * * *", "job")
    taken = _poll_inside(engine, "fire_ticks")
    with freeze_time("2026-06-01 09:59:00") as clock, engine:
        clock.move_to("2026-06-01 10:00:00")
        engine.fire_due_timers()
        assert engine.invocation("job", "hourly@2026-06-01T10:00:00Z").result(10) == "done"
    assert taken == [0]
    assert "did not record its end" not in caplog.text


def test_a_child_is_not_taken_for_lost_before_its_run_is_registered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A parent starts a child, owned by this engine and running; the poll reads the store
    right then, before the child's run is registered: it waits, no re-run."""
    engine = build(poll_interval=60).engine
    engine.register("child", lambda ctx: "done")
    engine.register("parent", lambda ctx: ctx.child("c", "child"))
    taken = _poll_inside(engine, "start_children")
    with engine:
        assert engine.invoke("parent").result(10) == "done"
    assert taken == [0]
    assert "did not record its end" not in caplog.text
