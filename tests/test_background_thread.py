"""The engine's background thread (``memable-timers``): its loop of looks at the store (a
poll each interval, a look at once when a timer is armed or a deadline is due, failed looks
logged), the heartbeat's pace, and the threads a started engine has."""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import runner_of

from memable import (
    Engine,
    StorageError,
)
from memable._background.timers import BackgroundThread
from memable._clock import Clock
from memable._run.options import Options
from memable._run.runner import Runner
from memable._sqlite.store import SQLiteStore


def _ticking(
    poll_interval: float, answer: Callable[[int], float | None], clock: Clock | None = None
) -> tuple[BackgroundThread, list[bool], threading.Condition]:
    """A timer thread whose tick records its ``poll`` flags and answers ``answer(n)``."""
    polls: list[bool] = []
    ticked = threading.Condition()

    def tick(poll: bool) -> float | None:
        with ticked:
            polls.append(poll)
            ticked.notify_all()
            return answer(len(polls))

    thread = BackgroundThread(tick, poll_interval, clock or Clock())
    return thread, polls, ticked


def _wait_ticks(polls: list[bool], ticked: threading.Condition, n: int, timeout: float) -> bool:
    with ticked:
        return ticked.wait_for(lambda: len(polls) >= n, timeout)


def test_the_timer_thread_polls_once_per_interval_and_ticks_again_when_armed() -> None:
    """A first look polls; a timer armed later gets a look without a poll (next poll: 60 s)."""
    thread, polls, ticked = _ticking(60, lambda n: None)
    thread.start()
    assert _wait_ticks(polls, ticked, 1, 10)
    thread.armed()
    assert _wait_ticks(polls, ticked, 2, 10)
    thread.stop()
    assert polls == [True, False]


def test_the_timer_thread_looks_again_at_once_when_a_deadline_is_due() -> None:
    """Ticks that answer "due now" get the next look at once: five in well under a second each."""
    thread, polls, ticked = _ticking(60, lambda n: 0.0)
    start = time.monotonic()
    thread.start()
    assert _wait_ticks(polls, ticked, 5, 10)
    thread.stop()
    assert time.monotonic() - start < 2.5


def test_the_timer_thread_polls_every_interval_even_below_a_second() -> None:
    """With a 10 ms poll interval, five polls take far less than five seconds."""
    thread, polls, ticked = _ticking(0.01, lambda n: None)
    start = time.monotonic()
    thread.start()
    assert _wait_ticks(polls, ticked, 5, 10)
    thread.stop()
    assert time.monotonic() - start < 2.5
    assert polls[:5] == [True] * 5


def test_a_timer_thread_stopped_before_its_first_look_never_ticks() -> None:
    """stop() lands while the thread starts up: it ends without a single tick."""
    started, go = threading.Event(), threading.Event()

    def monotonic() -> float:
        if not started.is_set():
            started.set()
            assert go.wait(10)
        return time.monotonic()

    thread, polls, _ = _ticking(60, lambda n: None, Clock(monotonic=monotonic))
    thread.start()
    assert started.wait(10)
    stopper = threading.Thread(target=thread.stop)
    stopper.start()
    with thread._cond:
        assert thread._cond.wait_for(lambda: thread._stopping, 10)
    go.set()
    stopper.join(10)
    assert not thread.is_alive()
    assert polls == []


def test_a_tick_that_raises_is_logged_and_the_thread_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed look (a store locked past its timeout) is logged; the next look still comes."""

    def answer(n: int) -> float | None:
        if n == 1:
            raise sqlite3.OperationalError("database is locked")
        return None

    thread, polls, ticked = _ticking(60, answer)
    with caplog.at_level(logging.ERROR, logger="memable"):
        thread.start()
        assert _wait_ticks(polls, ticked, 1, 10)
        thread.armed()
        assert _wait_ticks(polls, ticked, 2, 10)
        thread.stop()
    [failed] = caplog.records
    assert failed.getMessage() == "timer thread: looking at the store failed; trying again"
    assert failed.exc_info is not None
    assert isinstance(failed.exc_info[1], sqlite3.OperationalError)


def test_looks_that_fail_with_a_storage_error_log_one_line_per_run_of_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store unreachable for several looks is one WARNING line without a traceback, not
    one traceback per look; after a look that succeeds, the next failure is said again."""

    def answer(n: int) -> float | None:
        if n in (1, 2, 3, 5):
            raise StorageError(f"cannot look at the store (look {n})")
        return None

    thread, polls, ticked = _ticking(60, answer)
    with caplog.at_level(logging.WARNING, logger="memable"):
        thread.start()
        assert _wait_ticks(polls, ticked, 1, 10)
        for n in range(2, 7):  # each look armed after the one before began
            thread.armed()
            assert _wait_ticks(polls, ticked, n, 10)
        thread.stop()
    assert [r.getMessage() for r in caplog.records] == [
        "timer thread: looking at the store failed; trying again "
        "(cannot look at the store (look 1))",
        "timer thread: looking at the store failed; trying again "
        "(cannot look at the store (look 5))",
    ]
    assert not [r for r in caplog.records if r.exc_info]


# ---------------------------------------------------------------------- in an engine


def test_the_timer_thread_is_a_daemon_named_for_memable(tmp_path: Path) -> None:
    """One daemon thread named memable-timers per started engine (a forgotten stop never hangs)."""
    engine = Engine.open(tmp_path / "db")
    with engine:
        timers = [t for t in threading.enumerate() if t.name == "memable-timers"]
        assert len(timers) == 1
        assert timers[0].daemon
    engine.close()
    assert not timers[0].is_alive()


def test_start_sizes_names_and_paces_the_engines_threads() -> None:
    """The worker pool has max_workers threads named memable-worker; the timer thread looks
    at least every third of the lease (the heartbeat must come in time, whatever the poll
    interval), and the first heartbeat is due a third of a lease after start."""
    now = [1_800_000_000.0]
    engine = Engine(
        SQLiteStore(None, "full"),
        Options(max_workers=3, poll_interval=60, lease=3.0, clock=Clock(wall=lambda: now[0])),
    )
    names: list[str] = []
    engine.register("wf", lambda ctx: ctx.step("s").run(
        lambda: names.append(threading.current_thread().name)))
    with engine:
        runner = runner_of(engine)
        assert runner.runs.executor is not None
        assert runner.runs.executor._max_workers == 3
        assert runner.claims.background is not None
        assert runner.claims.background._poll_interval == 1.0
        assert runner.claims._next_heartbeat == now[0] + 1.0
        engine.invoke("wf").result(timeout=10)
    engine.close()
    assert [name.split("_")[0] for name in names] == ["memable-worker"]


def test_a_timer_armed_while_the_thread_sleeps_to_the_next_poll_wakes_it(tmp_path: Path) -> None:
    """A 0.2 s timer fires long before the thread's next look (60 s poll, 200 s heartbeat).

    The run starts only once the thread made its first look and went to
    sleep: arming the timer must wake it to look at the deadlines again.
    """
    engine = Engine.open(tmp_path / "db", poll_interval=60, lease=600)
    engine.register("wf", lambda ctx: ctx.timer("soon:v1", 0.2) or "fired")
    looked = threading.Event()
    claims = runner_of(engine).claims
    real = claims.tick

    def tick(poll: bool) -> float | None:
        until = real(poll)
        looked.set()
        return until

    claims.tick = tick  # type: ignore[method-assign]
    with engine:
        assert looked.wait(10)
        assert engine.invoke("wf").result(timeout=10) == "fired"
    engine.close()


def test_the_heartbeat_comes_every_third_of_the_lease_by_the_engines_clock() -> None:
    """Ticks at 0.5, 1.0, 1.5, 1.9 and 2.0 s of a 3 s lease: beats at 1.0 and 2.0 only."""
    now = [1_800_000_000.0]
    store = SQLiteStore(None, "full")
    runner = Runner(store, Options(lease=3.0, clock=Clock(wall=lambda: now[0])))
    start = now[0]
    store.register_owner(3.0, start)
    runner.claims._next_heartbeat = start + 1.0  # as start() sets it
    beats: list[float] = []
    real = store.heartbeat

    def noted(at: float) -> None:
        beats.append(at - start)
        real(at)

    store.heartbeat = noted  # type: ignore[method-assign]
    for offset in (0.5, 1.0, 1.5, 1.9, 2.0):
        now[0] = start + offset
        runner.claims.tick(False)
    store.close()
    assert beats == [1.0, 2.0]
