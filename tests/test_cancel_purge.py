"""Cancel (running, suspended, finished instances) and purge of finished instances."""

from __future__ import annotations

import logging
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from helpers import (
    PROCS,
    T0,
    FailsThenWaits,
    build,
    dump,
    killed_in_a_step,
    query,
    until,
    wrap_after,
    write,
)

from memable import (
    Cancelled,
    Completed,
    Context,
    Engine,
    Failed,
    InstanceFinished,
    InstanceNotFound,
    MetadataStatus,
    StepRecord,
    Suspended,
    WorkflowFailed,
    WorkflowMetadata,
)


def timer_rows(engine: Engine, instance_id: str) -> list[tuple[str, float]]:
    """The armed timers of an instance, read on the engine's own connection (private on
    purpose: timers are not part of the public API, and the in-memory store has no file)."""
    return [
        (key, deadline)
        for key, deadline in query(
            engine, "SELECT key, deadline FROM memable_timers WHERE instance_id = ?",
            (instance_id,),
        )
    ]


def step_rows(engine: Engine, name: str, instance_id: str) -> int:
    """How many rows the steps table holds for an instance, read on the engine's own
    connection (private on purpose: engine.steps() refuses an instance whose row is gone)."""
    [(count,)] = query(
        engine, "SELECT COUNT(*) FROM memable_steps WHERE workflow = ? AND instance_id = ?",
        (name, instance_id),
    )
    return int(count)


def metadata(engine: Engine, name: str, instance_id: str) -> WorkflowMetadata:
    """The stored metadata of an instance that must exist."""
    found = engine.get_metadata(name, instance_id)
    assert found is not None
    return found


def waiter(ctx: Context) -> str:
    """Waits for the signal "go:v1", then completes."""
    return str(ctx.suspend("go:v1", status="waiting for go"))


# ---------------------------------------------------------------------- cancel


def test_cancel_of_a_running_instance_stops_after_the_step_in_flight(
    make_engine: Callable[..., Engine],
) -> None:
    """Cancelled while step 2 of 4 runs: step 2 finishes and is stored, 3 and 4 never run."""
    engine = make_engine()
    in_step_2 = threading.Event()
    release = threading.Event()
    ran: list[str] = []

    def step_2() -> str:
        ran.append("s2")
        in_step_2.set()
        release.wait(10)
        return "two"

    def wf(ctx: Context) -> str:
        ctx.step("s1").run(lambda: ran.append("s1") or "one")
        ctx.step("s2").run(step_2)
        ctx.step("s3").run(lambda: ran.append("s3") or "three")
        ctx.step("s4").run(lambda: ran.append("s4") or "four")
        return "done"

    engine.register("wf", wf)
    with engine:
        try:
            inv = engine.invoke("wf", instance_id="job-1")
            assert in_step_2.wait(10)
            engine.cancel("wf", "job-1")
        finally:
            release.set()
        assert inv.wait(timeout=10) == Cancelled()
        steps = engine.steps("wf", "job-1")
        meta = metadata(engine, "wf", "job-1")
        with pytest.raises(WorkflowFailed) as info:
            inv.result(timeout=10)
    assert ran == ["s1", "s2"]
    assert [(s.key, s.state, s.result) for s in steps] == [
        ("s1", "completed", "one"), ("s2", "completed", "two"),
    ]
    assert meta.status == MetadataStatus.Cancelled()
    assert meta.completed_at is not None
    assert info.value.state == Cancelled()


def test_purge_spares_a_cancelled_instance_whose_run_is_still_in_flight(
    make_engine: Callable[..., Engine],
) -> None:
    """A purge during the last step of a cancelled run waits for it: the step is stored."""
    engine = make_engine()
    in_step = threading.Event()
    release = threading.Event()

    def slow() -> str:
        in_step.set()
        release.wait(10)
        return "stored"

    def wf(ctx: Context) -> str:
        return ctx.step("slow").run(slow)

    engine.register("wf", wf)
    with engine:
        try:
            inv = engine.invoke("wf", instance_id="job-1")
            assert in_step.wait(10)
            engine.cancel("wf", "job-1")
            assert engine.purge(older_than=0) == 0
        finally:
            release.set()
        assert inv.wait(timeout=10) == Cancelled()
        assert [(s.key, s.state, s.result) for s in engine.steps("wf", "job-1")] == [
            ("slow", "completed", "stored"),
        ]
        assert engine.purge(older_than=0) == 1
        assert engine.get_metadata("wf", "job-1") is None


def test_cancel_of_a_running_instance_shows_cancelled_in_the_store_at_once(
    make_engine: Callable[..., Engine],
) -> None:
    """The stored status is Cancelled as soon as cancel() returns, before the run stops."""
    engine = make_engine()
    entered = threading.Event()
    release = threading.Event()

    def wf(ctx: Context) -> None:
        ctx.step("s1").run(lambda: entered.set() or release.wait(10))

    engine.register("wf", wf)
    with engine:
        try:
            inv = engine.invoke("wf", instance_id="job-1")
            assert entered.wait(10)
            engine.cancel("wf", "job-1")
            status = metadata(engine, "wf", "job-1").status
        finally:
            release.set()
        assert inv.wait(timeout=10) == Cancelled()
    assert status == MetadataStatus.Cancelled()


def test_a_signal_to_a_cancelled_instance_raises_and_writes_nothing(
    make_engine: Callable[..., Engine],
) -> None:
    """After cancelling a suspended instance, signal() raises InstanceFinished; no row changes."""
    engine = make_engine()
    engine.register("wf", waiter)
    with engine:
        inv = engine.invoke("wf", instance_id="job-1")
        assert inv.wait(timeout=10) == Suspended("waiting for go")
        engine.cancel("wf", "job-1")
        assert inv.state == Cancelled()
        before = dump(engine)
        with pytest.raises(InstanceFinished, match="cancelled") as info:
            engine.signal("wf", "job-1", "go:v1", "now")
        assert dump(engine) == before
        meta = metadata(engine, "wf", "job-1")
    assert str(info.value) == (
        "instance has finished (it is cancelled): workflow 'wf', instance 'job-1'"
    )
    assert meta.status == MetadataStatus.Cancelled()
    assert meta.completed_at is not None


def test_resume_of_a_cancelled_instance_raises(make_engine: Callable[..., Engine]) -> None:
    """resume() of a cancelled instance raises InstanceFinished and starts no run."""
    engine = make_engine()
    runs: list[str] = []

    def wf(ctx: Context) -> str:
        runs.append("run")
        return waiter(ctx)

    engine.register("wf", wf)
    with engine:
        assert engine.invoke("wf", instance_id="job-1").wait(timeout=10) == Suspended(
            "waiting for go"
        )
        engine.cancel("wf", "job-1")
        before = dump(engine)
        with pytest.raises(InstanceFinished, match="cancelled"):
            engine.resume("wf", "job-1")
        assert dump(engine) == before
    assert runs == ["run"]


def test_cancel_of_an_instance_on_a_timer_drops_the_timer(
    make_engine: Callable[..., Engine],
) -> None:
    """Cancelling an instance suspended on a timer deletes its timer; it never fires."""
    engine = make_engine(poll_interval=60)
    after: list[str] = []

    def wf(ctx: Context) -> str:
        ctx.timer("cool-off:v1", timedelta(hours=1))
        return ctx.step("after").run(lambda: after.append("ran") or "done")

    engine.register("wf", wf)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf", instance_id="job-1")
        assert inv.wait(timeout=10) == Suspended("timer cool-off:v1")
        assert timer_rows(engine, "job-1") == [
            ("cool-off:v1", (T0 + timedelta(hours=1)).timestamp()),
        ]
        engine.cancel("wf", "job-1")
        assert timer_rows(engine, "job-1") == []
        clock.move_to(T0 + timedelta(hours=2))
        assert engine.fire_due_timers() == 0
        assert inv.wait(timeout=10) == Cancelled()
        [record] = engine.steps("wf", "job-1")
    assert after == []
    assert (record.key, record.kind, record.state) == ("cool-off:v1", "timer", "waiting")


def test_cancel_of_a_failed_instance_ends_it_cancelled(
    make_engine: Callable[..., Engine],
) -> None:
    """A Failed instance can be cancelled; afterwards it is Cancelled and resume is refused."""
    engine = make_engine()

    def wf(ctx: Context) -> None:
        ctx.step("s").run(lambda: 1 / 0)

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf", instance_id="job-1")
        assert inv.wait(timeout=10) == Failed(
            "step 's' failed: ZeroDivisionError: division by zero"
        )
        engine.cancel("wf", "job-1")
        assert inv.state == Cancelled()
        meta = metadata(engine, "wf", "job-1")
        with pytest.raises(InstanceFinished, match="cancelled"):
            engine.resume("wf", "job-1")
    assert meta.status == MetadataStatus.Cancelled()
    assert meta.completed_at is not None


def test_cancel_of_a_completed_instance_raises_and_changes_nothing(
    make_engine: Callable[..., Engine],
) -> None:
    """cancel() of a Completed instance raises InstanceFinished naming it; no row changes."""
    engine = make_engine()
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda: 1))
    with engine:
        assert engine.invoke("wf", instance_id="job-1").wait(timeout=10) == Completed()
        before = dump(engine)
        with pytest.raises(InstanceFinished) as info:
            engine.cancel("wf", "job-1")
        assert dump(engine) == before
        status = metadata(engine, "wf", "job-1").status
    assert str(info.value) == (
        "instance has finished (it is completed): workflow 'wf', instance 'job-1'"
    )
    assert (info.value.workflow, info.value.instance_id) == ("wf", "job-1")
    assert status == MetadataStatus.Completed()


def test_cancel_of_a_cancelled_instance_raises_and_changes_nothing(
    make_engine: Callable[..., Engine],
) -> None:
    """A second cancel() raises InstanceFinished naming the instance; no row changes."""
    engine = make_engine()
    engine.register("wf", waiter)
    with engine:
        assert engine.invoke("wf", instance_id="job-1").wait(timeout=10) == Suspended(
            "waiting for go"
        )
        engine.cancel("wf", "job-1")
        before = dump(engine)
        with pytest.raises(InstanceFinished) as info:
            engine.cancel("wf", "job-1")
        assert dump(engine) == before
    assert str(info.value) == (
        "instance has finished (it is cancelled): workflow 'wf', instance 'job-1'"
    )


def test_cancel_of_an_unknown_instance_raises_instance_not_found(
    make_engine: Callable[..., Engine],
) -> None:
    """cancel() of an id never stored raises InstanceNotFound naming workflow and id."""
    engine = make_engine()
    engine.register("wf", waiter)
    with engine:
        before = dump(engine)
        with pytest.raises(InstanceNotFound) as info:
            engine.cancel("wf", "nope")
        assert dump(engine) == before
    assert str(info.value) == "no stored instance: workflow 'wf', instance 'nope'"


def test_a_cancel_before_the_run_goes_on_past_a_satisfied_wait_stops_it(tmp_path: Path) -> None:
    """A cancel between a zero timer's firing and the run going on: no later step runs."""
    engine, store = build(tmp_path / "db", poll_interval=60)
    ran: list[str] = []

    def wf(ctx: Context) -> None:
        ctx.step("a").run(lambda: ran.append("a"))
        ctx.timer("z", 0)
        ctx.step("b").run(lambda: ran.append("b"))

    engine.register("wf", wf)

    def cancel_once_ready(outcome: Any) -> None:
        if outcome.outcome == "ready" and not ran.count("cancel"):
            ran.append("cancel")
            engine.cancel("wf", "x")

    wrap_after(store, "suspend", cancel_once_ready)
    with engine:
        inv = engine.invoke("wf", instance_id="x")
        states = [inv.wait(timeout=10)]
        while states[-1] != Cancelled():
            states.append(inv.wait(timeout=10))
    engine.close()
    assert ran == ["a", "cancel"]


def test_a_cancel_from_another_engine_arms_no_timer_and_stops_the_next_step(
    tmp_path: Path,
) -> None:
    """Cancelled elsewhere while a step runs: the step is stored, no timer armed, no step after.

    The running engine polls once a minute, so only the store's own checks
    can stop it.
    """
    db = tmp_path / "db"
    engine = Engine.open(db, poll_interval=60)
    other = Engine.open(db)
    inside, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def a() -> str:
        inside.set()
        assert release.wait(10)
        ran.append("a")
        return "a"

    def wf(ctx: Context) -> None:
        ctx.step("a").run(a)
        ctx.timer("t", 3600)
        ctx.step("b").run(lambda: ran.append("b"))

    def wf_b(ctx: Context) -> None:
        ctx.step("a").run(a)
        ctx.step("b").run(lambda: ran.append("b"))

    engine.register("wf", wf)
    engine.register("wf_b", wf_b)
    with engine:
        for name in ("wf", "wf_b"):
            inside.clear()
            release.clear()
            inv = engine.invoke(name, instance_id=name)
            assert inside.wait(10)
            other.cancel(name, name)
            release.set()
            assert inv.wait(timeout=10) == Cancelled()
    with closing(sqlite3.connect(db)) as reader:
        timers = reader.execute("SELECT key FROM memable_timers").fetchall()
        steps = reader.execute(
            "SELECT instance_id, key, state FROM memable_steps ORDER BY 1").fetchall()
    other.close()
    engine.close()
    assert timers == []
    assert ran == ["a", "a"]
    assert steps == [("wf", "a", "completed"), ("wf_b", "a", "completed")]


def test_a_run_cancelled_in_its_last_step_ends_cancelled_without_an_error_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its end is not recorded (the instance is cancelled): it reports what the store holds."""
    engine = Engine.in_memory()
    entered, release = threading.Event(), threading.Event()
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda: entered.set() or release.wait(10)))
    with caplog.at_level(logging.INFO, logger="memable"), engine:
        inv = engine.invoke("wf", instance_id="x")
        assert entered.wait(10)
        engine.cancel("wf", "x")
        release.set()
        assert str(inv.wait(timeout=10)) == "cancelled"
    engine.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


# ---------------------------------------------------------------------- purge


def test_purge_deletes_only_finished_instances_older_than_the_cutoff(
    make_engine: Callable[..., Engine],
) -> None:
    """At T0+31d, purge(30 days) deletes the 3 finished at T0 and nothing else."""
    engine = make_engine(poll_interval=60)
    entered = threading.Event()
    release = threading.Event()

    def done(ctx: Context) -> int:
        return ctx.step("s").run(lambda: 1)

    def boom(ctx: Context) -> None:
        ctx.step("s").run(lambda: 1 / 0)

    def hold() -> str:
        entered.set()
        release.wait(10)
        return "held"

    def held(ctx: Context) -> str:
        ctx.step("first").run(lambda: "first")
        return ctx.step("held").run(hold)

    engine.register("done", done)
    engine.register("boom", boom)
    engine.register("waiter", waiter)
    engine.register("held", held)
    kept = [
        ("held", "running"), ("waiter", "suspended"), ("done", "recent-completed"),
    ]
    purged = [("done", "old-completed"), ("boom", "old-failed"), ("waiter", "old-cancelled")]
    with freeze_time(T0) as clock, engine:
        try:
            assert engine.invoke("done", instance_id="old-completed").wait(10) == Completed()
            assert isinstance(engine.invoke("boom", instance_id="old-failed").wait(10), Failed)
            assert engine.invoke("waiter", instance_id="old-cancelled").wait(10) == Suspended(
                "waiting for go"
            )
            engine.cancel("waiter", "old-cancelled")
            running = engine.invoke("held", instance_id="running")
            assert entered.wait(10)
            assert engine.invoke("waiter", instance_id="suspended").wait(10) == Suspended(
                "waiting for go"
            )
            clock.move_to(T0 + timedelta(days=20))
            recent = engine.invoke("done", instance_id="recent-completed")
            assert recent.wait(10) == Completed()
            clock.move_to(T0 + timedelta(days=31))
            kept_before: list[tuple[WorkflowMetadata, list[StepRecord]]] = [
                (metadata(engine, name, i), engine.steps(name, i)) for name, i in kept
            ]
            assert [step_rows(engine, name, i) for name, i in purged] == [1, 1, 1]

            assert engine.purge(older_than=timedelta(days=30)) == 3

            for name, instance_id in purged:
                assert engine.get_metadata(name, instance_id) is None
                with pytest.raises(InstanceNotFound):
                    engine.steps(name, instance_id)
                assert step_rows(engine, name, instance_id) == 0
            kept_after = [
                (metadata(engine, name, i), engine.steps(name, i)) for name, i in kept
            ]
            assert kept_after == kept_before
            assert [m.status for m, _ in kept_after] == [
                MetadataStatus.Running(),
                MetadataStatus.Suspended("waiting for go"),
                MetadataStatus.Completed(),
            ]
        finally:
            release.set()
        assert running.result(timeout=10) == "held"


def test_purge_with_zero_deletes_every_finished_instance(
    make_engine: Callable[..., Engine],
) -> None:
    """purge(older_than=0) deletes every Completed, Failed and Cancelled instance at once."""
    engine = make_engine()

    def boom(ctx: Context) -> None:
        ctx.step("s").run(lambda: 1 / 0)

    engine.register("done", lambda ctx: ctx.step("s").run(lambda: 1))
    engine.register("boom", boom)
    engine.register("waiter", waiter)
    with engine:
        assert engine.invoke("done", instance_id="a").wait(10) == Completed()
        assert isinstance(engine.invoke("boom", instance_id="b").wait(10), Failed)
        assert engine.invoke("waiter", instance_id="c").wait(10) == Suspended("waiting for go")
        engine.cancel("waiter", "c")
        assert engine.invoke("waiter", instance_id="d").wait(10) == Suspended("waiting for go")
        assert engine.purge(older_than=0) == 3
        left = [
            (name, i)
            for name in ("done", "boom", "waiter")
            for i, _ in engine.list_instances(name)
        ]
    assert left == [("waiter", "d")]


def test_purge_takes_float_seconds(make_engine: Callable[..., Engine]) -> None:
    """older_than in float seconds: 150.0 keeps an instance finished 100 s ago, 50.0 deletes it."""
    engine = make_engine(poll_interval=60)
    engine.register("done", lambda ctx: ctx.step("s").run(lambda: 1))
    with freeze_time(T0) as clock, engine:
        assert engine.invoke("done", instance_id="a").wait(10) == Completed()
        clock.move_to(T0 + timedelta(seconds=100))
        assert engine.purge(older_than=150.0) == 0
        assert engine.get_metadata("done", "a") is not None
        assert engine.purge(older_than=50.0) == 1
        assert engine.get_metadata("done", "a") is None


def test_purge_with_a_negative_duration_raises_and_deletes_nothing(
    make_engine: Callable[..., Engine],
) -> None:
    """purge(-1) and purge(timedelta(seconds=-1)) raise ValueError; nothing is deleted."""
    engine = make_engine()
    engine.register("done", lambda ctx: ctx.step("s").run(lambda: 1))
    with engine:
        assert engine.invoke("done", instance_id="a").wait(10) == Completed()
        with pytest.raises(ValueError, match="purge age"):
            engine.purge(older_than=-1)
        with pytest.raises(ValueError, match="purge age"):
            engine.purge(older_than=timedelta(seconds=-1))
        assert engine.get_metadata("done", "a") is not None


def test_purge_with_nothing_finished_returns_zero(make_engine: Callable[..., Engine]) -> None:
    """purge() on a store with only a suspended instance deletes nothing and returns 0."""
    engine = make_engine()
    engine.register("waiter", waiter)
    with engine:
        assert engine.invoke("waiter", instance_id="a").wait(10) == Suspended("waiting for go")
        before = dump(engine)
        assert engine.purge(older_than=0) == 0
        assert dump(engine) == before


def test_purge_keeps_a_parent_whose_child_lives_and_a_child_whose_parent_runs(
    make_engine: Callable[..., Engine],
) -> None:
    """The rules retention keeps hold for ``purge`` too: a failed parent whose resumed
    child waits stays (the child's end settles its step), and a finished child of a
    parent whose run is in flight stays (that run reads it); once both have ended, both
    go."""
    engine = make_engine()
    child = FailsThenWaits()
    in_step, release = threading.Event(), threading.Event()

    def hold() -> str:
        in_step.set()
        assert release.wait(10)
        return "held"

    def holder(ctx: Context) -> str:
        got = ctx.child("kid", "done")
        return f"{got} {ctx.step('hold').run(hold)}"

    engine.register("child", child)
    engine.register("parent", lambda ctx: str(ctx.child("kid", "child")))
    engine.register("done", lambda ctx: "kid done")
    engine.register("holder", holder)
    with engine:
        with pytest.raises(WorkflowFailed):
            engine.invoke("parent", instance_id="p").result(10)
        child.failing = False
        assert engine.resume("child", "p/kid").wait(10) == Suspended("finish")
        held = engine.invoke("holder", instance_id="h")
        try:
            assert in_step.wait(10)
            assert engine.purge(older_than=0) == 0
            assert engine.get_metadata("parent", "p") is not None
            assert engine.get_metadata("done", "h/kid") is not None
        finally:
            release.set()
        assert held.result(10) == "kid done held"
        assert engine.signal("child", "p/kid", "finish", "bye").result(10) == "bye"
        assert engine.purge(older_than=0) == 4
        assert [engine.get_metadata(w, i) for w, i in (
            ("parent", "p"), ("child", "p/kid"), ("holder", "h"), ("done", "h/kid"))] == [
            None, None, None, None]


def test_purge_of_more_than_a_batch_takes_them_all_in_one_call(
    make_engine: Callable[..., Engine],
) -> None:
    """1,203 finished instances: one purge deletes them all, with their steps."""
    engine = make_engine()
    engine.register("done", lambda ctx: ctx.step("s").run(lambda: 1))
    with engine:
        for i in range(1203):
            engine.invoke("done", instance_id=f"d-{i}")
        engine.wait_all()
        assert engine.purge(older_than=0) == 1203
        assert engine.list_instances("done") == []
        assert query(engine, "SELECT count(*) FROM memable_steps") == [(0,)]


# ---------------------------------------------------------------------- dead owners


def _dead_owner_reaped(engine: Engine, pid: int) -> bool:
    """Whether the owner row of the killed engine (process ``pid``) is gone."""
    return query(engine, "SELECT count(*) FROM memable_owners WHERE pid = ?", (pid,)) == [(0,)]


def test_a_family_cancelled_while_its_engine_is_dead_is_purged(
    shared_store: dict[str, Any], open_shared: Callable[..., Engine], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A parent and its child, both running in an engine that is SIGKILLed, are cancelled
    from another engine (which does not run their workflows, so nothing recovers them):
    the cancel keeps the dead owner, as it keeps a live one, and nothing ever clears it;
    purge takes both all the same (they were kept for ever: the child owned, the
    parent with an owned child)."""
    if "schema" in shared_store:
        monkeypatch.setenv("MEMABLE_PROC_SCHEMA", shared_store["schema"])
    engine = open_shared(poll_interval=0.05)
    proc = subprocess.Popen(
        [sys.executable, PROCS, "family", str(shared_store["target"]), str(tmp_path / "log")],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "children started\n"
        # The child's run has claimed it too: both are the doomed engine's.
        until(lambda: query(engine, "SELECT count(*) FROM memable_instances "
                                    "WHERE owner IS NOT NULL AND status = 'running'") == [(2,)])
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        if proc.stdout is not None:
            proc.stdout.close()
    with engine:
        until(lambda: _dead_owner_reaped(engine, proc.pid))  # its first look reaps it
        engine.cancel("parent", "p")
        assert metadata(engine, "child", "p/kid").status == MetadataStatus.Cancelled()
        assert query(engine, "SELECT count(*) FROM memable_instances WHERE owner IS NOT NULL") == [
            (2,)]
        assert engine.purge(older_than=0) == 2
        assert engine.get_metadata("parent", "p") is None
        assert engine.get_metadata("child", "p/kid") is None


def test_an_instance_timed_out_while_its_engine_is_dead_is_purged(
    shared_store: dict[str, Any], open_shared: Callable[..., Engine], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An instance running in an engine that is SIGKILLed mid-step times out, cancelled
    by another engine's timer thread (which does not run its workflow): it ends with its
    dead owner, and retention's rules purge it all the same."""
    if "schema" in shared_store:
        monkeypatch.setenv("MEMABLE_PROC_SCHEMA", shared_store["schema"])
    engine = open_shared(poll_interval=0.05)
    with killed_in_a_step(shared_store["target"], tmp_path / "log") as pid:
        # Its workflow timeout passed long ago (as if invoked with timeout=5).
        write(engine, "UPDATE memable_instances SET timeout = 5, timeout_at = 1 "
              "WHERE instance_id = 'crash'")
    with engine:
        until(lambda: _dead_owner_reaped(engine, pid))
        until(lambda: metadata(engine, "ten", "crash").status == MetadataStatus.Cancelled())
        assert query(engine, "SELECT message, owner IS NOT NULL FROM memable_instances") == [
            ("timed out after 5s", True)]
        assert engine.purge(older_than=0) == 1
        assert engine.get_metadata("ten", "crash") is None
