"""Schedules in one process: declaration, ticks fired once, downtime and catch-up, overlap,
a queue that buffers, a changed cron, two engines, store errors; on every store.

The clock is frozen (freezegun): ``fire_due_timers()`` fires the ticks due now,
whichever of it and the engine's timer thread gets to a tick first (the other
finds it fired), so the tests assert what is stored, not who fired it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from freezegun import freeze_time
from freezegun.api import FrozenDateTimeFactory
from helpers import store_of

from memable import AlreadyStarted, Completed, Context, Engine, Queued, StorageError
from memable._clock import Clock
from memable._engine.builder import EngineBuilder
from memable._run.options import Options
from memable._sqlite.store import SQLiteStore
from memable.testing import advance

TIMEOUT = 10


def at(day: int, hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 6, day, hour, minute, tzinfo=timezone.utc)


def tick(day: int, hour: int, minute: int = 0) -> str:
    """The id of the tick of schedule "every" at that time."""
    return f"every@{at(day, hour, minute):%Y-%m-%dT%H:%M:%SZ}"


def ticks_of(engine: Engine, workflow: str = "job") -> list[str]:
    return sorted(i for i, _ in engine.list_instances(workflow))


def schedule_row(engine: Engine, name: str = "every") -> Any:
    [row] = [r for r in store_of(engine).schedules() if r.name == name]
    return row


def job(ctx: Context, moment: datetime) -> str:
    return f"ran {moment:%d %H:%M}"


def move(clock: FrozenDateTimeFactory, engine: Engine, to: datetime) -> None:
    """Move the frozen clock to ``to`` and fire what is due (here or on the timer thread),
    then wait for every run that started."""
    clock.move_to(to)
    engine.fire_due_timers()
    for instance_id, _ in engine.list_instances("job"):
        engine.invocation("job", instance_id).wait(TIMEOUT)


@pytest.fixture
def scheduled(make_engine: Callable[..., Engine]) -> Callable[..., Engine]:
    """An engine (on the parametrised store) running ``job`` on the schedule "every"."""

    def make(cron: str = "0 * * * *", **options: Any) -> Engine:
        engine = make_engine(poll_interval=60)
        engine.register("job", job)
        engine.schedule("every", cron, "job", **options)
        return engine

    return make


# ---------------------------------------------------------------------- declaration


def _bad(engine: Engine, **changes: Any) -> str:
    args: dict[str, Any] = {"name": "every", "cron": "0 * * * *", "workflow": "job", **changes}
    with pytest.raises(ValueError, match=r".") as raised:
        engine.schedule(args.pop("name"), args.pop("cron"), args.pop("workflow"), **args)
    return str(raised.value)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"cron": "61 * * * *"}, "cron '61 * * * *'"),
        ({"cron": "0 0 0 * * *"}, "cron '0 0 0 * * *' has 6 fields"),
        ({"cron": "0 * * *"}, "cron '0 * * *' has 4 fields"),
        ({"cron": "@fortnightly"}, "cron '@fortnightly'"),
        ({"cron": ""}, "cron must be"),
        ({"cron": 5}, "cron must be"),
        ({"cron": "0 0 30 2 *"}, "cron '0 0 30 2 *'"),
        ({"timezone": "Mars/Olympus"}, "timezone 'Mars/Olympus'"),
        ({"timezone": ""}, "timezone must be"),
        ({"workflow": "nope"}, "workflow 'nope' of schedule 'every' is not registered"),
        ({"queue": "nope"}, "queue 'nope' of schedule 'every' is not declared"),
        ({"catch_up": "every"}, "catch_up must be one of"),
        ({"overlap": "queue"}, "overlap must be one of"),
        ({"name": ""}, "name must be"),
        ({"name": "a@b"}, "name 'a@b' has an '@'"),
        ({"name": "_private"}, "name '_private' starts with '_'"),
        ({"input": object()}, "input of schedule 'every'"),
    ],
)
def test_a_bad_argument_is_a_value_error_naming_it(
    changes: dict[str, Any], named: str
) -> None:
    """``engine.schedule`` refuses a bad cron (out of range, six or four fields, unknown
    alias, empty, not a str, a date that never comes), an unknown timezone, an unregistered
    workflow, an undeclared queue, an unknown ``catch_up`` or ``overlap``, a bad name or an
    input it cannot store, with a ``ValueError`` naming what is wrong."""
    engine = Engine.in_memory()
    engine.register("job", job)
    assert named in _bad(engine, **changes)
    engine.close()


def test_an_input_the_workflow_cannot_take_is_refused_at_declaration() -> None:
    """A workflow typed for an int cannot be given its tick (a datetime); one that takes
    no input cannot be given one."""

    def count(ctx: Context, n: int) -> int:
        return n

    engine = Engine.in_memory()
    engine.register("count", count)
    engine.register("none", lambda ctx: None)
    assert _bad(engine, workflow="count") == (
        "input of schedule 'every': its tick (an aware UTC datetime) does not fit the input "
        "of workflow 'count' (annotated <class 'int'>); give input= a value of that type"
    )
    assert _bad(engine, workflow="none", input=3) == (
        "input of schedule 'every': workflow 'none' takes no input, got int (its one "
        "parameter, 'ctx', receives the Context; to take an input, make it fn(ctx, value))"
    )
    engine.schedule("fine", "@daily", "count", input=3)
    engine.schedule("fine too", "@daily", "none")
    engine.close()


def test_a_name_declared_twice_is_a_value_error() -> None:
    """Declaring a schedule name a second time, even with another cron, raises
    ``ValueError`` saying it is declared already."""
    engine = Engine.in_memory()
    engine.register("job", job)
    engine.schedule("every", "0 * * * *", "job")
    assert _bad(engine, cron="30 * * * *") == "schedule 'every' is already declared"
    engine.close()


def test_a_declaration_after_start_raises_already_started() -> None:
    """Declaring a schedule on an engine already started raises ``AlreadyStarted``."""
    engine = Engine.in_memory()
    engine.register("job", job)
    with engine, pytest.raises(AlreadyStarted):
        engine.schedule("every", "0 * * * *", "job")


@pytest.mark.parametrize(
    ("alias", "fields"),
    [("@hourly", "0 * * * *"), ("@daily", "0 0 * * *"), ("@weekly", "0 0 * * 0"),
     ("@monthly", "0 0 1 * *"), ("@yearly", "0 0 1 1 *"), ("@annually", "0 0 1 1 *"),
     ("@DAILY", "0 0 * * *")],
)
def test_the_aliases_are_their_five_fields(alias: str, fields: str) -> None:
    """Each ``@`` alias, in any case, parses to its five cron fields (``@annually`` is
    ``@yearly``)."""
    from memable._schedules.cron import Cron

    assert Cron.parse(alias).fields == fields


# ---------------------------------------------------------------------- ticks


def test_a_due_tick_runs_once_with_the_tick_as_input(scheduled: Callable[..., Engine]) -> None:
    """A tick runs once when due, as instance ``every@<time>`` with its time as input;
    firing again or moving to the next minute starts nothing more, and the next hour's tick
    runs."""
    engine = scheduled()
    with freeze_time(at(1, 9, 59)) as clock, engine:
        move(clock, engine, at(1, 10))
        assert engine.invocation("job", tick(1, 10)).result(TIMEOUT) == "ran 01 10:00"
        assert engine.fire_due_timers() == 0  # nothing more is due
        move(clock, engine, at(1, 10, 30))
        assert ticks_of(engine) == [tick(1, 10)]
        move(clock, engine, at(1, 11))
        assert ticks_of(engine) == [tick(1, 10), tick(1, 11)]
        assert engine.invocation("job", tick(1, 11)).wait(TIMEOUT) == Completed()


def test_fire_due_timers_fires_a_due_tick_before_the_timer_thread_looks(
    scheduled: Callable[..., Engine],
) -> None:
    """With the timer thread asleep for the poll interval, the call alone fires it."""
    engine = scheduled()
    with freeze_time(at(1, 9, 59)) as clock, engine:
        clock.move_to(at(1, 10))
        fired = engine.fire_due_timers()
        runs = ticks_of(engine)
    assert (fired, runs) in [(1, [tick(1, 10)]), (0, [tick(1, 10)])]
    assert runs == [tick(1, 10)]


def test_a_given_input_is_each_ticks_input(make_engine: Callable[..., Engine]) -> None:
    """A schedule declared with ``input=`` passes that input to each tick's run in place of
    the tick's time."""
    engine = make_engine(poll_interval=60)
    engine.register("job", lambda ctx, region: f"report for {region}")
    engine.schedule("every", "@hourly", "job", input="emea")
    with freeze_time(at(1, 9, 59)) as clock, engine:
        move(clock, engine, at(1, 10))
        assert engine.invocation("job", tick(1, 10)).result(TIMEOUT) == "report for emea"


def test_a_workflow_that_takes_no_input_gets_none(make_engine: Callable[..., Engine]) -> None:
    """A scheduled workflow that takes no argument is run with none."""
    engine = make_engine(poll_interval=60)
    engine.register("job", lambda ctx: "done")
    engine.schedule("every", "@hourly", "job")
    with freeze_time(at(1, 9, 59)) as clock, engine:
        move(clock, engine, at(1, 10))
        assert engine.invocation("job", tick(1, 10)).result(TIMEOUT) == "done"


def test_the_timer_thread_fires_a_tick_on_its_own(store_target: dict[str, Any]) -> None:
    """No fire_due_timers(): the tick is a deadline the timer thread sleeps until. Its
    polls (and heartbeats) are a minute apart, so only that deadline wakes it in time.
    The engine's wall clock runs in real time but starts 5 s before a minute, so the
    tick of ``* * * * *`` is 5 s away instead of up to a minute."""
    offset = [0.0]
    clock = Clock(wall=lambda: time.time() + offset[0])
    engine = EngineBuilder(
        path=store_target.get("target"), memory=not store_target,
        schema=store_target.get("schema"), factory=Engine,
        options=Options(poll_interval=60, lease=600, clock=clock),
    ).build()
    fired = threading.Event()
    engine.register("job", lambda ctx, moment: fired.set())
    engine.schedule("every", "* * * * *", "job")
    now = time.time()
    offset[0] = (-now - 5.0) % 60  # now + offset is 5 s before a minute
    try:
        with engine:
            # Started at once, it looks at the store on start and next in 60 s.
            assert fired.wait(40)
    finally:
        engine.close()


# ---------------------------------------------------------------------- downtime


@pytest.fixture
def two_engines(open_shared: Callable[..., Engine]) -> Callable[..., Engine]:
    """Engines on one shared store (a file, or a PostgreSQL schema), each running ``job``
    on the schedule "every"."""

    def make(
        cron: str = "0 * * * *", fn: Callable[..., Any] = job, **options: Any
    ) -> Engine:
        engine = open_shared(poll_interval=60)
        engine.register("job", fn)
        engine.schedule("every", cron, "job", **options)
        return engine

    return make


def _down_from_10_to_1305(
    make: Callable[..., Engine], cron: str = "0 * * * *", **options: Any
) -> tuple[list[str], Any]:
    """One engine fires the 10:00 tick and stops; the next starts at 13:05 and looks: the
    ticks that ran, and the schedule's row."""
    with freeze_time(at(1, 9, 59)) as clock:
        first = make(cron, **options)
        with first:
            move(clock, first, at(1, 10))
        clock.move_to(at(1, 13, 5))
        second = make(cron, **options)
        with second:
            move(clock, second, at(1, 13, 5))
            return ticks_of(second), schedule_row(second)


def test_after_downtime_catch_up_latest_runs_the_newest_missed_tick(
    two_engines: Callable[..., Engine],
) -> None:
    """With no engine running from 10:00 to 13:05 and ``catch_up="latest"`` (the default),
    the next engine runs only the 13:00 tick and counts 11:00 and 12:00 as missed."""
    runs, row = _down_from_10_to_1305(two_engines)
    assert runs == [tick(1, 10), tick(1, 13)]
    assert row.missed == 2  # 11:00 and 12:00
    assert row.last_tick == "2026-06-01T13:00:00Z"


def test_after_downtime_catch_up_all_runs_each_missed_tick(
    two_engines: Callable[..., Engine],
) -> None:
    """With no engine running from 10:00 to 13:05 and ``catch_up="all"``, the next engine
    runs the 11:00, 12:00 and 13:00 ticks, missing none."""
    runs, row = _down_from_10_to_1305(two_engines, catch_up="all")
    assert runs == [tick(1, 10), tick(1, 11), tick(1, 12), tick(1, 13)]
    assert row.missed == 0


def test_after_downtime_catch_up_none_runs_no_missed_tick(
    two_engines: Callable[..., Engine],
) -> None:
    """With no engine running from 10:00 to 13:05 and ``catch_up="none"``, the next engine
    runs none of the ticks it missed and counts three missed."""
    runs, row = _down_from_10_to_1305(two_engines, catch_up="none")
    assert runs == [tick(1, 10)]
    assert row.missed == 3


def test_catch_up_all_runs_the_newest_hundred_oldest_first_and_counts_the_rest(
    two_engines: Callable[..., Engine], caplog: pytest.LogCaptureFixture,
) -> None:
    """Down 3 hours with a tick a minute: 180 missed; the newest 100 run, 80 are counted
    and logged once."""
    with caplog.at_level(logging.WARNING, logger="memable"):
        runs, row = _down_from_10_to_1305(two_engines, "* * * * *", catch_up="all")
    # 10:00 ran on time; then 10:01 .. 13:05 (185 ticks) fell due while no engine ran.
    newest = [at(1, 11, 26) + timedelta(minutes=m) for m in range(100)]
    assert runs == [tick(1, 10)] + [f"every@{t:%Y-%m-%dT%H:%M:%SZ}" for t in newest]
    assert row.missed == 185 - 100
    missed_lines = [r for r in caplog.records if "missed" in r.getMessage()]
    assert len(missed_lines) == 1
    assert "85 ticks missed" in missed_lines[0].getMessage()


def test_a_missed_tick_is_never_fired_as_a_live_one(
    scheduled: Callable[..., Engine],
) -> None:
    """catch_up="none": a tick found long after it fell due is missed, even when it is the
    only one due; the next tick, found on time, runs."""
    engine = scheduled(catch_up="none")
    with freeze_time(at(1, 9, 59)) as clock, engine:
        move(clock, engine, at(1, 10, 20))  # 20 minutes late
        assert ticks_of(engine) == []
        assert schedule_row(engine).missed == 1
        move(clock, engine, at(1, 11))
        assert ticks_of(engine) == [tick(1, 11)]


@pytest.mark.parametrize(
    "changed",
    [{"cron": "30 * * * *"}, {"cron": "0 * * * *", "timezone": "Asia/Kolkata"}],
    ids=["cron", "zone"],
)
def test_a_changed_cron_or_zone_starts_from_now_without_catching_up(
    two_engines: Callable[..., Engine], changed: dict[str, str],
) -> None:
    """Down from 10:00 to 13:05, then declared with another cron (or zone, where 13:30 UTC
    is 19:00): no tick before 13:05 is caught up, though catch_up is "all"."""
    with freeze_time(at(1, 9, 59)) as clock:
        first = two_engines("0 * * * *")
        with first:
            move(clock, first, at(1, 10))
        clock.move_to(at(1, 13, 5))
        options = dict(changed)  # the parameter is shared by the stores' runs: copy it
        cron = options.pop("cron")
        second = two_engines(cron, catch_up="all", **options)
        with second:
            move(clock, second, at(1, 13, 5))
            assert ticks_of(second) == [tick(1, 10)]
            assert (schedule_row(second).cron, schedule_row(second).timezone) == (
                cron, options.get("timezone", "UTC"))
            move(clock, second, at(1, 13, 30))
            assert ticks_of(second) == [tick(1, 10), tick(1, 13, 30)]


# ---------------------------------------------------------------------- several engines


def test_two_running_engines_fire_each_tick_once(two_engines: Callable[..., Engine]) -> None:
    """Both declare the schedule and both look at every tick: one run per tick."""
    runs: list[str] = []
    lock = threading.Lock()

    def counted(ctx: Context, moment: datetime) -> None:
        with lock:
            runs.append(ctx.instance_id)

    with freeze_time(at(1, 9, 59)) as clock:
        engines = [two_engines(fn=counted) for _ in range(2)]
        for engine in engines:
            engine.start()
        for hour in range(10, 16):
            clock.move_to(at(1, hour))
            for engine in engines:
                engine.fire_due_timers()
            for engine in engines:
                for instance_id, _ in engine.list_instances("job"):
                    engine.invocation("job", instance_id).wait(TIMEOUT)
        for engine in engines:
            engine.wait_all()
    assert sorted(runs) == [tick(1, hour) for hour in range(10, 16)]


def test_two_engines_that_planned_one_catch_up_count_each_missed_tick_once(
    two_engines: Callable[..., Engine],
) -> None:
    """Both engines read the schedule at 09:59 and neither fires until 13:05 (their timer
    threads sleep for the poll interval): both plan the same catch-up; the one whose firing
    comes second finds the last tick moved and writes nothing: 3 ticks missed, not 6."""
    with freeze_time(at(1, 9, 59)) as clock:
        engines = [two_engines(catch_up="latest") for _ in range(2)]
        for engine in engines:
            engine.start()
        clock.move_to(at(1, 13, 5))
        for engine in engines:
            engine.fire_due_timers()
        for engine in engines:
            engine.wait_all()
        reader = two_engines()
        assert ticks_of(reader) == [tick(1, 13)]
        assert schedule_row(reader).missed == 3


def test_two_engines_declaring_one_name_differently_each_warn_naming_both(
    two_engines: Callable[..., Engine], caplog: pytest.LogCaptureFixture,
) -> None:
    """The engine that starts second sees the first's declaration; the first sees the
    second's in the store at its next firing. Each warns once, naming both; each fires its
    own ticks."""
    with freeze_time(at(1, 9, 59)) as clock, caplog.at_level(logging.WARNING, "memable"):
        first = two_engines("0 * * * *")
        first.start()
        second = two_engines("30 * * * *")
        second.start()
        for moment in (at(1, 10), at(1, 10, 30), at(1, 11), at(1, 11, 30)):
            clock.move_to(moment)
            first.fire_due_timers()
            second.fire_due_timers()
        runs = ticks_of(first)
        second.close()
        first.close()
    warnings = [r.getMessage() for r in caplog.records if "declared" in r.getMessage()]
    assert len(warnings) == 2
    for warning in warnings:
        assert "'30 * * * *'" in warning
        assert "'0 * * * *'" in warning
    assert runs == [tick(1, 10), tick(1, 10, 30), tick(1, 11), tick(1, 11, 30)]


# ---------------------------------------------------------------------- overlap and queues


def test_overlap_skip_skips_a_tick_while_an_earlier_one_has_not_ended(
    make_engine: Callable[..., Engine],
) -> None:
    """With ``overlap="skip"``, the 11:00 tick is skipped and counted while the 10:00 run
    still waits for a signal; once that run ends, the 12:00 tick runs."""
    engine = make_engine(poll_interval=60)
    engine.register("job", lambda ctx, moment: ctx.suspend("done"))
    engine.schedule("every", "0 * * * *", "job", overlap="skip")
    with freeze_time(at(1, 9, 59)) as clock, engine:
        move(clock, engine, at(1, 10))
        move(clock, engine, at(1, 11))  # 10:00 waits for its signal: 11:00 is skipped
        assert ticks_of(engine) == [tick(1, 10)]
        assert schedule_row(engine).skipped == 1
        engine.signal("job", tick(1, 10), "done", None).wait(TIMEOUT)
        move(clock, engine, at(1, 12))
        assert ticks_of(engine) == [tick(1, 10), tick(1, 12)]


def test_overlap_allow_runs_a_tick_while_an_earlier_one_has_not_ended(
    make_engine: Callable[..., Engine],
) -> None:
    """With the default overlap, the 11:00 tick runs while the 10:00 run still waits for a
    signal, and nothing is counted skipped."""
    engine = make_engine(poll_interval=60)
    engine.register("job", lambda ctx, moment: ctx.suspend("done"))
    engine.schedule("every", "0 * * * *", "job")
    with freeze_time(at(1, 9, 59)) as clock, engine:
        move(clock, engine, at(1, 10))
        move(clock, engine, at(1, 11))
        assert ticks_of(engine) == [tick(1, 10), tick(1, 11)]
        assert schedule_row(engine).skipped == 0
        for hour in (10, 11):
            engine.cancel("job", tick(1, hour))


def test_a_queue_of_concurrency_one_buffers_the_ticks(make_engine: Callable[..., Engine]) -> None:
    """Two ticks: the second waits queued until the first has ended."""
    engine = make_engine(poll_interval=60)
    release = threading.Event()
    started: list[str] = []

    def slow(ctx: Context, moment: datetime) -> None:
        started.append(ctx.instance_id)
        ctx.step("work").run(lambda: release.wait(TIMEOUT))

    engine.queue("serial", concurrency=1)
    engine.register("job", slow)
    engine.schedule("every", "0 * * * *", "job", queue="serial")
    with freeze_time(at(1, 9, 59)) as clock, engine:
        clock.move_to(at(1, 10))
        engine.fire_due_timers()
        first = engine.invocation("job", tick(1, 10))
        clock.move_to(at(1, 11))
        engine.fire_due_timers()
        second = engine.invocation("job", tick(1, 11))
        assert second.state == Queued()
        assert started in ([], [tick(1, 10)])
        release.set()
        assert first.wait(TIMEOUT) == Completed()
        assert second.wait(TIMEOUT) == Completed()
    assert started == [tick(1, 10), tick(1, 11)]


# ---------------------------------------------------------------------- store errors


def test_a_store_error_while_firing_is_logged_and_retried(
    scheduled: Callable[..., Engine], caplog: pytest.LogCaptureFixture,
) -> None:
    """The first firing fails; the schedule is kept and fired on the retry a second on."""
    engine = scheduled()
    store = store_of(engine)
    real = store.fire_ticks
    failures = [StorageError("cannot fire the schedule 'every' (the disk is full)")]

    def failing_once(*args: Any) -> Any:
        if failures:
            raise failures.pop()
        return real(*args)

    store.fire_ticks = failing_once  # type: ignore[method-assign]
    with freeze_time(at(1, 9, 59)) as clock, engine, caplog.at_level(logging.ERROR, "memable"):
        clock.move_to(at(1, 10))
        engine.fire_due_timers()
        [failed] = [r for r in caplog.records if "firing failed" in r.getMessage()]
        assert "schedule 'every'" in failed.getMessage()
        assert ticks_of(engine) == []
        move(clock, engine, at(1, 10) + timedelta(seconds=1))
        assert ticks_of(engine) == [tick(1, 10)]


# ---------------------------------------------------------------------- two looks at once


class _WatchedLock:
    """Stands for the scheduler's lock: tells ``seen`` when a second thread waits on it."""

    def __init__(self, seen: threading.Condition, waiting: list[bool]) -> None:
        self._lock = threading.Lock()
        self._seen = seen
        self._waiting = waiting

    def __enter__(self) -> None:
        if not self._lock.acquire(blocking=False):
            with self._seen:
                self._waiting[0] = True
                self._seen.notify_all()
            self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


def test_a_look_from_fire_due_timers_waits_for_the_timer_threads_look() -> None:
    """Two looks at once (the caller's and the timer thread's) take turns: the second
    waits for the first to leave the store's firing, never runs beside it.

    The looks run on threads of the test's own, which freezegun would give real
    time: the engine is given a clock instead."""
    now = [at(1, 9, 59).timestamp()]
    store = SQLiteStore(None, "full")
    engine = Engine(store, Options(poll_interval=60, lease=600, clock=Clock(wall=lambda: now[0])))
    engine.register("job", job)
    engine.schedule("every", "0 * * * *", "job")
    seen = threading.Condition()  # notified as a look enters the firing or waits its turn
    in_firing, waiting = [0], [False]
    release = threading.Event()
    real = store.fire_ticks

    def held(*args: Any) -> Any:
        with seen:
            in_firing[0] += 1
            seen.notify_all()
        release.wait(TIMEOUT)
        try:
            return real(*args)
        finally:
            with seen:
                in_firing[0] -= 1

    store.fire_ticks = held  # type: ignore[method-assign]
    engine._schedules._lock = _WatchedLock(seen, waiting)  # type: ignore[assignment]
    with engine:
        now[0] = at(1, 10).timestamp()
        looks = [threading.Thread(target=engine.fire_due_timers, name=f"test-look-{n}")
                 for n in range(2)]
        looks[0].start()
        with seen:
            assert seen.wait_for(lambda: in_firing[0] == 1, TIMEOUT)
        looks[1].start()
        with seen:  # the second look either waits its turn, or fires beside the first
            assert seen.wait_for(lambda: waiting[0] or in_firing[0] > 1, TIMEOUT)
            assert in_firing[0] == 1
        release.set()
        for look in looks:
            look.join(TIMEOUT)
        assert ticks_of(engine) == [tick(1, 10)]


def test_advance_counts_a_tick_whichever_thread_fired_it(scheduled: Callable[..., Engine]) -> None:
    """The engine's own firing stands in for the timer thread winning: it fires the tick
    and reports nothing; ``advance`` still counts the tick that ran."""
    engine = scheduled()
    real = engine.fire_due_timers

    def timer_thread_won() -> int:
        real()
        return 0

    engine.fire_due_timers = timer_thread_won  # type: ignore[method-assign]
    with freeze_time(at(1, 9, 30)) as clock, engine:
        assert advance(engine, clock, timedelta(minutes=30)) == 1  # 10:00
        assert advance(engine, clock, timedelta(minutes=30)) == 0  # 10:30
        assert advance(engine, clock, timedelta(minutes=30)) == 1  # 11:00
        assert ticks_of(engine) == [tick(1, 10), tick(1, 11)]


def test_schedules_hold_no_thread_of_their_own() -> None:
    """Twenty schedules: the same threads as none (ticks are the timer thread's deadlines)."""
    names: dict[int, list[str]] = {}
    for count in (0, 20):
        engine = Engine.in_memory(poll_interval=60)
        engine.register("job", job)
        for n in range(count):
            engine.schedule(f"s{n}", "* * * * *", "job")
        before = set(threading.enumerate())
        with engine:
            names[count] = sorted(t.name for t in set(threading.enumerate()) - before)
    assert names[20] == names[0] == ["memable-timers"]
