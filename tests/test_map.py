"""Fan-out inside a run: ``ctx.step(key).map(fn, items, max_concurrency=)``, on every store."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import date, timedelta
from typing import Any

import pytest
from freezegun import freeze_time
from helpers import T0

from memable import (
    Cancelled,
    Context,
    DuplicateStepKey,
    Engine,
    Failed,
    Retry,
    SignalRejected,
    Suspended,
)
from memable._engine import access
from memable._run import fan_out
from memable.testing import advance

TIMEOUT = 10.0


def _rows(engine: Engine, name: str, instance_id: str) -> list[tuple[str, str, str, Any]]:
    return [(r.key, r.kind, r.state, r.result) for r in engine.steps(name, instance_id)]


def test_items_are_steps_of_their_own_in_input_order(engine: Engine) -> None:
    """``map`` stores each item as a step of its own, ``key[i]``, returns the results in
    input order, and a replay serves every item from the store."""
    engine.register("wf", lambda ctx: ctx.step("sq").map(lambda n: n * n, [3, 1, 2]))
    with engine:
        assert engine.invoke("wf", instance_id="w").result(TIMEOUT) == [9, 1, 4]
        assert _rows(engine, "wf", "w") == [
            ("sq[0]", "step", "completed", 9),
            ("sq[1]", "step", "completed", 1),
            ("sq[2]", "step", "completed", 4),
        ]
        # A replay serves every item from the store.
        assert engine.resume("wf", "w").result(TIMEOUT) == [9, 1, 4]


def test_at_most_max_concurrency_items_run_at_once_and_that_many_do(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six items, three at a time: each group of three meets at a barrier (so three do
    run at once), no more than three are ever seen running, and the pool that runs
    them has three threads (what makes "never more" hold, not only "not seen")."""
    pools: list[int] = []

    class Pool(ThreadPoolExecutor):
        def __init__(self, max_workers: int, **kwargs: Any) -> None:
            pools.append(max_workers)
            super().__init__(max_workers, **kwargs)

    monkeypatch.setattr(fan_out, "ThreadPoolExecutor", Pool)
    lock = threading.Lock()
    running, most = [0], [0]
    barrier = threading.Barrier(3, timeout=TIMEOUT)
    names: set[str] = set()

    def item(n: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
            names.add(threading.current_thread().name)
        barrier.wait()
        with lock:
            running[0] -= 1
        return n

    engine.register("wf", lambda ctx: ctx.step("k").map(item, range(6), max_concurrency=3))
    with engine:
        inv = engine.invoke("wf", instance_id="w")
        assert inv.result(TIMEOUT) == list(range(6))
    assert most == [3]
    assert pools == [3]
    assert len(names) == 3
    assert all(name.startswith("memable-map wf/w/k") for name in names)


def test_a_failing_item_leaves_the_others_stored_and_a_resume_runs_only_it(
    make_engine: Callable[..., Engine],
) -> None:
    """Item 3 of 10 fails: the other nine are stored, the run fails naming item 3, and a
    resume executes item 3 alone."""
    engine = make_engine()
    calls: Counter[int] = Counter()
    lock = threading.Lock()

    def item(n: int) -> int:
        with lock:
            calls[n] += 1
            first = calls[n] == 1
        if n == 3 and first:
            raise RuntimeError("item 3 fails once")
        return n * 10

    def wf(ctx: Context) -> int:
        return sum(ctx.step("part:v1").map(item, range(10), max_concurrency=4))

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf", instance_id="w").wait(TIMEOUT)
        assert isinstance(state, Failed)
        assert state.message == "step 'part:v1[3]' failed: RuntimeError: item 3 fails once"
        rows = _rows(engine, "wf", "w")
        assert [r for r in rows if r[2] == "completed"] == [
            (f"part:v1[{n}]", "step", "completed", n * 10) for n in range(10) if n != 3
        ]
        assert [r[:3] for r in rows if r[2] != "completed"] == [("part:v1[3]", "step", "failed")]
        assert dict(calls) == dict.fromkeys(range(10), 1)
        assert engine.resume("wf", "w").result(TIMEOUT) == 450
    assert dict(calls) == {n: 2 if n == 3 else 1 for n in range(10)}


def test_the_first_failed_item_by_index_is_raised_once_all_have_ended(engine: Engine) -> None:
    """Item 4 fails first in time, item 1 later: the workflow gets item 1's error, and
    only after every item ended (item 2, held until both failed, is stored)."""
    four_failed, one_failed = threading.Event(), threading.Event()

    def item(n: int) -> int:
        if n == 4:
            four_failed.set()
            raise ValueError("four")
        if n == 1:
            assert four_failed.wait(TIMEOUT)
            one_failed.set()
            raise ValueError("one")
        if n == 2:
            assert one_failed.wait(TIMEOUT)
        return n

    caught: list[str] = []

    def wf(ctx: Context) -> str:
        try:
            ctx.step("k").map(item, range(5), max_concurrency=5)
        except ValueError as exc:
            caught.append(str(exc))
        return "caught"

    engine.register("wf", wf)
    with engine:
        assert engine.invoke("wf", instance_id="w").result(TIMEOUT) == "caught"
        states = {r.key: r.state for r in engine.steps("wf", "w")}
    assert caught == ["one"]
    assert states == {"k[0]": "completed", "k[1]": "failed", "k[2]": "completed",
                      "k[3]": "completed", "k[4]": "failed"}


def test_retry_timeout_and_returns_apply_to_each_item(engine: Engine) -> None:
    """The step's retry, timeout and ``returns`` apply to each item on its own: a flaky
    first item completes on its second attempt, while an item still running past the timeout
    fails the run, its retry refused because the first attempt still runs."""
    attempts: Counter[int] = Counter()
    lock = threading.Lock()
    release = threading.Event()

    def item(n: int) -> date:
        with lock:
            attempts[n] += 1
            first = attempts[n] == 1
        if n == 0 and first:
            raise ConnectionError("flaky")
        if n == 2:
            release.wait(TIMEOUT)  # past its timeout
        return date(2026, 1, n + 1)

    def wf(ctx: Context) -> list[date]:
        step = ctx.step("day").returns(date).timeout(0.5).retry(
            Retry(max_attempts=2, initial_delay=0))
        try:
            return step.map(item, range(3))
        finally:
            release.set()

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf", instance_id="w").wait(TIMEOUT)
        records = {r.key: r for r in engine.steps("wf", "w")}
    assert isinstance(state, Failed)
    assert state.message is not None
    # Its second attempt waits for the first, which is still running: no other starts.
    assert state.message.startswith("step 'day[2]' failed: StepTimeout: timed out after 0.5 s")
    assert state.message.endswith("so no other starts")
    assert (records["day[0]"].state, records["day[0]"].attempts) == ("completed", 2)
    assert (records["day[1]"].state, records["day[1]"].attempts) == ("completed", 1)
    assert (records["day[2]"].state, records["day[2]"].attempts) == ("failed", 1)


def test_results_are_rebuilt_as_returns_says_on_the_first_run_and_on_replay(
    engine: Engine,
) -> None:
    """With ``.returns(date)``, the items' results come back as ``date`` objects both on the
    first run and on a replay from the store."""
    def wf(ctx: Context) -> list[str]:
        days = ctx.step("day").returns(date).map(lambda n: date(2026, 1, n), [1, 2])
        assert all(isinstance(d, date) for d in days)
        return [d.isoformat() for d in days]

    engine.register("wf", wf)
    with engine:
        assert engine.invoke("wf", instance_id="w").result(TIMEOUT) == ["2026-01-01",
                                                                        "2026-01-02"]
        assert engine.resume("wf", "w").result(TIMEOUT) == ["2026-01-01", "2026-01-02"]


def test_no_items_is_an_empty_list_and_no_record(engine: Engine) -> None:
    """Mapping over no items returns an empty list and stores no step."""
    engine.register("wf", lambda ctx: ctx.step("k").map(str, []))
    with engine:
        assert engine.invoke("wf", instance_id="w").result(TIMEOUT) == []
        assert engine.steps("wf", "w") == []


def test_a_key_mapped_twice_in_one_run_is_a_duplicate(engine: Engine) -> None:
    """Mapping the same key twice in one run fails it with ``DuplicateStepKey`` at the first
    item's key."""
    def wf(ctx: Context) -> None:
        ctx.step("k").map(str, [1])
        ctx.step("k").map(str, [1])

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf", instance_id="w").wait(TIMEOUT)
    assert isinstance(state, Failed)
    assert state.message is not None
    assert state.message.startswith(f"step 'k[0]' failed: {DuplicateStepKey.__name__}")


@pytest.mark.parametrize(("bad", "error"), [(0, "ValueError"), (-2, "ValueError"),
                                            (1.5, "TypeError"), (True, "TypeError")])
def test_a_bad_max_concurrency_fails_the_run_and_stores_nothing(
    engine: Engine, bad: Any, error: str
) -> None:
    """A ``max_concurrency`` of zero, a negative number, a float or a bool fails the run
    with a message saying it must be a positive int, storing no step."""
    engine.register("wf", lambda ctx: ctx.step("k").map(str, [1], max_concurrency=bad))
    with engine:
        state = engine.invoke("wf", instance_id="w").wait(TIMEOUT)
        assert engine.steps("wf", "w") == []
    assert isinstance(state, Failed)
    assert state.message is not None
    assert f"{error}: max_concurrency is a positive int" in state.message


def test_a_cancel_stops_the_items_not_started_and_stores_the_one_in_flight(
    make_engine: Callable[..., Engine],
) -> None:
    """A cancel while the first item runs (``max_concurrency=1``, the item held) lets that
    item finish and store its result but starts none of the others."""
    engine = make_engine()
    started, release = threading.Event(), threading.Event()
    ran: list[int] = []

    def item(n: int) -> int:
        ran.append(n)
        if n == 0:
            started.set()
            assert release.wait(TIMEOUT)
        return n

    engine.register("wf", lambda ctx: ctx.step("k").map(item, range(4), max_concurrency=1))
    with engine:
        inv = engine.invoke("wf", instance_id="w")
        assert started.wait(TIMEOUT)
        engine.cancel("wf", "w")
        release.set()
        assert inv.wait(TIMEOUT) == Cancelled()
        assert _rows(engine, "wf", "w") == [("k[0]", "step", "completed", 0)]
    assert ran == [0]


def test_a_signal_for_an_item_in_flight_is_rejected(make_engine: Callable[..., Engine]) -> None:
    """A signal sent to an item's key while that item runs (held on an event) is rejected as
    in flight, and the map still completes with every item's own result."""
    engine = make_engine()
    started, release = threading.Event(), threading.Event()

    def item(n: int) -> int:
        if n == 1:
            started.set()
            assert release.wait(TIMEOUT)
        return n

    engine.register("wf", lambda ctx: ctx.step("k").map(item, range(3)))
    with engine:
        inv = engine.invoke("wf", instance_id="w")
        assert started.wait(TIMEOUT)
        try:
            with pytest.raises(SignalRejected, match="in flight"):
                engine.signal("wf", "w", "k[1]", "taken")
        finally:
            release.set()
        assert inv.result(TIMEOUT) == [0, 1, 2]


def test_the_steps_in_flight_name_an_item_that_runs(make_engine: Callable[..., Engine]) -> None:
    """What an operator sees (the runner's steps in flight) names a running item."""
    engine = make_engine()
    started, release = threading.Event(), threading.Event()

    def item(n: int) -> int:
        if n == 0:
            started.set()
            assert release.wait(TIMEOUT)
        return n

    engine.register("wf", lambda ctx: ctx.step("k").map(item, range(2), max_concurrency=1))
    with engine:
        inv = engine.invoke("wf", instance_id="w")
        assert started.wait(TIMEOUT)
        try:
            [(name, instance_id, key, since)] = access.in_flight(engine)
        finally:
            release.set()
        assert (name, instance_id, key) == ("wf", "w", "k[0]")
        assert since is not None
        assert inv.result(TIMEOUT) == [0, 1]


def test_a_long_retry_backoff_of_an_item_ends_the_run_after_the_others(
    make_engine: Callable[..., Engine],
) -> None:
    """Item 1's backoff is a durable timer: the other items end and are stored, the run
    ends Suspended("retry k[1]"), and once the backoff is over only item 1 runs again."""
    engine = make_engine(poll_interval=60)
    calls: Counter[int] = Counter()
    lock = threading.Lock()

    def item(n: int) -> int:
        with lock:
            calls[n] += 1
            first = calls[n] == 1
        if n == 1 and first:
            raise ConnectionError("try again later")
        return n

    policy = Retry(max_attempts=2, initial_delay=5, jitter=False)
    engine.register("wf", lambda ctx: ctx.step("k").retry(policy).map(item, range(3)))
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf", instance_id="w")
        assert inv.wait(TIMEOUT) == Suspended("retry k[1]")
        assert [r[:3] for r in _rows(engine, "wf", "w")] == [
            ("k[0]", "step", "completed"), ("k[1]", "step", "waiting"),
            ("k[2]", "step", "completed"),
        ]
        assert advance(engine, clock, timedelta(seconds=5)) == 1
        assert inv.result(TIMEOUT) == [0, 1, 2]
    assert dict(calls) == {0: 1, 1: 2, 2: 1}
