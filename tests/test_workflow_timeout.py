"""Operations (issue 26, point 4): a workflow timeout, ``register``/``workflow(timeout=)`` and
``invoke(timeout=)``: a durable deadline from the instance's creation; when it passes the
instance is cancelled as ``cancel`` does (children too) and ends Cancelled() with the
status "timed out after <duration>", whether it is running, suspended or queued, by
whichever engine looks first, after the engine that invoked it was killed too.

Time is moved with freezegun (``memable.testing.advance``), or, across processes, the
deadline is a fraction of a second and the test waits on the instance's updates.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from helpers import T0, HeldLook, cli, store_of, traced, until
from werkzeug.test import Client

from memable import (
    Cancelled,
    ChildFailed,
    Context,
    Engine,
    InstanceFinished,
    MetadataStatus,
    Queued,
)
from memable._sqlite.store import SQLiteStore
from memable._store.sql import instances as instances_sql
from memable.testing import advance
from memable.web import app

TIMEOUT = 10.0
#: The keys of the steps that executed, in order ("{instance} {key}").
RAN: list[str] = []
#: Released by a test to let a step that waits on it return.
GATE = threading.Event()
#: Set by the first step of ``two_steps`` as it begins (its run is then in flight).
IN_STEP = threading.Event()


def waits_for_approval(ctx: Context) -> str:
    RAN.append(f"{ctx.instance_id} start")
    return str(ctx.suspend("approval:v1"))


def two_steps(ctx: Context) -> int:
    def first() -> None:
        RAN.append(f"{ctx.instance_id} first")
        IN_STEP.set()
        GATE.wait(TIMEOUT)

    ctx.step("first:v1").run(first)
    return ctx.step("second:v1").run(lambda: RAN.append(f"{ctx.instance_id} second") or 2)


def parent(ctx: Context) -> Any:
    return ctx.child("child:v1", "waits_for_approval")


@pytest.fixture
def engine(make_engine: Callable[..., Engine]) -> Iterator[Engine]:
    RAN.clear()
    GATE.clear()
    IN_STEP.clear()
    engine = make_engine(poll_interval=60)  # the tests fire what is due
    engine.register("waits_for_approval", waits_for_approval, timeout=timedelta(hours=1))
    engine.register("two_steps", two_steps)
    engine.register("parent", parent, timeout=600)
    engine.queue("one-at-a-time", concurrency=1)
    engine.register("queued_two_steps", two_steps, queue="one-at-a-time")
    with engine:
        yield engine
    GATE.set()


def _metadata(engine: Engine, workflow: str, instance_id: str) -> Any:
    meta = engine.get_metadata(workflow, instance_id)
    assert meta is not None
    return meta


def test_a_suspended_instance_times_out_when_its_deadline_passes(engine: Engine) -> None:
    """A suspended instance registered with a one-hour timeout is untouched a minute before
    its deadline and cancelled at it, with the status "timed out after 1h" and its end at
    the deadline; a later signal gets ``InstanceFinished``."""
    with freeze_time("2026-12-06 10:00:00") as clock:
        inv = engine.invoke("waits_for_approval", instance_id="a")
        assert str(inv.wait(TIMEOUT)) == "suspended: approval:v1"
        assert advance(engine, clock, timedelta(minutes=59)) == 0
        assert str(inv.state) == "suspended: approval:v1"
        assert advance(engine, clock, timedelta(minutes=1)) == 1
        assert isinstance(inv.wait(TIMEOUT), Cancelled)
    meta = _metadata(engine, "waits_for_approval", "a")
    assert meta.status == MetadataStatus.Cancelled()
    assert meta.status_message == "timed out after 1h"
    assert meta.completed_at == datetime(2026, 12, 6, 11, 0, tzinfo=timezone.utc)
    with pytest.raises(InstanceFinished):
        engine.signal("waits_for_approval", "a", "approval:v1", True)


def test_a_look_under_way_when_the_clock_is_frozen_in_the_past_times_nothing_out(
    make_engine: Callable[..., Engine],
) -> None:
    """A look of the timer thread that read the real time, then the test freezes the clock
    a day earlier and invokes: the instance, whose deadline is an hour after the frozen
    time, is not timed out by that earlier reading (it was, the moment it was made: the
    flaky 'cancelled' of the tests above on a date now past). Forced: the look is held
    just after its reading until the instance is suspended."""
    look = HeldLook()
    engine = make_engine(poll_interval=60, clock=look.clock)
    engine.register("waits_for_approval", waits_for_approval, timeout=timedelta(hours=1))
    with engine:
        look.hold(engine)
        with freeze_time(datetime.now(timezone.utc) - timedelta(days=1)) as clock:
            inv = engine.invoke("waits_for_approval", instance_id="a")
            assert str(inv.wait(TIMEOUT)) == "suspended: approval:v1"
            look.release()
            assert str(inv.state) == "suspended: approval:v1"
            assert advance(engine, clock, timedelta(minutes=59)) == 0
            assert str(inv.state) == "suspended: approval:v1"
            assert advance(engine, clock, timedelta(minutes=1)) == 1
            assert isinstance(inv.wait(TIMEOUT), Cancelled)


def test_time_out_judges_what_it_read_by_a_reading_taken_after(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Store.time_out judges the instances it read by a reading of the clock taken after
    the read, never by the one it chose them by: forced with a clock that reads a day past
    the deadline until the store has read the due instances (a look outside a transaction,
    then a second time in its transaction, on either store), and the true time after. The
    instance is left. The reads are counted as the transaction body runs them (a traced
    PostgreSQL connection notes a transaction's statements only when it ends)."""
    engine = make_engine(poll_interval=60)
    engine.register("waits_for_approval", waits_for_approval, timeout=timedelta(hours=1))
    with freeze_time(T0):
        engine.start()
        assert str(engine.invoke("waits_for_approval", instance_id="a").wait(TIMEOUT)) == (
            "suspended: approval:v1")
        engine.stop()  # the store stays open; no look of the engine's own runs meanwhile
    store, deadline = store_of(engine), T0.timestamp() + 3600
    if isinstance(store, SQLiteStore):
        from memable._sqlite.transaction import SQLiteTransaction as transaction
    else:
        from memable._postgres.transaction import (  # type: ignore[assignment]
            PostgresTransaction as transaction,
        )
    statements: list[str] = []
    execute = transaction.execute

    def noted(self: Any, template: str, params: Any = None) -> Any:
        statements.append(template)
        return execute(self, template, params)

    monkeypatch.setattr(transaction, "execute", noted)

    def clock() -> float:
        read = sum("timeout_at <= " in statement for statement in statements)
        return deadline + 86400 if read < 2 else deadline - 1

    assert store.time_out(clock, T0.timestamp()) == []
    monkeypatch.undo()
    assert str(engine.invocation("waits_for_approval", "a").state) == "suspended: approval:v1"
    timed_out = store.time_out(lambda: deadline, T0.timestamp())
    assert [t.instance_id for t in timed_out] == ["a"]


def test_a_running_instance_stops_at_its_next_step_boundary(engine: Engine) -> None:
    """An instance whose deadline passes while its first step runs (held on an event) is
    cancelled at once; that step still finishes and is stored, and the next step never
    starts."""
    with freeze_time("2026-12-06 10:00:00") as clock:
        inv = engine.invoke("two_steps", instance_id="r", timeout=30)
        assert IN_STEP.wait(TIMEOUT)
        assert advance(engine, clock, 30) == 1  # the first step is in flight
        assert _metadata(engine, "two_steps", "r").status == MetadataStatus.Cancelled()
        GATE.set()  # the step in flight finishes and is stored; the next never starts
        assert isinstance(inv.wait(TIMEOUT), Cancelled)
    assert RAN == ["r first"]
    steps = {s.key: s.state for s in engine.steps("two_steps", "r")}
    assert steps == {"first:v1": "completed"}
    assert _metadata(engine, "two_steps", "r").status_message == "timed out after 30s"


def test_a_queued_instance_times_out_without_ever_running(engine: Engine) -> None:
    """An instance still queued behind another that holds the queue's only slot is cancelled
    when its deadline passes and never runs, while the holder completes."""
    with freeze_time("2026-12-06 10:00:00") as clock:
        holder = engine.invoke("queued_two_steps", instance_id="holder")
        waiting = engine.invoke("queued_two_steps", instance_id="waiting", timeout=60)
        assert IN_STEP.wait(TIMEOUT)  # the holder runs: the other waits for the slot
        assert isinstance(waiting.state, Queued)
        assert advance(engine, clock, 60) == 1
        assert isinstance(waiting.wait(TIMEOUT), Cancelled)
        GATE.set()
        assert holder.result(TIMEOUT) == 2
    assert "waiting first" not in RAN
    assert _metadata(engine, "queued_two_steps", "waiting").status_message == (
        "timed out after 1m")


def test_a_timed_out_parent_cancels_its_children(engine: Engine) -> None:
    """A parent whose timeout passes while it waits for its child is cancelled, and so is
    the child, as ``cancel`` does."""
    with freeze_time("2026-12-06 10:00:00") as clock:
        inv = engine.invoke("parent", instance_id="p")
        assert str(inv.wait(TIMEOUT)) == "suspended: child child:v1"
        children = [i for i, _ in engine.list_instances("waits_for_approval")]
        assert len(children) == 1
        assert advance(engine, clock, 600) == 1
        assert isinstance(inv.wait(TIMEOUT), Cancelled)
    child = _metadata(engine, "waits_for_approval", children[0])
    assert child.status == MetadataStatus.Cancelled()
    assert _metadata(engine, "parent", "p").status_message == "timed out after 10m"


def test_a_timed_out_child_fails_its_parents_step(make_engine: Callable[..., Engine]) -> None:
    """A child cancelled by its own timeout raises ``ChildFailed`` in its parent, which can
    catch it."""
    engine = make_engine(poll_interval=60)
    engine.register("waits_for_approval", waits_for_approval, timeout=5)

    def catches(ctx: Context) -> str:
        try:
            return str(ctx.child("child:v1", "waits_for_approval"))
        except ChildFailed as err:
            return f"child failed: {err}"

    engine.register("catches", catches)
    with freeze_time("2026-12-06 10:00:00") as clock, engine:
        inv = engine.invoke("catches", instance_id="p")
        assert str(inv.wait(TIMEOUT)) == "suspended: child child:v1"
        assert advance(engine, clock, 5) == 1
        assert "child failed" in inv.result(TIMEOUT)


def test_invoke_timeout_overrides_the_registered_one(engine: Engine) -> None:
    """``invoke(timeout=...)`` replaces the workflow's registered timeout: the instance
    times out after five minutes, not the registered hour."""
    with freeze_time("2026-12-06 10:00:00") as clock:
        inv = engine.invoke("waits_for_approval", instance_id="a", timeout=timedelta(minutes=5))
        inv.wait(TIMEOUT)
        assert advance(engine, clock, timedelta(minutes=5)) == 1
        assert isinstance(inv.wait(TIMEOUT), Cancelled)
    assert _metadata(engine, "waits_for_approval", "a").status_message == "timed out after 5m"


def test_the_timer_thread_wakes_for_a_new_instances_deadline(
    make_engine: Callable[..., Engine],
) -> None:
    """No test clock here: the engine's own timer thread, which polls the store only
    every minute and beats its heart every 40 s (its lease 120 s), times the instance out
    a fraction of a second after it was made (the invoke told it of the new deadline)."""
    engine = make_engine(poll_interval=60, lease=120)
    engine.register("waits_for_approval", waits_for_approval)
    with engine:
        inv = engine.invoke("waits_for_approval", instance_id="soon", timeout=0.2)
        until(lambda: isinstance(inv.state, Cancelled))
        meta = _metadata(engine, "waits_for_approval", "soon")
    assert meta.status_message == "timed out after 0.2s"


def test_a_look_with_no_timeout_due_opens_no_transaction(
    make_engine: Callable[..., Engine],
) -> None:
    """Every look of every engine's timer thread asks for due timeouts: with none due, it
    is one read and no transaction (a transaction there cost round trips at each look,
    and interleaved with a run's own in a statement trace). The engine's own threads
    are idle meanwhile: a poll every minute, a heartbeat every 40 s."""
    engine = make_engine(poll_interval=60, lease=120)
    engine.register("waits_for_approval", waits_for_approval, timeout=3600)
    with engine:
        engine.invoke("waits_for_approval", instance_id="later").wait(TIMEOUT)
        with traced(engine) as statements:
            assert engine.fire_due_timers() == 0
    assert statements  # it did look
    words = {sql.split(None, 1)[0].upper() for sql in statements}
    assert words <= {"SELECT"}, statements


def test_an_instance_that_ended_first_is_left_as_it_ended(engine: Engine) -> None:
    """An instance that completes before its deadline stays completed when the deadline
    passes, and no deadline is left armed."""
    with freeze_time("2026-12-06 10:00:00") as clock:
        done = engine.invoke("two_steps", instance_id="done", timeout=10)
        GATE.set()
        assert done.result(TIMEOUT) == 2
        assert advance(engine, clock, 3600) == 0
    meta = _metadata(engine, "two_steps", "done")
    assert meta.status == MetadataStatus.Completed()
    assert store_of(engine).next_deadline() is None  # nothing left armed


def test_no_timeout_is_armed_unless_asked_for(engine: Engine) -> None:
    """An instance of a workflow registered and invoked without a timeout stores no timeout
    and no deadline."""
    engine.invoke("two_steps", instance_id="plain")
    row = store_of(engine).get_instance("two_steps", "plain")
    assert row is not None
    assert row.timeout is None
    assert row.timeout_at is None
    GATE.set()


@pytest.mark.parametrize(("timeout", "error"), [
    (0, ValueError), (-1, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
    ("1h", TypeError), (timedelta(days=3_000_000), ValueError),
])
def test_a_bad_timeout_is_refused_storing_nothing(
    engine: Engine, timeout: Any, error: type[Exception]
) -> None:
    """``invoke`` refuses a zero, negative, NaN, infinite, string or out-of-range timeout,
    naming it, and stores no instance."""
    with pytest.raises(error, match="timeout"):
        engine.invoke("two_steps", instance_id="bad", timeout=timeout)
    assert engine.get_metadata("two_steps", "bad") is None


@pytest.mark.parametrize("timeout", [0, -5, "1h"])
def test_register_refuses_a_bad_timeout_naming_the_workflow(timeout: Any) -> None:
    """``register`` refuses a zero, negative or string timeout with an error naming the
    workflow."""
    engine = Engine.in_memory()
    with pytest.raises((ValueError, TypeError), match="timeout of workflow 'w'"):
        engine.register("w", waits_for_approval, timeout=timeout)
    engine.close()


def test_a_stale_read_never_times_an_instance_out_twice(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two engines read the same due instance; the second one's transaction finds it
    ended (the first timed it out) and leaves it: forced by making the second's read
    return the instance whatever its status. The engine that made the instance stops
    first: its timer thread, which wakes at the deadline, would otherwise time it out
    itself whenever the test took more than that second of real time to get there."""
    path = tmp_path / "db"
    engine = Engine.open(path, poll_interval=60)
    engine.register("waits_for_approval", waits_for_approval, timeout=1)
    with freeze_time("2026-12-06 10:00:00") as clock:
        with engine:  # stored suspended, with its deadline
            engine.invoke("waits_for_approval", instance_id="a").wait(TIMEOUT)
        clock.tick(1)
        other = SQLiteStore(path, "full")
        try:
            now = datetime(2026, 12, 6, 10, 0, 1, tzinfo=timezone.utc)
            first = other.time_out(now.timestamp, now.timestamp())
            assert [(t.instance_id, t.message) for t in first] == [("a", "timed out after 1s")]
            row = other.get_instance("waits_for_approval", "a")
            monkeypatch.setattr(instances_sql, "DUE_TIMEOUTS",
                                "SELECT workflow, instance_id FROM memable_instances "
                                "WHERE :now > 0")
            later = now + timedelta(seconds=5)
            assert other.time_out(later.timestamp, later.timestamp()) == []
            assert other.get_instance("waits_for_approval", "a") == row
        finally:
            other.close()


_KILLED_ENGINE = """
import sys, threading
from memable import Engine
target, schema = sys.argv[1], (sys.argv[2] or None)
engine = Engine.open(target, schema=schema) if schema else Engine.open(target)
def hangs(ctx):
    ctx.step("hang:v1").run(lambda: (print("in the step", flush=True), threading.Event().wait()))
engine.register("hangs", hangs, timeout=1.5)
engine.start()
engine.invoke("hangs", instance_id="h")
threading.Event().wait()
"""


@pytest.mark.heavy
def test_the_timeout_holds_after_the_engine_that_invoked_it_is_killed(
    shared_store: dict[str, Any], open_shared: Callable[..., Engine],
) -> None:
    """A real process invokes an instance with a 1.5 s timeout and is killed (SIGKILL)
    inside its step; an engine on the same store that does not even run the workflow
    cancels it when the deadline passes (its lease has not run out: nobody took it)."""
    target = str(shared_store["target"])
    proc = subprocess.Popen(
        [sys.executable, "-c", _KILLED_ENGINE, target, shared_store.get("schema") or ""],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "in the step"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    other = open_shared(poll_interval=60, lease=120, recover=False)
    with other:  # another process's commit offers no event: look until it is there
        until(lambda: isinstance(other.invocation("hangs", "h").state, Cancelled))
        meta = other.get_metadata("hangs", "h")
        steps = other.steps("hangs", "h")
    assert meta is not None
    assert meta.status == MetadataStatus.Cancelled()
    assert meta.status_message == "timed out after 1.5s"
    assert [s.key for s in steps if s.state == "completed"] == []


def test_memable_show_names_the_timeout_and_the_status(tmp_path: Path) -> None:
    """``memable show`` and the dashboard's instance page give the timeout and its deadline
    while the instance waits, and "timed out after 1m 30s" once it has passed."""
    path = tmp_path / "show.db"
    on_file = Engine.open(path, poll_interval=60)
    on_file.register("waits_for_approval", waits_for_approval, timeout=90)
    with freeze_time("2026-12-06 10:00:00") as clock, on_file:
        on_file.invoke("waits_for_approval", instance_id="a").wait(TIMEOUT)
        shown = cli("show", str(path), "waits_for_approval", "a")
        assert "timeout    1m 30s (at 2026-12-06T10:01:30+00:00)" in shown.output
        advance(on_file, clock, 90)
        on_file.invocation("waits_for_approval", "a").wait(TIMEOUT)
        shown = cli("show", str(path), "waits_for_approval", "a")
        page = Client(app(on_file)).get("/instance?workflow=waits_for_approval&id=a").text
    assert "timed out after 1m 30s" in shown.output
    assert '<td id="timeout">1m 30s, at <time datetime="2026-12-06T10:01:30+00:00"' in page
    assert "timed out after 1m 30s" in page


def test_a_fork_times_out_counting_from_its_own_creation(engine: Engine) -> None:
    """A fork of an instance with a timeout gets the same timeout counted from the fork's
    creation, not from the source's: when the source's deadline passes the fork still waits,
    until its own."""
    with freeze_time("2026-12-06 10:00:00") as clock:
        engine.invoke("waits_for_approval", instance_id="a", timeout=60).wait(TIMEOUT)
        advance(engine, clock, 45)
        fork = engine.fork("waits_for_approval", "a", new_instance_id="b")
        assert str(fork.wait(TIMEOUT)) == "suspended: approval:v1"
        assert advance(engine, clock, 15) == 1  # the source's deadline
        assert advance(engine, clock, 44) == 0
        assert advance(engine, clock, 1) == 1  # the fork's: 60 s after it was made
    assert _metadata(engine, "waits_for_approval", "b").status_message == (
        "timed out after 1m")
