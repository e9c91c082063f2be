"""Waiting with a deadline: ``ctx.suspend(key, timeout=...)``, ``SignalTimeout``, ``"timed_out"``.

Each test runs on the three stores; the race between a signal and the
deadline is forced in each order, and on PostgreSQL also with the two
transactions overlapping (one holds its rows while the other runs).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from conftest import POSTGRES_URL
from freezegun import freeze_time
from helpers import T0, HeldLook, build, query, store_of, traced, until

from memable import (
    Completed,
    Context,
    Engine,
    Failed,
    InstanceFinished,
    SignalRejected,
    SignalTimeout,
    Suspended,
)
from memable._postgres.store import PostgresStore
from memable._postgres.transaction import PostgresTransaction
from memable._store.rows import StepWrite
from memable._store.sql import signals, timers
from memable.testing import advance

TIMEOUT = 10.0


def _fire_due(conn: psycopg.Connection[Any], now: float, at: float) -> list[Any]:
    """What the PostgreSQL store's firing does, in the caller's transaction on ``conn``:
    read the timers due at ``now``, then claim and fire them."""
    tx = PostgresTransaction(conn, "test", "unused")
    return timers.fire(tx, timers.due(tx, lambda: now), at)


def _rows(engine: Engine, name: str, instance_id: str) -> list[tuple[str, str, str, Any]]:
    return [(r.key, r.kind, r.state, r.result) for r in engine.steps(name, instance_id)]


def _timers(engine: Engine) -> list[tuple[Any, ...]]:
    return query(engine, "SELECT instance_id, key FROM memable_timers")


def _approval(ctx: Context) -> str:
    """Waits a day for a manager; without an answer by then, escalates."""
    try:
        approved = ctx.suspend("approval:v1", status="waiting for a manager",
                               timeout=timedelta(days=1))
    except SignalTimeout:
        ctx.step("escalate:v1").run(lambda: "escalated")
        return "escalated"
    return "approved" if approved else "refused"


def test_a_signal_before_the_deadline_wins_and_drops_it(
    make_engine: Callable[..., Engine],
) -> None:
    """A signal that arrives before the day's deadline completes the wait and deletes its
    timer, so moving the clock two days on times nothing out."""
    engine = make_engine(poll_interval=60)
    engine.register("approval", _approval)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("approval", instance_id="a")
        assert inv.wait(TIMEOUT) == Suspended("waiting for a manager")
        assert _timers(engine) == [("a", "approval:v1")]
        engine.signal("approval", "a", "approval:v1", True)
        assert inv.result(TIMEOUT) == "approved"
        assert _timers(engine) == []
        assert advance(engine, clock, timedelta(days=2)) == 0
        assert _rows(engine, "approval", "a") == [("approval:v1", "signal", "completed", True)]


def test_no_signal_by_the_deadline_raises_signal_timeout_which_the_workflow_catches(
    make_engine: Callable[..., Engine],
) -> None:
    """With no signal, nothing fires a minute before the deadline; at the deadline the wait
    raises ``SignalTimeout``, the workflow catches it and escalates, the wait's row says
    ``timed_out`` and a signal sent afterwards gets ``InstanceFinished``."""
    engine = make_engine(poll_interval=60)
    engine.register("approval", _approval)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("approval", instance_id="a")
        assert inv.wait(TIMEOUT) == Suspended("waiting for a manager")
        assert advance(engine, clock, timedelta(hours=23, minutes=59)) == 0
        assert inv.state == Suspended("waiting for a manager")
        assert advance(engine, clock, timedelta(minutes=1)) == 1
        assert inv.result(TIMEOUT) == "escalated"
        # Too late: the instance has ended.
        with pytest.raises(InstanceFinished):
            engine.signal("approval", "a", "approval:v1", True)
        assert _rows(engine, "approval", "a") == [
            ("approval:v1", "signal", "timed_out", None),
            ("escalate:v1", "step", "completed", "escalated"),
        ]


def test_a_signal_after_the_deadline_is_rejected_and_changes_nothing(
    make_engine: Callable[..., Engine],
) -> None:
    """A signal for a wait that has already timed out (while the instance waits on another
    key) raises ``SignalRejected`` naming the workflow, instance and key, and leaves every
    row as it was."""
    engine = make_engine(poll_interval=60)

    def wf(ctx: Context) -> str:
        try:
            return str(ctx.suspend("answer", timeout=60))
        except SignalTimeout:
            return str(ctx.suspend("second chance"))

    engine.register("wf", wf)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf", instance_id="w")
        assert inv.wait(TIMEOUT) == Suspended("answer")
        assert advance(engine, clock, 60) == 1
        assert inv.wait(TIMEOUT) == Suspended("second chance")
        before = _rows(engine, "wf", "w")
        with pytest.raises(SignalRejected, match="timed out") as err:
            engine.signal("wf", "w", "answer", "late")
        assert (err.value.workflow, err.value.instance_id, err.value.key) == ("wf", "w", "answer")
        assert _rows(engine, "wf", "w") == before
        assert engine.signal("wf", "w", "second chance", "ok").result(TIMEOUT) == "ok"


def test_an_uncaught_signal_timeout_fails_the_workflow_naming_the_key(
    make_engine: Callable[..., Engine],
) -> None:
    """A ``SignalTimeout`` the workflow does not catch fails the instance with a message
    naming the wait's key and the instance."""
    engine = make_engine(poll_interval=60)
    engine.register("wf", lambda ctx: ctx.suspend("webhook:v1", timeout=timedelta(days=2)))
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf", instance_id="w")
        assert inv.wait(TIMEOUT) == Suspended("webhook:v1")
        assert advance(engine, clock, timedelta(days=2)) == 1
        state = inv.wait(TIMEOUT)
        assert isinstance(state, Failed)
        assert state.message is not None
        assert state.message.startswith("step 'webhook:v1' failed: SignalTimeout: ")
        assert "instance 'w'" in state.message


def test_a_replay_raises_signal_timeout_again_at_the_same_point(
    make_engine: Callable[..., Engine],
) -> None:
    """The timed-out key is a memo like any other: a resume raises at the same point,
    without waiting again, and the steps after it are replayed or run."""
    engine = make_engine(poll_interval=60)
    timeouts: list[str] = []
    fail_once = [True]

    def flaky() -> str:
        if fail_once.pop() if fail_once else False:
            raise RuntimeError("once")
        return "sent"

    def wf(ctx: Context) -> str:
        try:
            ctx.suspend("answer", timeout=5)
        except SignalTimeout:
            timeouts.append("timed out")
        return ctx.step("reminder").run(flaky)

    engine.register("wf", wf)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf", instance_id="w")
        assert inv.wait(TIMEOUT) == Suspended("answer")
        assert advance(engine, clock, 5) == 1
        assert isinstance(inv.wait(TIMEOUT), Failed)
        assert engine.resume("wf", "w").result(TIMEOUT) == "sent"
        assert _timers(engine) == []
    assert timeouts == ["timed out", "timed out"]


def test_a_deadline_that_passes_while_the_instance_runs_is_not_lost(
    make_engine: Callable[..., Engine],
) -> None:
    """The deadline fires while a later run is busy before the suspend point: that run
    raises SignalTimeout there, without suspending."""
    engine = make_engine(poll_interval=60)
    gate, at_gate = threading.Event(), threading.Event()
    runs: list[str] = []

    def wf(ctx: Context) -> str:
        runs.append("run")
        if len(runs) == 2:
            at_gate.set()
            assert gate.wait(TIMEOUT)
        try:
            return str(ctx.suspend("answer", timeout=timedelta(hours=1)))
        except SignalTimeout:
            return "timed out"

    engine.register("wf", wf)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf", instance_id="w")
        assert inv.wait(TIMEOUT) == Suspended("answer")
        resumed = engine.resume("wf", "w")
        assert at_gate.wait(TIMEOUT)
        assert advance(engine, clock, timedelta(hours=1)) == 1
        gate.set()
        assert resumed.result(TIMEOUT) == "timed out"
    assert runs == ["run", "run"]


def test_a_signal_that_arrives_while_the_instance_runs_beats_a_later_deadline(
    make_engine: Callable[..., Engine],
) -> None:
    """Stored before the run reaches the suspend point: the run returns it and arms no
    deadline; moving past the deadline fires nothing."""
    engine = make_engine(poll_interval=60)
    gate, at_gate = threading.Event(), threading.Event()

    def wf(ctx: Context) -> str:
        at_gate.set()
        assert gate.wait(TIMEOUT)
        return str(ctx.suspend("answer", timeout=30))

    engine.register("wf", wf)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf", instance_id="w")
        assert at_gate.wait(TIMEOUT)
        engine.signal("wf", "w", "answer", "early")
        gate.set()
        assert inv.result(TIMEOUT) == "early"
        assert advance(engine, clock, 60) == 0
        assert _timers(engine) == []


def test_a_zero_timeout_times_out_at_once_unless_the_signal_is_there(
    make_engine: Callable[..., Engine],
) -> None:
    """``timeout=0`` with no signal waiting raises ``SignalTimeout`` in the same run,
    storing a ``timed_out`` row and no timer."""
    engine = make_engine(poll_interval=60)

    def wf(ctx: Context) -> str:
        try:
            return str(ctx.suspend("answer", timeout=0))
        except SignalTimeout:
            return "no answer"

    engine.register("wf", wf)
    with engine:
        assert engine.invoke("wf", instance_id="none").result(TIMEOUT) == "no answer"
        assert _rows(engine, "wf", "none") == [("answer", "signal", "timed_out", None)]
        assert _timers(engine) == []


def test_the_deadline_is_stored_once_and_a_resume_does_not_move_it(
    make_engine: Callable[..., Engine],
) -> None:
    """The deadline is fixed when the wait is first reached: a resume half a day later still
    times out a day after the first run, not a day after the resume."""
    engine = make_engine(poll_interval=60)
    engine.register("approval", _approval)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("approval", instance_id="a")
        assert inv.wait(TIMEOUT) == Suspended("waiting for a manager")
        assert advance(engine, clock, timedelta(hours=12)) == 0
        assert engine.resume("approval", "a").wait(TIMEOUT) == Suspended("waiting for a manager")
        assert advance(engine, clock, timedelta(hours=12)) == 1  # a day after the first run
        assert inv.result(TIMEOUT) == "escalated"


def test_cancel_drops_the_deadline(make_engine: Callable[..., Engine]) -> None:
    """Cancelling a waiting instance deletes its timer: the deadline passing afterwards
    fires nothing and the wait's row stays ``waiting``."""
    engine = make_engine(poll_interval=60)
    engine.register("approval", _approval)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("approval", instance_id="a")
        assert inv.wait(TIMEOUT) == Suspended("waiting for a manager")
        engine.cancel("approval", "a")
        assert _timers(engine) == []
        assert advance(engine, clock, timedelta(days=2)) == 0
        assert _rows(engine, "approval", "a") == [("approval:v1", "signal", "waiting", None)]


@pytest.mark.parametrize(
    ("bad", "error"),
    [(-1, ValueError), (math.nan, ValueError), (math.inf, ValueError), ("5", TypeError),
     (timedelta(days=3_000_000), ValueError)],
)
def test_a_bad_timeout_fails_the_run_and_stores_no_row(
    engine: Engine, bad: object, error: type[Exception]
) -> None:
    """A negative, NaN, infinite, string or out-of-range timeout fails the run with a
    ``ValueError`` or ``TypeError`` naming the wait's key, storing neither a step row nor a
    timer."""
    engine.register("wf", lambda ctx: ctx.suspend("answer", timeout=bad))
    with engine:
        state = engine.invoke("wf", instance_id="w").wait(TIMEOUT)
        assert engine.steps("wf", "w") == []
        assert _timers(engine) == []
    assert isinstance(state, Failed)
    assert state.message is not None
    assert error.__name__ in state.message
    assert state.message.startswith("step 'answer' failed: ")
    assert "suspend timeout of 'answer'" in state.message


# ---------------------------------------------------------------------- overlapping on PostgreSQL


def _waiting_on_a_lock(schema: str) -> bool:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        found = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock' AND query LIKE %s",
            # The signal's first statement after its instance's lock: its deadline's drop.
            ("%DELETE FROM memable_timers WHERE workflow%",),
        ).fetchone()
    return bool(found and found[0])


def test_a_signal_waits_for_a_firing_that_holds_its_deadline_and_is_then_rejected(
    pg_schema: str,
) -> None:
    """PostgreSQL: a firing transaction has taken the deadline and not committed; the
    signal waits for it, sees the key timed out, and is rejected: one winner."""
    engine = Engine.open(POSTGRES_URL, schema=pg_schema, poll_interval=60)
    engine.register("approval", _approval)
    outcome: list[BaseException | None] = []

    def send() -> None:
        try:
            engine.signal("approval", "a", "approval:v1", True)
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    # The engine's clock stays at T0 (its timer thread fires nothing); the firing is
    # told it is a day later.
    with freeze_time(T0), engine:
        inv = engine.invoke("approval", instance_id="a")
        assert inv.wait(TIMEOUT) == Suspended("waiting for a manager")
        with psycopg.connect(POSTGRES_URL, options=f"-c search_path={pg_schema}") as firing:
            fired = _fire_due(firing, T0.timestamp() + 86400, T0.timestamp() + 86400)
            assert [tuple(row)[:3] for row in fired] == [("approval", "a", "approval:v1")]
            sender = threading.Thread(target=send, name="test-signal")
            sender.start()
            until(lambda: _waiting_on_a_lock(pg_schema))
        sender.join(TIMEOUT)  # the firing committed as its block ended
        assert len(outcome) == 1
        assert isinstance(outcome[0], SignalRejected)
        assert engine.resume("approval", "a").result(TIMEOUT) == "escalated"


def test_a_firing_skips_a_deadline_a_signal_holds_and_the_signal_wins(pg_schema: str) -> None:
    """PostgreSQL: a signal's transaction has dropped the deadline and not committed; a
    firing at that moment skips the row without waiting, and the signal wins."""
    engine = Engine.open(POSTGRES_URL, schema=pg_schema, poll_interval=60)
    engine.register("approval", _approval)
    store = PostgresStore(POSTGRES_URL, "full", schema=pg_schema)
    try:
        with freeze_time(T0), engine:  # the firing alone is told it is a day later
            inv = engine.invoke("approval", instance_id="a")
            assert inv.wait(TIMEOUT) == Suspended("waiting for a manager")
            with psycopg.connect(POSTGRES_URL, options=f"-c search_path={pg_schema}") as signal:
                # The store's delivery, in a transaction left open; it raises if refused.
                signals.deliver(
                    PostgresTransaction(signal, store.owner, store.channel),
                    StepWrite("approval", "a", "approval:v1", 0, "signal", "completed", "true",
                              None, None, None, T0.timestamp() + 86400),
                )
                fired: list[object] = []
                a_day_on = T0.timestamp() + 86400
                firing = threading.Thread(
                    target=lambda: fired.append(store.fire_due_timers(lambda: a_day_on, a_day_on)),
                    name="test-fire",
                )
                firing.start()
                firing.join(TIMEOUT)  # a firing that waited for the signal would hang here
                assert not firing.is_alive()
                assert fired == [[]]
            assert engine.resume("approval", "a").result(TIMEOUT) == "approved"
            assert store.fire_due_timers(lambda: T0.timestamp() + 86400, T0.timestamp()) == []
            assert inv.state == Completed()
            assert _rows(engine, "approval", "a") == [
                ("approval:v1", "signal", "completed", True)
            ]
    finally:
        store.close()


def test_a_look_under_way_when_the_clock_is_frozen_in_the_past_fires_no_new_timer(
    make_engine: Callable[..., Engine],
) -> None:
    """A look of the timer thread that read the real time, then the test freezes the clock
    a day earlier and a run arms an hour's timer: that earlier reading does not fire it
    (it did, at once). Forced: the look is held just after its reading until the run has
    suspended on its timer."""
    look = HeldLook()
    engine = make_engine(poll_interval=60, clock=look.clock)
    engine.register("wf", lambda ctx: ctx.timer("pause:v1", timedelta(hours=1)) or "woke")
    with engine:
        look.hold(engine)
        with freeze_time(datetime.now(timezone.utc) - timedelta(days=1)) as clock:
            inv = engine.invoke("wf", instance_id="w")
            assert str(inv.wait(TIMEOUT)) == "suspended: timer pause:v1"
            look.release()
            assert str(inv.state) == "suspended: timer pause:v1"
            assert advance(engine, clock, timedelta(minutes=59)) == 0
            assert advance(engine, clock, timedelta(minutes=1)) == 1
            assert inv.result(TIMEOUT) == "woke"


def test_fire_due_timers_judges_what_it_read_by_a_reading_taken_after(
    make_engine: Callable[..., Engine],
) -> None:
    """Store.fire_due_timers judges the timers it read by a reading of the clock taken
    after the read, never by the one it chose them by: forced with a clock that reads a
    day past the deadline until the store has read the due timers, and the true time
    after. The timer is left."""
    engine = make_engine(poll_interval=60)
    engine.register("wf", lambda ctx: ctx.timer("pause:v1", timedelta(hours=1)) or "woke")
    with freeze_time(T0):
        engine.start()
        assert str(engine.invoke("wf", instance_id="w").wait(TIMEOUT)) == (
            "suspended: timer pause:v1")
        engine.stop()  # the store stays open; no look of the engine's own runs meanwhile
    store, deadline = store_of(engine), T0.timestamp() + 3600
    reads = 1
    with traced(engine) as statements:
        def clock() -> float:
            read = sum("FROM memable_timers WHERE deadline <=" in statement
                       for statement in statements)
            return deadline + 86400 if read < reads else deadline - 1

        assert store.fire_due_timers(clock, T0.timestamp()) == []
    fired = store.fire_due_timers(lambda: deadline, T0.timestamp())
    assert [(i, k) for _, i, k, _ in fired] == [("w", "pause:v1")]


def test_a_deadline_that_fires_between_the_runs_look_and_its_suspension_is_not_lost(
    make_engine: Callable[..., Engine],
) -> None:
    """The firing comes after the run read the key (still waiting) and before it records
    the suspension: the transaction that records it finds the key timed out and the run
    goes on to raise SignalTimeout, with no poll to help (it is a minute away)."""
    engine = make_engine(poll_interval=60, lease=600)
    store = store_of(engine)
    read_step = store.read_step
    looks: list[str] = []

    def read_then_fire(workflow: str, instance_id: str, key: str) -> Any:
        found = read_step(workflow, instance_id, key)
        looks.append(key)
        if len(looks) == 2:  # the resumed run's look: fire the deadline behind its back
            assert store.fire_due_timers(lambda: time.time() + 7200, T0.timestamp())
        return found

    store.read_step = read_then_fire  # type: ignore[method-assign]

    def wf(ctx: Context) -> str:
        try:
            return str(ctx.suspend("answer", timeout=timedelta(hours=1)))
        except SignalTimeout:
            return "timed out"

    engine.register("wf", wf)
    with engine:
        assert engine.invoke("wf", instance_id="w").wait(TIMEOUT) == Suspended("answer")
        assert engine.resume("wf", "w").result(TIMEOUT) == "timed out"
    assert looks == ["answer", "answer"]


def test_the_poll_finds_an_instance_whose_deadline_another_engine_fired(
    make_engine: Callable[..., Engine],
) -> None:
    """The safety net: a deadline fired where nothing runs the workflow (nor hears of it)
    leaves the instance ready for the next look of an engine that runs it.

    The engine is stopped before the firing: running (and, on PostgreSQL, listening),
    it would take the firing's notice and run the instance before the second look."""
    engine = make_engine(poll_interval=60, lease=600)
    engine.register("wf", lambda ctx: ctx.suspend("answer", timeout=timedelta(hours=1)))
    engine.start()
    assert engine.invoke("wf", instance_id="w").wait(TIMEOUT) == Suspended("answer")
    engine.stop()
    now, store = time.time() + 7200, store_of(engine)
    assert store.look_around(["wf"], now).ready == []
    assert store.fire_due_timers(lambda: now, T0.timestamp())
    assert store.look_around(["wf"], now).ready == [("wf", "w")]


def test_advance_counts_a_deadline_the_timer_thread_fired_first(
    make_engine: Callable[..., Engine],
) -> None:
    """``advance`` counts a deadline that fell due when the clock moved, whichever thread
    fired it: here the timer thread wins (the engine's own call then finds nothing).

    The stand-in fires what is due (unless the real timer thread, woken by the move,
    already did: either way the deadline has fired) and reports nothing fired."""
    engine = make_engine(poll_interval=60)
    engine.register("wf", lambda ctx: ctx.suspend("answer", timeout=5))
    real = engine.fire_due_timers

    def timer_thread_won() -> int:
        real()
        return 0

    engine.fire_due_timers = timer_thread_won  # type: ignore[method-assign]
    with freeze_time(T0) as clock, engine:
        assert engine.invoke("wf", instance_id="w").wait(TIMEOUT) == Suspended("answer")
        assert advance(engine, clock, 5) == 1


def test_advance_waits_for_a_firing_another_connection_holds(pg_schema: str) -> None:
    """PostgreSQL: a firing under way elsewhere (its transaction not yet committed) is
    skipped by the engine's own firing; ``advance`` waits for it and counts it.

    The firing commits once ``advance`` either looks for due timers again (it waits) or
    reads the keys' states (it did not wait, and saw the key still waiting)."""
    engine, store = build(POSTGRES_URL, schema=pg_schema, poll_interval=60)
    engine.register("wf", lambda ctx: ctx.suspend("answer", timeout=60))
    fired_here, looked = threading.Event(), threading.Event()

    def tell(obj: Any, name: str) -> None:
        """After ``obj.name`` returns in the advancing thread: note it."""
        real = getattr(obj, name)

        def told(*args: Any) -> Any:
            found = real(*args)
            if threading.current_thread().name == "test-advance":
                if name == "fire_due_timers":
                    fired_here.set()
                elif fired_here.is_set():
                    looked.set()
            return found

        setattr(obj, name, told)

    counted: list[int] = []
    with freeze_time(T0) as clock, engine:
        assert engine.invoke("wf", instance_id="w").wait(TIMEOUT) == Suspended("answer")
        tell(engine, "fire_due_timers")
        tell(store, "next_deadline")
        tell(engine, "steps")
        with psycopg.connect(POSTGRES_URL, options=f"-c search_path={pg_schema}") as firing:
            fired = _fire_due(firing, T0.timestamp() + 60, T0.timestamp() + 60)
            assert len(fired) == 1
            mover = threading.Thread(
                target=lambda: counted.append(advance(engine, clock, 60)), name="test-advance"
            )
            mover.start()
            assert looked.wait(TIMEOUT)
        mover.join(TIMEOUT)
    assert counted == [1]
