"""Suspend, signal, timers and step timeouts: the basics, races, clocks, other engines."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager, suppress
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from helpers import (
    PATIENCE,
    T0,
    Built,
    build,
    clocked_engine,
    dump,
    final_state,
    store_of,
    wrap_after,
)

from memable import (
    Cancelled,
    Completed,
    Context,
    Engine,
    EngineError,
    Failed,
    InstanceFinished,
    InstanceNotFound,
    InvalidKey,
    Invocation,
    MetadataStatus,
    SerializationError,
    SignalRejected,
    StepError,
    StepRecord,
    StepTimeout,
    Suspended,
    WorkflowNotFound,
    WorkflowState,
)
from memable.testing import advance


class RunProbe:
    """Counts runs of a workflow in progress at once; remembers the most it saw."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards _now and most
        self._now = 0
        self.most = 0

    @contextmanager
    def running(self) -> Iterator[None]:
        with self._lock:
            self._now += 1
            self.most = max(self.most, self._now)
        try:
            yield
        finally:
            with self._lock:
                self._now -= 1


# ---------------------------------------------------------------------- signals while running


@pytest.mark.parametrize("round_", range(10))
def test_signal_during_an_earlier_step_is_kept_and_runs_stay_single(
    engine: Engine, round_: int
) -> None:
    """A signal sent while a step before the suspend point runs is used; never two runs."""
    probe = RunProbe()
    in_step = threading.Event()
    release = threading.Event()

    def wf(ctx: Context) -> str:
        with probe.running():
            ctx.step("slow").run(lambda: in_step.set() or release.wait(10))
            payload: str = ctx.suspend("go:v1")
            return payload.upper()

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        assert in_step.wait(10)
        engine.signal("wf", inv.instance_id, "go:v1", "payload")
        release.set()
        assert inv.result(timeout=10) == "PAYLOAD"
    assert probe.most == 1


def test_signal_right_after_suspension_starts_one_more_run(engine: Engine) -> None:
    """A signal racing the end of a suspending run still completes it, with one run at a time."""
    probe = RunProbe()
    before_suspend = threading.Event()
    release = threading.Event()

    def wf(ctx: Context) -> int:
        with probe.running():
            if not release.is_set():
                before_suspend.set()
                release.wait(10)
            return int(ctx.suspend("n:v1")) * 2

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        assert before_suspend.wait(10)
        signalled = threading.Thread(
            target=engine.signal, args=("wf", inv.instance_id, "n:v1", 21)
        )
        signalled.start()
        release.set()
        signalled.join()
        assert inv.result(timeout=10) == 42
    assert probe.most == 1


def test_a_run_whose_claim_is_in_flight_is_not_reported_started(engine: Engine) -> None:
    """While a signal's run is still claiming the suspended instance, ``Invocation.state``
    reads the stored state (Suspended), not Started: a claim that then finds the instance
    ended or taken must never make a Completed instance read Started for a moment (a
    wake-up woken by another engine's NOTIFY did, after ``result()`` had returned)."""
    claiming, release = threading.Event(), threading.Event()
    store = store_of(engine)
    begin_run = store.begin_run

    def held_claim(*args: object, **kwargs: object) -> object:
        claiming.set()
        assert release.wait(10), "the test did not release the claim"
        return begin_run(*args, **kwargs)  # type: ignore[arg-type]

    engine.register("wf", lambda ctx: ctx.suspend("n:v1") * 2)
    with engine:
        inv = engine.invoke("wf", instance_id="i")
        assert inv.wait(10) == Suspended("n:v1")
        store.begin_run = held_claim  # type: ignore[method-assign]
        engine.signal("wf", "i", "n:v1", 21)
        assert claiming.wait(10)
        try:
            assert inv.state == Suspended("n:v1")
        finally:
            release.set()
        assert inv.result(timeout=10) == 42
        assert inv.state == Completed()


# ---------------------------------------------------------------------- BaseException


def test_except_exception_around_suspend_still_suspends(engine: Engine) -> None:
    """User code catching Exception around ctx.suspend does not swallow the suspension."""
    def wf(ctx: Context) -> str:
        try:
            return str(ctx.suspend("gate:v1"))
        except Exception:
            return "swallowed"

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        assert inv.wait(timeout=10) == Suspended("gate:v1")
        assert engine.signal("wf", inv.instance_id, "gate:v1", "opened").result(10) == "opened"


def test_except_exception_around_timer_still_suspends(engine: Engine) -> None:
    """User code catching Exception around ctx.timer does not swallow the suspension."""
    def wf(ctx: Context) -> str:
        try:
            ctx.timer("later:v1", timedelta(hours=1))
        except Exception:
            return "swallowed"
        return "waited"

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        assert inv.wait(timeout=10) == Suspended("timer later:v1")


# ---------------------------------------------------------------------- timer clock


def test_zero_timer_fires_at_once_even_with_a_long_poll_interval(
    make_engine: Callable[..., Engine],
) -> None:
    """The timer thread sleeps to the deadline, not to a poll tick: 60 s poll, done in < 2 s."""
    engine = make_engine(poll_interval=60)
    engine.register("wf", lambda ctx: ctx.timer("now:v1", 0) or "fired")
    with engine:
        assert engine.invoke("wf").result(timeout=2) == "fired"


def test_a_resume_before_the_deadline_does_not_move_it(
    make_engine: Callable[..., Engine],
) -> None:
    """Resuming an instance waiting on a timer keeps the deadline it was first given."""
    engine = make_engine(poll_interval=60)
    engine.register("wf", lambda ctx: ctx.timer("hour:v1", timedelta(hours=1)) or "done")
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf")
        assert inv.wait(timeout=10) == Suspended("timer hour:v1")
        assert advance(engine, clock, timedelta(minutes=30)) == 0
        assert engine.resume("wf", inv.instance_id).wait(timeout=10) == Suspended(
            "timer hour:v1"
        )
        assert advance(engine, clock, timedelta(minutes=29)) == 0  # T0 + 59 min
        assert advance(engine, clock, timedelta(minutes=1)) == 1  # T0 + 1 h
        assert inv.result(timeout=10) == "done"


def test_freezegun_three_day_timer(make_engine: Callable[..., Engine]) -> None:
    """Under freezegun a 3-day timer fires nothing at +2 days and completes at +3 days."""
    after: list[str] = []
    engine = make_engine(poll_interval=60)

    def wf(ctx: Context) -> str:
        ctx.timer("cool-off:v1", timedelta(days=3))
        return ctx.step("after").run(lambda: after.append("ran") or "done")

    engine.register("wf", wf)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf")
        assert inv.wait(timeout=10) == Suspended("timer cool-off:v1")
        assert advance(engine, clock, timedelta(days=2)) == 0
        assert inv.state == Suspended("timer cool-off:v1")
        assert after == []
        assert advance(engine, clock, timedelta(days=1)) == 1  # T0 + 3 days
        assert inv.result(timeout=10) == "done"
    assert after == ["ran"]


def test_a_timer_that_fires_while_its_instance_runs_is_not_lost(
    make_engine: Callable[..., Engine],
) -> None:
    """A timer due while a later run is busy before it: that run goes past the timer."""
    engine = make_engine(poll_interval=60)
    gate = threading.Event()
    at_gate = threading.Event()
    runs: list[str] = []

    def wf(ctx: Context) -> str:
        runs.append("run")
        if len(runs) == 2:
            at_gate.set()
            gate.wait(10)
        ctx.timer("t:v1", timedelta(hours=1))
        return ctx.step("after").run(lambda: "past the timer")

    engine.register("wf", wf)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf")
        assert inv.wait(timeout=10) == Suspended("timer t:v1")
        resumed = engine.resume("wf", inv.instance_id)
        assert at_gate.wait(10)
        assert advance(engine, clock, timedelta(hours=1)) == 1
        gate.set()
        assert resumed.result(timeout=10) == "past the timer"
    assert runs == ["run", "run"]


# ---------------------------------------------------------------------- timeouts


def test_a_timed_out_step_stores_nothing_even_when_it_returns_later(engine: Engine) -> None:
    """The late result of a timed-out step is never stored; resume runs the step again."""
    release = threading.Event()
    returned = threading.Event()
    calls: list[int] = []

    def slow() -> str:
        calls.append(1)
        if len(calls) == 1:
            release.wait(10)
            returned.set()
            return "late"
        return "in time"

    def wf(ctx: Context) -> str:
        return ctx.step("slow:v1").timeout(0.05).run(slow)

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        state = inv.wait(timeout=10)
        assert isinstance(state, Failed)
        assert "StepTimeout" in state.message
        assert "timed out" in state.message
        release.set()
        assert returned.wait(10)
        [record] = engine.steps("wf", inv.instance_id)
        assert (record.state, record.result, record.attempts) == ("failed", None, 1)
        assert record.error is not None
        assert record.error.startswith("StepTimeout")
        assert engine.resume("wf", inv.instance_id).result(timeout=10) == "in time"
        [record] = engine.steps("wf", inv.instance_id)
        assert (record.state, record.result, record.attempts) == ("completed", "in time", 2)
    assert calls == [1, 1]


def test_hung_steps_do_not_starve_the_worker_pool(make_engine: Callable[..., Engine]) -> None:
    """Eight steps hung past their timeouts leave the 8 workers free for a ninth workflow."""
    engine = make_engine(max_workers=8)
    release = threading.Event()

    def hang(ctx: Context) -> None:
        ctx.step("hang").timeout(0.05).run(release.wait, 30)

    engine.register("hang", hang)
    engine.register("quick", lambda ctx: ctx.step("q").run(lambda: "quick"))
    try:
        with engine:
            hung = [engine.invoke("hang") for _ in range(8)]
            for inv in hung:
                state = inv.wait(timeout=10)
                assert isinstance(state, Failed)
                assert "timed out" in state.message
            assert engine.invoke("quick").result(timeout=10) == "quick"
            alive = [t for t in threading.enumerate() if t.name.startswith("memable-step")]
            assert len(alive) == 8
            assert all(t.daemon for t in alive)
    finally:
        release.set()


def test_a_step_timeout_error_names_the_step(engine: Engine) -> None:
    """StepTimeout reaching user code names workflow, instance and key."""
    release = threading.Event()
    caught: list[StepTimeout] = []

    def wf(ctx: Context) -> str:
        try:
            ctx.step("slow:v1").timeout(timedelta(milliseconds=50)).run(release.wait, 10)
        except StepTimeout as exc:
            caught.append(exc)
        return "handled"

    engine.register("wf", wf)
    try:
        with engine:
            inv = engine.invoke("wf", instance_id="t-1")
            assert inv.result(timeout=10) == "handled"
    finally:
        release.set()
    [exc] = caught
    assert (exc.workflow, exc.instance_id, exc.key) == ("wf", "t-1", "slow:v1")


@pytest.mark.parametrize("bad", [0, -1, timedelta(seconds=-1)])
def test_a_timeout_must_be_positive(engine: Engine, bad: float | timedelta) -> None:
    """.timeout(0) or a negative duration is refused before anything runs."""
    def wf(ctx: Context) -> None:
        ctx.step("s").timeout(bad).run(lambda: 1)

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf").wait(timeout=10)
    assert isinstance(state, Failed)
    assert "ValueError" in state.message
    assert "timeout" in state.message


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


# ---------------------------------------------------------------------- other engines


def test_a_signal_stored_by_another_engine_is_run_by_this_one_once(tmp_path: Path) -> None:
    """An engine without the workflow stores the signal; the one with it runs it, once."""
    after: list[str] = []

    def wf(ctx: Context) -> str:
        payload = ctx.suspend("go:v1")
        return ctx.step("after").run(lambda: after.append(payload) or f"got {payload}")

    first = Engine.open(tmp_path / "shared.db", poll_interval=0.05)
    first.register("wf", wf)
    second = Engine.open(tmp_path / "shared.db", poll_interval=0.05)
    with first, second:
        inv = first.invoke("wf")
        assert inv.wait(timeout=10) == Suspended("go:v1")
        second.signal("wf", inv.instance_id, "go:v1", "hello")
        assert inv.result(timeout=5) == "got hello"
    assert after == ["hello"]


def test_a_timer_armed_by_another_engine_is_fired_by_this_one_once(tmp_path: Path) -> None:
    """A timer armed by an engine that then closed is fired by another on the file, once."""
    after: list[str] = []

    def wf(ctx: Context) -> str:
        ctx.timer("soon:v1", 0.2)
        return ctx.step("after").run(lambda: after.append("ran") or "fired")

    first = Engine.open(tmp_path / "shared.db", poll_interval=0.05)
    first.register("wf", wf)
    second = Engine.open(tmp_path / "shared.db", poll_interval=0.05)
    second.register("wf", wf)
    with first:
        with second:
            inv = second.invoke("wf")
            assert inv.wait(timeout=10) == Suspended("timer soon:v1")
        # second is closed before the deadline: only first is left to fire it.
        assert first.invocation("wf", inv.instance_id).result(timeout=5) == "fired"
    assert after == ["ran"]


@pytest.mark.parametrize("round_", range(5))
def test_two_engines_with_the_workflow_fire_a_timer_once(tmp_path: Path, round_: int) -> None:
    """Two started engines on one file: a due timer is fired by one, and run once."""
    after: list[str] = []
    lock = threading.Lock()  # guards after: both engines' workers may run the step

    def record() -> str:
        with lock:
            after.append("ran")
        return "fired"

    def wf(ctx: Context) -> str:
        ctx.timer("soon:v1", 0.05)
        return ctx.step("after").run(record)

    engines = [Engine.open(tmp_path / "shared.db", poll_interval=0.02) for _ in range(2)]
    for engine in engines:
        engine.register("wf", wf)
    with engines[0], engines[1]:
        inv = engines[0].invoke("wf")
        assert engines[1].invocation("wf", inv.instance_id).result(timeout=5) == "fired"
    assert after == ["ran"]


# ---------------------------------------------------------------------- draining


def test_wait_all_waits_for_runs_that_timers_and_signals_start(engine: Engine) -> None:
    """wait_all() returns only after timer- and signal-started runs have ended too."""
    def timed(ctx: Context) -> str:
        ctx.timer("zero:v1", 0)
        return ctx.step("after").run(lambda: "timer done")

    engine.register("timed", timed)
    engine.register("signalled", lambda ctx: ctx.suspend("go:v1"))
    engine.start()
    waiting = engine.invoke("signalled")
    assert waiting.wait(timeout=10) == Suspended("go:v1")
    timed_inv = engine.invoke("timed")
    engine.signal("signalled", waiting.instance_id, "go:v1", "signal done")
    engine.wait_all()
    assert timed_inv.state == Completed()
    assert waiting.state == Completed()
    assert timed_inv.result(timeout=0) == "timer done"
    assert waiting.result(timeout=0) == "signal done"


def test_after_stop_only_abandoned_step_threads_live(engine: Engine) -> None:
    """After stop() the only memable threads alive are daemons of timed-out steps."""
    release = threading.Event()
    engine.register("hang", lambda ctx: ctx.step("h").timeout(0.05).run(release.wait, 30))
    engine.register("timed", lambda ctx: ctx.timer("later", timedelta(hours=1)))
    try:
        engine.start()
        hung = engine.invoke("hang")
        engine.invoke("timed").wait(timeout=10)
        assert isinstance(hung.wait(timeout=10), Failed)
        engine.stop()
        # A PostgreSQL store's pool is the store's: it lives until close().
        alive = [
            t for t in threading.enumerate()
            if t.name.startswith("memable") and not t.name.startswith("memable-pool")
        ]
        assert [t.name.split()[0] for t in alive] == ["memable-step"]
        assert all(t.daemon for t in alive)
    finally:
        release.set()


# ---------------------------------------------------------------------- bad signals


def test_bad_signals_raise_and_change_no_row(engine: Engine) -> None:
    """Unknown or finished instances, used keys and unstorable payloads change nothing."""
    engine.register("wait", lambda ctx: [ctx.step("s").run(lambda: 1), ctx.suspend("go:v1")])
    engine.register("done", lambda ctx: "done")
    engine.register("boom", lambda ctx: 1 / 0)
    with engine:
        waiting = engine.invoke("wait", instance_id="w-1")
        assert waiting.wait(timeout=10) == Suspended("go:v1")
        engine.invoke("done", instance_id="d-1").wait(timeout=10)
        engine.invoke("boom", instance_id="b-1").wait(timeout=10)
        engine.signal("wait", "w-1", "early:v1", "kept for later").wait(timeout=10)
        before = dump(engine)

        cases: list[tuple[type[Exception], Callable[[], object], str]] = [
            (InstanceNotFound, lambda: engine.signal("wait", "nope", "go:v1", 1), "'nope'"),
            (InstanceFinished, lambda: engine.signal("done", "d-1", "go:v1", 1), "completed"),
            (InstanceFinished, lambda: engine.signal("boom", "b-1", "go:v1", 1), "resume"),
            (SignalRejected, lambda: engine.signal("wait", "w-1", "early:v1", 2), "holds"),
            (SignalRejected, lambda: engine.signal("wait", "w-1", "s", 2), "is a step"),
            (SerializationError, lambda: engine.signal("wait", "w-1", "go:v1", len), "go:v1"),
            (InvalidKey, lambda: engine.signal("wait", "w-1", "_go", 1), "reserved"),
        ]
        for error, call, words in cases:
            with pytest.raises(error, match=words):
                call()
        assert dump(engine) == before
        assert waiting.state == Suspended("go:v1")


# ---------------------------------------------------------------------- signals for step keys


def record(engine: Engine, name: str, instance_id: str, key: str) -> StepRecord:
    """The StepRecord of ``key`` in an instance."""
    [found] = [r for r in engine.steps(name, instance_id) if r.key == key]
    return found


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


class _StepHeld:
    """Registers on ``engine`` a workflow "wf" whose step "s" is held: entered (the engine
    started), an instance of it runs into the step; left, the step is let go."""

    def __init__(self, engine: Engine) -> None:
        self._engine, self._inside, self._release = engine, threading.Event(), threading.Event()
        engine.register("wf", lambda ctx: ctx.step("s").run(self._body))

    def _body(self) -> str:
        self._inside.set()
        self._release.wait(PATIENCE)
        return "stepped"

    def __enter__(self) -> Invocation:
        inv = self._engine.invoke("wf")
        assert self._inside.wait(PATIENCE)
        return inv

    def __exit__(self, *exc: object) -> None:
        self._release.set()


def test_a_signal_for_the_step_in_flight_of_a_cancelled_instance_finds_it_finished(
    make_engine: Callable[..., Engine],
) -> None:
    """Cancelled while a step runs (the step finishes: a cancel lets it), the instance
    has ended: a signal for that step's key raises InstanceFinished, as for any key of
    an ended instance, not SignalRejected (found by tests/test_stateful.py)."""
    engine = make_engine()
    held = _StepHeld(engine)
    with engine:
        with held as inv:
            engine.cancel("wf", inv.instance_id)
            with pytest.raises(InstanceFinished, match="it is cancelled"):
                engine.signal("wf", inv.instance_id, "s", 1)
        assert final_state(inv) == Cancelled()


def test_signal_for_a_step_in_flight_is_rejected(make_engine: Callable[..., Engine]) -> None:
    """A signal for the key of a step in flight raises SignalRejected; the step's value wins."""
    engine = make_engine()
    held = _StepHeld(engine)
    with engine:
        with held as inv, pytest.raises(SignalRejected):
            engine.signal("wf", inv.instance_id, "s", 1)
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


# ---------------------------------------------------------------------- racing the store's writes


def _slow_polling_engine(store: str, tmp_path: Path) -> Built:
    """An engine in memory or on a file that polls once a minute, its lease far off: only
    what the test forces can carry an instance on; and its store."""
    return build(None if store == "memory" else tmp_path / "db", poll_interval=60, lease=600)


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
    engine, engine_store = _slow_polling_engine(store, tmp_path)
    engine.register("wf", lambda ctx: ctx.suspend("go") + 1)
    sent: list[str] = []

    def signal_once_waiting(outcome: Any) -> None:
        if outcome.outcome == "waiting" and not sent:
            sent.append("go")
            engine.signal("wf", "x", "go", 41)

    wrap_after(engine_store, "suspend", signal_once_waiting)
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
    engine, engine_store = _slow_polling_engine(store, tmp_path)
    engine.register("wf", lambda ctx: ctx.suspend("go") + 1)
    signalled: list[Invocation] = []
    sent, claiming, release = threading.Event(), threading.Event(), threading.Event()

    def signal_once_waiting(outcome: Any) -> None:
        if outcome.outcome == "waiting" and not signalled:
            signalled.append(engine.signal("wf", "x", "go", 41))
            sent.set()

    wrap_after(engine_store, "suspend", signal_once_waiting)
    begin_run = engine_store.begin_run

    def held_second_claim(*args: Any, **kwargs: Any) -> Any:
        if sent.is_set():
            claiming.set()
            assert release.wait(10)
        return begin_run(*args, **kwargs)

    engine_store.begin_run = held_second_claim  # type: ignore[method-assign]
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


def test_a_signal_stored_after_the_run_read_its_steps_refuses_the_step_it_names(
    tmp_path: Path,
) -> None:
    """A signal for b stored after the run read its steps, before b starts: b never runs.

    It is sent right after step a is stored, the run's memo has no b, and b
    is not yet in flight: the signal is accepted, and the run refuses the key.
    """
    engine, store = build(tmp_path / "db", poll_interval=60)
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

    wrap_after(store, "save_step", signal_b_after_a)
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
    engine, store = build(db, poll_interval=60)
    engine.register("wf", lambda ctx: ctx.suspend("approval:v1"))

    def take_over(waiting: Any, *rest: Any) -> None:
        with closing(sqlite3.connect(db)) as other, other:
            other.execute("UPDATE memable_instances SET owner = 'another-engine'")

    _before(store, "suspend", take_over)
    with engine:  # leaving waits for the run here to end
        engine.invoke("wf", instance_id="x")
    with closing(sqlite3.connect(db)) as reader:
        rows = reader.execute("SELECT key FROM memable_steps").fetchall()
        owner = reader.execute("SELECT status, owner FROM memable_instances").fetchall()
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
    engine, store = build(db, poll_interval=60, lease=600)
    other = Engine.open(db, poll_interval=60, lease=600)  # runs nothing: stores the signal
    other.start()
    engine.register("wf", lambda ctx: f"approved by {ctx.suspend('approval:v1')}")

    def signal_first(waiting: Any, *rest: Any) -> None:
        other.signal("wf", "x", "approval:v1", "ana")

    _before(store, "suspend", signal_first)
    with engine:
        assert engine.invoke("wf", instance_id="x").result(timeout=10) == "approved by ana"
    other.close()
    engine.close()


def test_timers_and_leases_read_the_clock_the_engine_is_given() -> None:
    """An engine given its own clock fires a timer when that clock says so, without
    freezegun: not before, and exactly once after, whichever of the test's call and the
    engine's timer thread (which may be looking as the clock moves) fires it."""
    engine, now = clocked_engine()
    engine.register("wf", lambda ctx: ctx.timer("t", 3600) or "woke")
    fired: list[int] = []  # how many each look at the store fired, from any thread
    store = store_of(engine)
    look = store.fire_due_timers

    def counted(*args: Any, **kwargs: Any) -> Any:
        got = look(*args, **kwargs)
        fired.append(len(got))
        return got

    store.fire_due_timers = counted  # type: ignore[method-assign]
    with engine:
        inv = engine.invoke("wf", instance_id="x")
        assert str(inv.wait(timeout=10)) == "suspended: timer t"
        assert engine.fire_due_timers() == 0
        assert sum(fired) == 0
        now[0] += 3600
        engine.fire_due_timers()
        assert inv.result(timeout=10) == "woke"
        assert sum(fired) == 1
    engine.close()


def test_a_run_that_reaches_its_timer_after_the_deadline_but_before_it_fired_goes_on() -> None:
    """The clock passes the deadline with the timer thread asleep; a resume replays to it.

    The timer row keeps its first deadline (a later run does not move it),
    and a run that reaches a timer already due fires it itself and goes on.
    """
    engine, now = clocked_engine()
    engine.register("wf", lambda ctx: ctx.timer("t", 3600) or "woke")

    def deadlines() -> list[float]:
        rows = store_of(engine).read_rows("timers", "SELECT deadline FROM memable_timers", {})
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


# ---------------------------------------------------------------------- suspend and signal


#: Upper bound for any wait in these tests; a healthy run ends in milliseconds.
TIMEOUT = 10.0


def _rows(records: list[StepRecord]) -> list[tuple[str, str, str, Any]]:
    """The (key, kind, state, result) of each stored record, in the order reached."""
    return [(r.key, r.kind, r.state, r.result) for r in records]


def _end_of_held_run(inv: Invocation, release: threading.Event) -> list[WorkflowState]:
    """Follow the run of ``inv`` that a step holds at ``release`` until it ends.

    The run cannot end before ``release`` is set, so subscribing first is sure to follow
    that run, not one a zero timer starts right after it: the list is everything the run
    published, its last item the state the run ended in.
    """
    updates = inv.updates()
    release.set()
    return list(updates)


def _metadata_status(engine: Engine, name: str, instance_id: str) -> MetadataStatus:
    meta = engine.get_metadata(name, instance_id)
    assert meta is not None
    return meta.status


def test_suspend_then_signal_completes(engine: Engine) -> None:
    """A run reaching an unsignalled suspend point ends Suspended(key); the signal stores the
    payload as the key's value and a new run returns it from suspend and completes.
    """
    calls: list[str] = []

    def s1() -> int:
        calls.append("s1")
        return 1

    def wf(ctx: Context) -> str:
        ctx.step("s1").run(s1)
        payload: str = ctx.suspend("wait:v1")
        return payload

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Suspended("wait:v1")
    assert _metadata_status(engine, "wf", inv.instance_id) == MetadataStatus.Suspended("wait:v1")
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("s1", "step", "completed", 1),
        ("wait:v1", "signal", "waiting", None),
    ]
    assert calls == ["s1"]

    signalled = engine.signal("wf", inv.instance_id, "wait:v1", "hello")
    assert signalled.instance_id == inv.instance_id
    assert signalled.wait(TIMEOUT) == Completed()
    assert signalled.result(TIMEOUT) == "hello"
    assert _metadata_status(engine, "wf", inv.instance_id) == MetadataStatus.Completed()
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("s1", "step", "completed", 1),
        ("wait:v1", "signal", "completed", "hello"),
    ]
    assert calls == ["s1"]


def test_suspend_with_custom_status(engine: Engine) -> None:
    """A suspend with a status ends the run Suspended with that status (stored in the
    metadata too) instead of the key, and the signalled payload reaches the workflow.
    """

    def wf(ctx: Context) -> bool:
        approved: bool = ctx.suspend("approval:v1", status="Waiting for manager approval")
        return approved

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Suspended("Waiting for manager approval")
    assert _metadata_status(engine, "wf", inv.instance_id) == MetadataStatus.Suspended(
        "Waiting for manager approval"
    )

    signalled = engine.signal("wf", inv.instance_id, "approval:v1", True)
    assert signalled.wait(TIMEOUT) == Completed()
    assert signalled.result(TIMEOUT) is True
    assert _metadata_status(engine, "wf", inv.instance_id) == MetadataStatus.Completed()
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("approval:v1", "signal", "completed", True),
    ]


def test_memoised_steps_preserved_across_suspend(engine: Engine) -> None:
    """The run a signal starts returns the step completed before the suspend from the store
    and executes only the step after it.
    """
    calls: list[str] = []

    def s1() -> int:
        calls.append("s1")
        return 42

    def s2() -> int:
        calls.append("s2")
        return 99

    def wf(ctx: Context) -> list[Any]:
        a = ctx.step("s1").run(s1)
        gate: str = ctx.suspend("gate:v1")
        b = ctx.step("s2").run(s2)
        return [a, gate, b]

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Suspended("gate:v1")
    assert calls == ["s1"]

    calls.clear()
    signalled = engine.signal("wf", inv.instance_id, "gate:v1", "go")
    assert signalled.wait(TIMEOUT) == Completed()
    assert calls == ["s2"]
    assert signalled.result(TIMEOUT) == [42, "go", 99]
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("s1", "step", "completed", 42),
        ("gate:v1", "signal", "completed", "go"),
        ("s2", "step", "completed", 99),
    ]


def test_resume_without_signal_stays_suspended(engine: Engine) -> None:
    """Resuming an instance whose suspend point has no signal yet runs it again only to
    suspend at the same point, with nothing stored for the key but its waiting mark.
    """
    runs: list[str] = []

    def wf(ctx: Context) -> str:
        runs.append(ctx.instance_id)
        payload: str = ctx.suspend("wait:v1")
        return payload

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Suspended("wait:v1")

    resumed = engine.resume("wf", inv.instance_id)
    assert resumed.wait(TIMEOUT) == Suspended("wait:v1")
    assert runs == [inv.instance_id, inv.instance_id]
    assert _metadata_status(engine, "wf", inv.instance_id) == MetadataStatus.Suspended("wait:v1")
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("wait:v1", "signal", "waiting", None),
    ]


def test_multiple_suspend_points(engine: Engine) -> None:
    """Each signal moves the instance to the next suspend point; the second completes it with
    both payloads, each returned at its own suspend.
    """

    def wf(ctx: Context) -> int:
        a: int = ctx.suspend("first:v1")
        b: int = ctx.suspend("second:v1")
        return a * 10 + b

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Suspended("first:v1")

    assert engine.signal("wf", inv.instance_id, "first:v1", 1).wait(TIMEOUT) == Suspended(
        "second:v1"
    )
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("first:v1", "signal", "completed", 1),
        ("second:v1", "signal", "waiting", None),
    ]

    signalled = engine.signal("wf", inv.instance_id, "second:v1", 2)
    assert signalled.wait(TIMEOUT) == Completed()
    assert signalled.result(TIMEOUT) == 12
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("first:v1", "signal", "completed", 1),
        ("second:v1", "signal", "completed", 2),
    ]


def test_suspend_after_failed_step_on_resume(engine: Engine) -> None:
    """A step that failed before a suspend point is re-run by resume, which then suspends
    there; the signal completes the instance without running the step a third time.
    """
    calls: list[str] = []

    def s1() -> int:
        calls.append("s1")
        if len(calls) == 1:
            raise StepError.retryable("transient")
        return 1

    def wf(ctx: Context) -> str:
        ctx.step("s1").run(s1)
        payload: str = ctx.suspend("gate:v1")
        return payload

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    state = inv.wait(TIMEOUT)
    assert isinstance(state, Failed)
    assert "'s1'" in state.message
    assert "transient" in state.message
    assert calls == ["s1"]
    assert _rows(engine.steps("wf", inv.instance_id)) == [("s1", "step", "failed", None)]

    assert engine.resume("wf", inv.instance_id).wait(TIMEOUT) == Suspended("gate:v1")
    assert calls == ["s1", "s1"]

    signalled = engine.signal("wf", inv.instance_id, "gate:v1", "done")
    assert signalled.wait(TIMEOUT) == Completed()
    assert signalled.result(TIMEOUT) == "done"
    assert calls == ["s1", "s1"]
    records = engine.steps("wf", inv.instance_id)
    assert _rows(records) == [
        ("s1", "step", "completed", 1),
        ("gate:v1", "signal", "completed", "done"),
    ]
    assert records[0].attempts == 2


# ---------------------------------------------------------------------- timers


def test_timer_fires_and_completes_workflow(engine: Engine) -> None:
    """A zero timer ends the run Suspended("timer <key>"); the timer thread fires it by itself
    and the run it starts replays the step before the timer and executes the one after.
    """
    calls: list[str] = []
    release = threading.Event()

    def s1() -> int:
        calls.append("s1")
        release.wait(TIMEOUT)
        return 1

    def s2() -> int:
        calls.append("s2")
        return 2

    def wf(ctx: Context) -> int:
        a: int = ctx.step("s1").run(s1)
        ctx.timer("wait:v1", 0)
        b: int = ctx.step("s2").run(s2)
        return a + b

    engine.register("timer-wf", wf)
    engine.start()

    inv = engine.invoke("timer-wf")
    assert _end_of_held_run(inv, release) == [Suspended("timer wait:v1")]

    # No fire_due_timers() here: the engine's timer thread fires the zero timer.
    assert inv.result(TIMEOUT) == 3
    assert _metadata_status(engine, "timer-wf", inv.instance_id) == MetadataStatus.Completed()
    assert calls == ["s1", "s2"]
    assert _rows(engine.steps("timer-wf", inv.instance_id)) == [
        ("s1", "step", "completed", 1),
        ("wait:v1", "timer", "completed", None),
        ("s2", "step", "completed", 2),
    ]


def test_timer_memoised_on_resume(engine: Engine) -> None:
    """Resuming an instance completed past a fired timer replays both the step and the timer
    from the store: nothing executes and no new timer is armed.
    """
    calls: list[str] = []
    release = threading.Event()

    def s1() -> int:
        calls.append("s1")
        release.wait(TIMEOUT)
        return 1

    def wf(ctx: Context) -> str:
        ctx.step("s1").run(s1)
        ctx.timer("delay:v1", 0)
        return "done"

    engine.register("timer-memo", wf)
    engine.start()

    inv = engine.invoke("timer-memo")
    assert _end_of_held_run(inv, release) == [Suspended("timer delay:v1")]
    assert inv.result(TIMEOUT) == "done"
    assert calls == ["s1"]
    fired = engine.steps("timer-memo", inv.instance_id)

    calls.clear()
    resumed = engine.resume("timer-memo", inv.instance_id)
    assert resumed.wait(TIMEOUT) == Completed()
    assert resumed.result(TIMEOUT) == "done"
    assert calls == []
    assert engine.steps("timer-memo", inv.instance_id) == fired
    assert _rows(fired) == [
        ("s1", "step", "completed", 1),
        ("delay:v1", "timer", "completed", None),
    ]
    assert engine.fire_due_timers() == 0


def test_timer_skipped_when_workflow_not_suspended(engine: Engine) -> None:
    """A run that fails before its timer arms none; the resume that gets past the failed step
    arms it, ends Suspended, and the timer thread's firing completes the instance.
    """
    calls: list[str] = []
    release = threading.Event()

    def s1() -> int:
        calls.append("s1")
        if len(calls) == 1:
            raise StepError.retryable("transient")
        release.wait(TIMEOUT)
        return 1

    def wf(ctx: Context) -> str:
        ctx.step("s1").run(s1)
        ctx.timer("delay:v1", 0)
        return "done"

    engine.register("timer-fail", wf)
    engine.start()

    inv = engine.invoke("timer-fail")
    state = inv.wait(TIMEOUT)
    assert isinstance(state, Failed)
    assert "'s1'" in state.message
    assert "transient" in state.message
    assert _rows(engine.steps("timer-fail", inv.instance_id)) == [
        ("s1", "step", "failed", None),
    ]
    assert engine.fire_due_timers() == 0  # the failed run never reached the timer

    resumed = engine.resume("timer-fail", inv.instance_id)
    assert _end_of_held_run(resumed, release) == [Suspended("timer delay:v1")]

    assert resumed.result(TIMEOUT) == "done"
    assert _metadata_status(engine, "timer-fail", inv.instance_id) == MetadataStatus.Completed()
    assert calls == ["s1", "s1"]
    assert _rows(engine.steps("timer-fail", inv.instance_id)) == [
        ("s1", "step", "completed", 1),
        ("delay:v1", "timer", "completed", None),
    ]


def test_timer_with_steps_before_and_after(engine: Engine) -> None:
    """Two zero timers between three steps each suspend the instance once and are fired by the
    timer thread; every step executes exactly once, in order.
    """
    calls: list[str] = []
    release = threading.Event()

    def step(name: str, value: int) -> int:
        calls.append(name)
        if name == "before":
            release.wait(TIMEOUT)
        return value

    def wf(ctx: Context) -> list[int]:
        before = ctx.step("before").run(step, "before", 1)
        ctx.timer("t1:v1", 0)
        between = ctx.step("between").run(step, "between", 2)
        ctx.timer("t2:v1", 0)
        after = ctx.step("after").run(step, "after", 3)
        return [before, between, after]

    engine.register("multi-timer", wf)
    engine.start()

    inv = engine.invoke("multi-timer")
    assert _end_of_held_run(inv, release) == [Suspended("timer t1:v1")]
    # No look at `calls` here: the zero timer may already have started "between".

    assert inv.result(TIMEOUT) == [1, 2, 3]
    assert _metadata_status(engine, "multi-timer", inv.instance_id) == MetadataStatus.Completed()
    assert calls == ["before", "between", "after"]
    assert _rows(engine.steps("multi-timer", inv.instance_id)) == [
        ("before", "step", "completed", 1),
        ("t1:v1", "timer", "completed", None),
        ("between", "step", "completed", 2),
        ("t2:v1", "timer", "completed", None),
        ("after", "step", "completed", 3),
    ]


def test_a_fired_timer_records_when_it_completed(tmp_path: Path) -> None:
    """The timer thread fires a due timer: its step row is completed with a completion time."""
    engine = Engine.open(tmp_path / "db", poll_interval=0.05)
    engine.register("wf", lambda ctx: ctx.timer("t:v1", 0.1) or "fired")
    with engine:
        inv = engine.invoke("wf")
        assert inv.result(timeout=10) == "fired"
    engine.close()
    with closing(sqlite3.connect(tmp_path / "db")) as reader:
        sql = "SELECT state, completed_at FROM memable_steps WHERE key = 't:v1'"
        rows = reader.execute(sql).fetchall()
    [(state, completed_at)] = rows
    assert state == "completed"
    assert completed_at is not None


# ---------------------------------------------------------------------- step timeouts


def test_step_with_timeout_completes(engine: Engine) -> None:
    """A step that returns well within its timeout is stored and its value reaches the
    workflow; it ran on a daemon step thread of its own.
    """
    threads: list[threading.Thread] = []

    def answer() -> int:
        threads.append(threading.current_thread())
        return 42

    def wf(ctx: Context) -> int:
        value: int = ctx.step("s1").timeout(5).run(answer)
        return value

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Completed()
    assert inv.result(TIMEOUT) == 42

    [thread] = threads
    assert thread.name.startswith("memable-step")
    assert thread.daemon
    [record] = engine.steps("wf", inv.instance_id)
    assert (record.key, record.kind, record.state, record.result, record.attempts) == (
        "s1", "step", "completed", 42, 1,
    )


def test_step_timeout_exceeds_deadline(engine: Engine) -> None:
    """A step still running at its deadline fails the workflow with a StepTimeout naming the
    step and "timed out", without waiting for the hung function.
    """
    release = threading.Event()
    returned = threading.Event()
    calls: list[str] = []

    def hang() -> int:
        calls.append("slow")
        release.wait(TIMEOUT)
        returned.set()
        return 1

    def wf(ctx: Context) -> int:
        value: int = ctx.step("slow").timeout(0.1).run(hang)
        return value

    engine.register("wf", wf)
    engine.start()

    try:
        inv = engine.invoke("wf")
        state = inv.wait(TIMEOUT)
        # The run ended on the deadline alone, while the function was still hanging.
        assert not returned.is_set()
        assert isinstance(state, Failed)
        assert state.message.startswith("step 'slow' failed: StepTimeout: timed out after 0.1 s")
        assert calls == ["slow"]

        [record] = engine.steps("wf", inv.instance_id)
        assert (record.key, record.state, record.result) == ("slow", "failed", None)
        assert record.error is not None
        assert "timed out" in record.error
        assert record.attempts == 1
    finally:
        release.set()


def test_timed_out_step_not_persisted(engine: Engine) -> None:
    """A timed-out step is recorded failed and its late result is never stored, even once the
    function really returns; resume executes it again and stores that second result.
    """
    release = threading.Event()
    calls: list[threading.Thread] = []

    def flaky() -> int:
        calls.append(threading.current_thread())
        if len(calls) == 1:
            release.wait(TIMEOUT)
            return 1  # late: must never be stored
        return 42

    def wf(ctx: Context) -> int:
        value: int = ctx.step("flaky").timeout(0.1).run(flaky)
        return value

    engine.register("wf", wf)
    engine.start()

    try:
        inv = engine.invoke("wf")
        state = inv.wait(TIMEOUT)
        assert isinstance(state, Failed)
        assert "'flaky'" in state.message
        assert "timed out" in state.message
        assert len(calls) == 1

        [record] = engine.steps("wf", inv.instance_id)
        assert (record.key, record.state, record.result, record.attempts) == (
            "flaky", "failed", None, 1,
        )
    finally:
        release.set()

    # Let the abandoned function return its late result and its thread end.
    late_thread = calls[0]
    late_thread.join(TIMEOUT)
    assert not late_thread.is_alive()

    [record] = engine.steps("wf", inv.instance_id)
    assert (record.key, record.state, record.result, record.attempts) == (
        "flaky", "failed", None, 1,
    )
    assert engine.invocation("wf", inv.instance_id).state == state

    resumed = engine.resume("wf", inv.instance_id)
    assert resumed.wait(TIMEOUT) == Completed()
    assert resumed.result(TIMEOUT) == 42
    assert len(calls) == 2
    [record] = engine.steps("wf", inv.instance_id)
    assert (record.key, record.state, record.result, record.attempts) == (
        "flaky", "completed", 42, 2,
    )


def test_timeout_skipped_on_cache_hit(engine: Engine) -> None:
    """A step already stored returns its result at once on resume even with an impossibly
    short timeout: the function is not called and no step thread is started.
    """
    calls: list[str] = []
    timeout = [5.0]
    hung = threading.Event()  # never set: a cache miss on resume would hang and time out

    def counted() -> int:
        calls.append("s1")
        if len(calls) > 1:
            hung.wait(TIMEOUT)
        return 1

    def wf(ctx: Context) -> int:
        value: int = ctx.step("s1").timeout(timeout[0]).run(counted)
        return value

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Completed()
    assert calls == ["s1"]

    calls.clear()
    timeout[0] = 1e-9
    try:
        resumed = engine.resume("wf", inv.instance_id)
        assert resumed.wait(TIMEOUT) == Completed()
        assert resumed.result(TIMEOUT) == 1
        assert calls == []
        [record] = engine.steps("wf", inv.instance_id)
        assert (record.state, record.result, record.attempts) == ("completed", 1, 1)
    finally:
        hung.set()


def test_timeout_with_borrowing_closure(engine: Engine) -> None:
    """A step function with a timeout may be a closure over the workflow's locals: it reads
    them from its step thread and leaves them as they were.
    """
    seen: list[tuple[str, str]] = []

    def wf(ctx: Context) -> str:
        local_data = "borrowed"

        def borrow() -> str:
            seen.append((threading.current_thread().name, local_data))
            return local_data

        value: str = ctx.step("borrow").timeout(5).run(borrow)
        assert local_data == "borrowed"
        return value

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Completed()
    assert inv.result(TIMEOUT) == "borrowed"

    [(thread_name, data)] = seen
    assert thread_name.startswith("memable-step")
    assert data == "borrowed"


def test_a_step_with_a_timeout_gets_its_arguments_and_fails_with_its_own_error(
    tmp_path: Path,
) -> None:
    """fn(*args, **kwargs) on the timeout thread: the arguments arrive, its error is the step's."""
    engine = Engine.open(tmp_path / "db")

    def add(a: int, b: int = 0) -> int:
        return a + b

    def boom() -> None:
        raise ValueError("boom")

    def wf(ctx: Any) -> int:
        total: int = ctx.step("add").timeout(10).run(add, 1, b=2)
        ctx.step("boom").timeout(10).run(boom)
        return total

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        state = inv.wait(timeout=10)
        [add_row, boom_row] = engine.steps("wf", inv.instance_id)
    engine.close()
    assert add_row.result == 3
    assert "ValueError" in str(state)
    assert "boom" in str(state)
    assert boom_row.error is not None
    assert "boom" in boom_row.error


def test_a_step_whose_attempt_timed_out_does_not_hold_up_another_steps_timeout() -> None:
    """Step a timed out (its call abandoned); step b, with a timeout of its own, runs at once."""
    release = threading.Event()
    engine = Engine.in_memory()

    def wf(ctx: Any) -> str:
        with suppress(EngineError):
            ctx.step("a").timeout(0.05).run(release.wait, 30)
        return str(ctx.step("b").timeout(10).run(lambda: "b"))

    engine.register("wf", wf)
    try:
        with engine:
            assert engine.invoke("wf").result(timeout=10) == "b"
    finally:
        release.set()
        engine.close()
