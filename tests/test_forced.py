"""Interleavings forced with hooks: each test guards one correctness fix of the engine.

Each wraps one store operation (or the group commit's queue) to make the
race happen every time, instead of repeating rounds and hoping.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from helpers import until

from memable import Cancelled, Completed, Context, Engine, Invocation, StorageError
from memable._clock import Clock
from memable._run.options import Options
from memable._sqlite.group_commit import GroupCommit
from memable._sqlite.store import SQLiteStore


class _Interrupting:
    """A connection whose ``n``-th COMMIT raises KeyboardInterrupt (as Ctrl-C would)."""

    def __init__(self, conn: sqlite3.Connection, n: int) -> None:
        self._conn = conn
        self._commits_left = n

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "COMMIT":
            self._commits_left -= 1
            if self._commits_left == 0:
                raise KeyboardInterrupt
        return self._conn.execute(sql, *args)

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction


def test_group_commit_fails_closed_when_the_leader_is_interrupted(tmp_path: Path) -> None:
    """An interrupt at a batch's COMMIT fails every writer of it and leaves no open transaction.

    Writer A commits alone while B, C and D queue; B leads their batch and
    its COMMIT is interrupted: B sees the interrupt, C and D a StorageError,
    none of their rows is stored, and a later write commits on its own.
    """
    path = tmp_path / "t.db"
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("CREATE TABLE t (x TEXT)")
    proxy = _Interrupting(conn, 2)
    lock = threading.Lock()
    commits = GroupCommit(lock, str(path), lambda: proxy)  # type: ignore[arg-type,return-value]
    three_queued = threading.Event()
    commits.on_queue = lambda n: three_queued.set() if n == 3 else None

    def insert(x: str, wait: bool = False) -> Callable[[sqlite3.Connection], None]:
        def body(c: sqlite3.Connection) -> None:
            if wait:
                assert three_queued.wait(10)
            c.execute("INSERT INTO t VALUES (?)", (x,))

        return body

    outcomes: dict[str, BaseException | None] = {}

    def write(x: str, wait: bool = False) -> None:
        try:
            commits.write("insert", None, None, None, insert(x, wait))
            outcomes[x] = None
        except BaseException as exc:
            outcomes[x] = exc

    a = threading.Thread(target=write, args=("a", True))
    a.start()
    others = [threading.Thread(target=write, args=(x,)) for x in "bcd"]
    for thread in others:
        thread.start()
    for thread in [a, *others]:
        thread.join(10)

    assert outcomes["a"] is None
    failed = {x: type(outcomes[x]).__name__ for x in "bcd"}
    assert sorted(failed.values()) == ["KeyboardInterrupt", "StorageError", "StorageError"]
    assert not conn.in_transaction
    commits.write("insert", None, None, None, insert("e"))
    with closing(sqlite3.connect(path)) as reader:
        rows = sorted(x for (x,) in reader.execute("SELECT x FROM t"))
    assert rows == ["a", "e"]
    conn.close()


def _slow_polling_engine(store: str, tmp_path: Path) -> Engine:
    """An engine in memory or on a file that polls once a minute, its lease far off: only
    what the test forces can carry an instance on."""
    options: dict[str, Any] = {"poll_interval": 60, "lease": 600}
    if store == "memory":
        return Engine.in_memory(**options)
    return Engine.open(tmp_path / "db", **options)


def _wrap(obj: object, name: str, after: Callable[[Any], None]) -> None:
    """Make ``obj.name(...)`` call ``after(result)`` once the real method returned."""
    real = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        after(result)
        return result

    setattr(obj, name, wrapper)


def test_a_cancel_before_the_run_goes_on_past_a_satisfied_wait_stops_it(tmp_path: Path) -> None:
    """A cancel between a zero timer's firing and the run going on: no later step runs."""
    engine = Engine.open(tmp_path / "db", poll_interval=60)
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

    _wrap(engine._store, "suspend", cancel_once_ready)
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
        timers = reader.execute("SELECT key FROM timers").fetchall()
        steps = reader.execute("SELECT instance_id, key, state FROM steps ORDER BY 1").fetchall()
    other.close()
    engine.close()
    assert timers == []
    assert ran == ["a", "a"]
    assert steps == [("wf", "a", "completed"), ("wf_b", "a", "completed")]


@pytest.mark.parametrize("store", ["memory", "file"])
def test_a_run_whose_end_could_not_be_recorded_runs_again_and_completes(
    tmp_path: Path, store: str
) -> None:
    """The end write fails once: watchers keep following; the engine runs it again to the end."""
    options: dict[str, Any] = {"poll_interval": 0.05}
    engine = (
        Engine.in_memory(**options) if store == "memory"
        else Engine.open(tmp_path / "db", **options)
    )
    ran: list[int] = []
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda: ran.append(1) or 7))
    real = engine._store.finish
    failures: list[str] = []

    def finish_failing_once(*args: Any, **kwargs: Any) -> bool:
        if not failures:
            failures.append("failed")
            raise StorageError("cannot record the run (forced)")
        return real(*args, **kwargs)

    engine._store.finish = finish_failing_once  # type: ignore[method-assign]
    with engine:
        inv = engine.invoke("wf", instance_id="x")
        assert inv.result(timeout=10) == 7
    engine.close()
    assert failures == ["failed"]
    assert ran == [1]


@pytest.mark.parametrize("store", ["memory", "file"])
def test_a_signal_after_the_suspension_is_recorded_but_before_the_run_ended_runs_it_again(
    tmp_path: Path, store: str
) -> None:
    """A signal in the window between recording the suspension and the run's end is not lost.

    The signal is sent from inside the store's suspend, right after it
    committed: the run is still active, so only the re-run at its end (not
    the poll, once a minute here, nor the heartbeat's look every lease / 3)
    can carry the instance on.
    """
    engine = _slow_polling_engine(store, tmp_path)
    engine.register("wf", lambda ctx: ctx.suspend("go") + 1)
    sent: list[str] = []

    def signal_once_waiting(outcome: Any) -> None:
        if outcome.outcome == "waiting" and not sent:
            sent.append("go")
            engine.signal("wf", "x", "go", 41)

    _wrap(engine._store, "suspend", signal_once_waiting)
    with engine:
        assert engine.invoke("wf", instance_id="x").result(timeout=10) == 42
    engine.close()
    assert sent == ["go"]


@pytest.mark.parametrize("store", ["memory", "file"])
def test_the_wait_of_a_signal_that_came_as_a_run_ended_follows_the_run_it_caused(
    tmp_path: Path, store: str
) -> None:
    """signal().wait() returns how the run the signal causes ends, not the end of the run
    that was recording its suspension when the signal came.

    Forced as above: the signal is sent from inside the store's suspend; the
    run it causes is held before it claims the instance, which the store
    still shows suspended. The watch must stay active across the hand-over
    (it went inactive, and wait returned the stored Suspended).
    """
    engine = _slow_polling_engine(store, tmp_path)
    engine.register("wf", lambda ctx: ctx.suspend("go") + 1)
    signalled: list[Invocation] = []
    sent, claiming, release = threading.Event(), threading.Event(), threading.Event()

    def signal_once_waiting(outcome: Any) -> None:
        if outcome.outcome == "waiting" and not signalled:
            signalled.append(engine.signal("wf", "x", "go", 41))
            sent.set()

    _wrap(engine._store, "suspend", signal_once_waiting)
    begin_run = engine._store.begin_run

    def held_second_claim(*args: Any, **kwargs: Any) -> Any:
        if sent.is_set():
            claiming.set()
            assert release.wait(10)
        return begin_run(*args, **kwargs)

    engine._store.begin_run = held_second_claim  # type: ignore[method-assign]
    with engine:
        engine.invoke("wf", instance_id="x")
        assert sent.wait(10)
        assert claiming.wait(10)
        # The run the signal caused has not claimed the instance yet: still waiting.
        with pytest.raises(TimeoutError):
            signalled[0].wait(timeout=0.2)
        release.set()
        assert signalled[0].wait(timeout=10) == Completed()
        assert signalled[0].result(timeout=10) == 42
    engine.close()


def _clocked_engine() -> tuple[Engine, list[float]]:
    """An in-memory engine on the test's wall clock (``now[0]``); no poll nor heartbeat soon."""
    now = [1_800_000_000.0]
    clock = Clock(wall=lambda: now[0])
    engine = Engine(SQLiteStore(None, "full"), Options(poll_interval=60, lease=600, clock=clock))
    return engine, now


def test_timers_and_leases_read_the_clock_the_engine_is_given() -> None:
    """An engine given its own clock fires a timer when that clock says so, without freezegun."""
    engine, now = _clocked_engine()
    engine.register("wf", lambda ctx: ctx.timer("t", 3600) or "woke")
    with engine:
        inv = engine.invoke("wf", instance_id="x")
        assert str(inv.wait(timeout=10)) == "suspended: timer t"
        assert engine.fire_due_timers() == 0
        now[0] += 3600
        assert engine.fire_due_timers() == 1
        assert inv.result(timeout=10) == "woke"
    engine.close()


def test_a_run_that_ends_while_the_poll_reads_the_store_is_not_taken_for_lost(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The poll sees the instance owned and running; the run ends before it checks: no re-run.

    Without the guard, the poll took the ended run for one whose end was not
    recorded and started a spurious recovery run that watchers saw.
    """
    engine = Engine.open(tmp_path / "db", poll_interval=60, lease=600)
    inside, release = threading.Event(), threading.Event()

    def wf(ctx: Context) -> str:
        ctx.step("a").run(lambda: inside.set() or release.wait(10))
        return str(ctx.suspend("gate"))

    engine.register("wf", wf)
    runner = engine._runner
    real = engine._store.look_around
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
        engine._store.look_around = look_then_let_the_run_end  # type: ignore[method-assign]
        runner._look_around(0.0)
        engine._store.look_around = real  # type: ignore[method-assign]
        assert runner._active == {}
        assert "did not record its end" not in caplog.text
        assert engine.signal("wf", "x", "gate", 5).result(timeout=10) == "5"
    engine.close()


def test_a_signal_stored_after_the_run_read_its_steps_refuses_the_step_it_names(
    tmp_path: Path,
) -> None:
    """A signal for b stored after the run read its steps, before b starts: b never runs.

    It is sent right after step a is stored, the run's memo has no b, and b
    is not yet in flight: the signal is accepted, and the run refuses the key.
    """
    engine = Engine.open(tmp_path / "db", poll_interval=60)
    ran: list[str] = []

    def wf(ctx: Context) -> str:
        ctx.step("a").run(lambda: ran.append("a"))
        return str(ctx.step("b").run(lambda: ran.append("b") or "own"))

    engine.register("wf", wf)

    def signal_b_after_a(status: Any) -> None:
        if ran == ["a"]:
            ran.append("signal")
            sender = threading.Thread(target=engine.signal, args=("wf", "x", "b", "s"))
            sender.start()
            sender.join(10)

    _wrap(engine._store, "save_step", signal_b_after_a)
    with engine:
        state = engine.invoke("wf", instance_id="x").wait(timeout=10)
    engine.close()
    assert ran == ["a", "signal"]
    assert state.message is not None
    assert "invalid key 'b' (it holds a signal" in state.message


def _before(obj: object, name: str, first: Callable[..., None]) -> None:
    """Make ``obj.name(...)`` call ``first(*args)`` just before the real method."""
    real = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        first(*args)
        return real(*args, **kwargs)

    setattr(obj, name, wrapper)


def test_a_suspend_point_reached_after_a_takeover_writes_nothing(tmp_path: Path) -> None:
    """Another engine takes the instance just before the run records its suspension.

    The suspension's write is fenced like a step's: refused, nothing stored
    for the key, the instance left to its new owner.
    """
    db = tmp_path / "db"
    engine = Engine.open(db, poll_interval=60)
    engine.register("wf", lambda ctx: ctx.suspend("approval:v1"))

    def take_over(waiting: Any, *rest: Any) -> None:
        with closing(sqlite3.connect(db)) as other, other:
            other.execute("UPDATE instances SET owner = 'another-engine'")

    _before(engine._store, "suspend", take_over)
    with engine:  # leaving waits for the run here to end
        engine.invoke("wf", instance_id="x")
    with closing(sqlite3.connect(db)) as reader:
        rows = reader.execute("SELECT key FROM steps").fetchall()
        owner = reader.execute("SELECT status, owner FROM instances").fetchall()
    engine.close()
    assert rows == []
    assert owner == [("running", "another-engine")]


def test_a_signal_from_elsewhere_just_before_the_suspension_is_recorded_goes_on_at_once(
    tmp_path: Path,
) -> None:
    """The signal lands after the run read the key and before it records its suspension.

    The suspension sees it and the run goes on in the same thread: no poll
    (a minute away) nor heartbeat (200 s) is needed.
    """
    db = tmp_path / "db"
    # Neither a poll nor a heartbeat comes within the test.
    engine = Engine.open(db, poll_interval=60, lease=600)
    other = Engine.open(db, poll_interval=60, lease=600)  # runs nothing: stores the signal
    other.start()
    engine.register("wf", lambda ctx: f"approved by {ctx.suspend('approval:v1')}")

    def signal_first(waiting: Any, *rest: Any) -> None:
        other.signal("wf", "x", "approval:v1", "ana")

    _before(engine._store, "suspend", signal_first)
    with engine:
        assert engine.invoke("wf", instance_id="x").result(timeout=10) == "approved by ana"
    other.close()
    engine.close()


def test_a_run_that_reaches_its_timer_after_the_deadline_but_before_it_fired_goes_on() -> None:
    """The clock passes the deadline with the timer thread asleep; a resume replays to it.

    The timer row keeps its first deadline (a later run does not move it),
    and a run that reaches a timer already due fires it itself and goes on.
    """
    engine, now = _clocked_engine()
    engine.register("wf", lambda ctx: ctx.timer("t", 3600) or "woke")

    def deadlines() -> list[float]:
        rows = engine._store.read_rows("timers", "SELECT deadline FROM timers", {})
        return [row["deadline"] for row in rows]

    with engine:
        inv = engine.invoke("wf", instance_id="x")
        assert str(inv.wait(timeout=10)) == "suspended: timer t"
        assert deadlines() == [now[0] + 3600]
        now[0] += 1800  # a resume before it is due: suspended again, same deadline
        assert str(engine.resume("wf", "x").wait(timeout=10)) == "suspended: timer t"
        assert deadlines() == [now[0] + 1800]
        now[0] += 3600  # due now, and the timer thread sleeps on
        assert engine.resume("wf", "x").result(timeout=10) == "woke"
        assert deadlines() == []
        [timer] = engine.steps("wf", "x")
        assert timer.state == "completed"
        assert timer.completed_at is not None
    engine.close()


def test_a_durable_backoff_of_exactly_one_second_keeps_counting_attempts() -> None:
    """1 s is durable (the run suspends), and the attempts go on counting across each wait.

    The engine's clock is the test's: each backoff ends when the test moves
    the clock and fires the timer, and the third attempt is the last.
    """
    from memable import Failed, Retry, Suspended
    engine, now = _clocked_engine()
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


def _poll_inside(engine: Engine, operation: str) -> list[int]:
    """Wrap the store's ``operation`` (which makes instances this engine owns) so the
    engine's poll looks at the store right after it, before their runs are registered;
    return the list the number of runs the poll took for lost is added to."""
    real = getattr(engine._store, operation)
    taken: list[int] = []
    runner = engine._runner

    def then_poll(*args: Any, **kwargs: Any) -> Any:
        made = real(*args, **kwargs)
        before = runner._turnover
        runner._look_around(runner.clock.wall())
        taken.append(runner._turnover - before)
        return made

    setattr(engine._store, operation, then_poll)
    return taken


def test_an_invoked_instance_is_not_taken_for_lost_before_its_run_is_registered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The poll reads the new instance as this engine's and running, with no run here yet:
    it must wait, not run it again as one whose end was lost."""
    engine = Engine.in_memory(poll_interval=60)
    engine.register("wf", lambda ctx: "done")
    taken = _poll_inside(engine, "create_instance")
    with engine:
        assert engine.invoke("wf", instance_id="w").result(10) == "done"
    assert taken == [0]
    assert "did not record its end" not in caplog.text


def test_a_schedule_tick_is_not_taken_for_lost_before_its_run_is_registered(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from freezegun import freeze_time

    engine = Engine.in_memory(poll_interval=60)
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
    engine = Engine.in_memory(poll_interval=60)
    engine.register("child", lambda ctx: "done")
    engine.register("parent", lambda ctx: ctx.child("c", "child"))
    taken = _poll_inside(engine, "start_children")
    with engine:
        assert engine.invoke("parent").result(10) == "done"
    assert taken == [0]
    assert "did not record its end" not in caplog.text
