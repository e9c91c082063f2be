"""Suspend, signal, timers and step timeouts beyond the seed: races, clocks, other engines."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from freezegun import freeze_time
from helpers import PATIENCE, T0, clocked_engine, dump, final_state, wrap_after

from memable import (
    Completed,
    Context,
    Engine,
    Failed,
    InstanceFinished,
    InstanceNotFound,
    InvalidKey,
    Invocation,
    SerializationError,
    SignalRejected,
    StepRecord,
    StepTimeout,
    Suspended,
    WorkflowNotFound,
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
    begin_run = engine._store.begin_run

    def held_claim(*args: object, **kwargs: object) -> object:
        claiming.set()
        assert release.wait(10), "the test did not release the claim"
        return begin_run(*args, **kwargs)  # type: ignore[arg-type]

    engine.register("wf", lambda ctx: ctx.suspend("n:v1") * 2)
    with engine:
        inv = engine.invoke("wf", instance_id="i")
        assert inv.wait(10) == Suspended("n:v1")
        engine._store.begin_run = held_claim  # type: ignore[method-assign]
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


def _slow_polling_engine(store: str, tmp_path: Path) -> Engine:
    """An engine in memory or on a file that polls once a minute, its lease far off: only
    what the test forces can carry an instance on."""
    options: dict[str, Any] = {"poll_interval": 60, "lease": 600}
    if store == "memory":
        return Engine.in_memory(**options)
    return Engine.open(tmp_path / "db", **options)


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

    wrap_after(engine._store, "suspend", signal_once_waiting)
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

    wrap_after(engine._store, "suspend", signal_once_waiting)
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

    wrap_after(engine._store, "save_step", signal_b_after_a)
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


def test_timers_and_leases_read_the_clock_the_engine_is_given() -> None:
    """An engine given its own clock fires a timer when that clock says so, without freezegun."""
    engine, now = clocked_engine()
    engine.register("wf", lambda ctx: ctx.timer("t", 3600) or "woke")
    with engine:
        inv = engine.invoke("wf", instance_id="x")
        assert str(inv.wait(timeout=10)) == "suspended: timer t"
        assert engine.fire_due_timers() == 0
        now[0] += 3600
        assert engine.fire_due_timers() == 1
        assert inv.result(timeout=10) == "woke"
    engine.close()


def test_a_run_that_reaches_its_timer_after_the_deadline_but_before_it_fired_goes_on() -> None:
    """The clock passes the deadline with the timer thread asleep; a resume replays to it.

    The timer row keeps its first deadline (a later run does not move it),
    and a run that reaches a timer already due fires it itself and goes on.
    """
    engine, now = clocked_engine()
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
