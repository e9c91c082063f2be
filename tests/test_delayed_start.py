"""Operations (issue 26, point 7): a delayed start, ``invoke(..., start_at=)``: stored at
once, Suspended("starts at ...") holding no thread, started when its durable timer is
due (onto its queue if it has one), by whichever engine fires it, across restarts."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from conftest import POSTGRES_URL
from freezegun import freeze_time
from helpers import Looks, build, query

from memable import Context, Engine, InstanceFinished, MetadataStatus
from memable._engine import access
from memable.testing import advance

TIMEOUT = 10
#: The instances that ran (a delayed one must not run before its time).
RAN: list[str] = []


def job(ctx: Context, n: int) -> int:
    RAN.append(ctx.instance_id)
    return ctx.step("double:v1").run(lambda: n * 2)


@pytest.fixture
def engine(make_engine: Callable[..., Engine]) -> Iterator[Engine]:
    RAN.clear()
    engine = make_engine(poll_interval=0.05)
    engine.register("job", job)
    engine.queue("later", concurrency=1)
    engine.register("queued_job", job, queue="later")
    with engine:
        yield engine


def _status(engine: Engine, workflow: str, instance_id: str) -> MetadataStatus:
    meta = engine.get_metadata(workflow, instance_id)
    assert meta is not None
    return meta.status


def test_a_delayed_instance_waits_holding_no_thread_and_starts_when_due(
    engine: Engine,
) -> None:
    """``start_at=timedelta(hours=1)`` stores the instance at once as suspended "starts at
    ..." with no run in flight; its timer fires nothing a minute early and starts it exactly
    when due."""
    with freeze_time("2026-12-05 10:00:00") as clock:
        inv = engine.invoke("job", 21, instance_id="j", start_at=timedelta(hours=1))
        status = _status(engine, "job", "j")
        assert isinstance(status, MetadataStatus.Suspended)
        assert status.message is not None
        assert status.message.startswith("starts at 2026-12-05T11:00:00")
        assert str(inv.wait(TIMEOUT)).startswith("suspended: starts at 2026-12-05T11:00")
        assert RAN == []
        assert access.in_flight(engine) == []  # no run, no thread held
        assert advance(engine, clock, timedelta(minutes=59)) == 0
        assert advance(engine, clock, timedelta(minutes=1)) == 1
        assert inv.result(TIMEOUT) == 42
    assert RAN == ["j"]


def test_an_aware_datetime_is_a_start_time(engine: Engine) -> None:
    """An aware ``datetime`` in another zone is taken as an instant, shown in UTC in the
    status, and the instance starts when the clock reaches it."""
    at = datetime(2026, 12, 5, 12, 30, tzinfo=timezone(timedelta(hours=2)))
    with freeze_time("2026-12-05 10:00:00") as clock:
        inv = engine.invoke("job", 1, instance_id="j", start_at=at)
        status = _status(engine, "job", "j")
        assert status.message == "starts at 2026-12-05T10:30:00+00:00"
        advance(engine, clock, timedelta(minutes=30))
        assert inv.result(TIMEOUT) == 2


def test_a_delayed_instance_of_a_queue_goes_onto_it_when_due(engine: Engine) -> None:
    """A delayed instance of a queued workflow waits suspended, then goes onto its queue and
    runs once its start time is due."""
    with freeze_time("2026-12-05 10:00:00") as clock:
        inv = engine.invoke("queued_job", 5, instance_id="q", start_at=60)
        assert isinstance(_status(engine, "queued_job", "q"), MetadataStatus.Suspended)
        advance(engine, clock, 60)
        assert inv.result(TIMEOUT) == 10


def test_invoking_the_same_id_again_changes_nothing(engine: Engine) -> None:
    """Invoking a delayed instance's id again with another input and an earlier start
    changes nothing: it starts at the first start time with the first input."""
    with freeze_time("2026-12-05 10:00:00") as clock:
        engine.invoke("job", 1, instance_id="j", start_at=60)
        again = engine.invoke("job", 2, instance_id="j", start_at=10)
        assert _status(engine, "job", "j").message == "starts at 2026-12-05T10:01:00+00:00"
        assert advance(engine, clock, 10) == 0
        assert advance(engine, clock, 50) == 1
        assert again.result(TIMEOUT) == 2 * 1  # the stored input stands


def test_a_cancelled_delayed_instance_never_starts(engine: Engine) -> None:
    """A delayed instance cancelled before its start time never runs when the time passes,
    stays cancelled, and refuses signals with ``InstanceFinished``."""
    with freeze_time("2026-12-05 10:00:00") as clock:
        engine.invoke("job", 1, instance_id="j", start_at=60)
        engine.cancel("job", "j")
        assert advance(engine, clock, 120) == 0
    assert isinstance(_status(engine, "job", "j"), MetadataStatus.Cancelled)
    assert RAN == []
    with pytest.raises(InstanceFinished):
        engine.signal("job", "j", "anything", 1)


@pytest.mark.parametrize(("start_at", "error", "says"), [
    (datetime(2026, 12, 5, 12, 0), ValueError, "aware datetime"),
    (-1, ValueError, "start_at"),
    (float("nan"), ValueError, "start_at"),
    ("in an hour", TypeError, "start_at"),
    (timedelta(days=3_000_000), ValueError, "past the year 9999"),
])
def test_a_bad_start_at_is_refused_storing_nothing(
    engine: Engine, start_at: Any, error: type[Exception], says: str
) -> None:
    """A naive datetime, a negative, NaN or string delay, or one past the year 9999 is
    refused by ``invoke`` with a ``ValueError`` or ``TypeError`` and no instance is
    stored."""
    with pytest.raises(error, match=says):
        engine.invoke("job", 1, instance_id="j", start_at=start_at)
    assert engine.get_metadata("job", "j") is None


def test_a_delayed_start_survives_the_engine_that_stored_it(
    open_shared: Callable[..., Engine],
) -> None:
    """The engine that invoked stops before the start is due; another engine on the store,
    started later, starts it (its timer is stored)."""
    RAN.clear()
    first = open_shared(poll_interval=0.05)
    first.register("job", job)
    with first:
        first.invoke("job", 4, instance_id="j", start_at=0.2)
    second = open_shared(poll_interval=0.05)
    second.register("job", job)
    with second:
        assert second.invocation("job", "j").result(TIMEOUT) == 8
    assert RAN == ["j"]


def waits_for_go(ctx: Context) -> object:
    RAN.append(ctx.instance_id)
    return ctx.suspend("go")


def _signalled_early(worker: Engine, signaller: Engine) -> None:
    """``start_at`` in 5 s; a signal 0.5 s later (its wake-up's claim returns before
    anything is looked at); the start waits for its time, and the run then finds the
    signal stored."""
    claims = Looks(worker, "begin_run")
    with freeze_time("2026-12-05 10:00:00") as clock:
        inv = worker.invoke("waits", instance_id="d", start_at=5)
        clock.tick(0.5)
        seen = claims.count
        signaller.signal("waits", "d", "go", "early")
        claims.past(seen)  # the wake-up the signal sent was claimed, or refused
        status = _status(worker, "waits", "d")
        assert isinstance(status, MetadataStatus.Suspended), status
        assert status.message == "starts at 2026-12-05T10:00:05+00:00"
        assert RAN == []
        start = [row for row in _steps(worker, "d") if row[0] == "_start"]
        assert start == [("_start", "waiting")]
        assert advance(worker, clock, 4) == 0
        assert RAN == []
        assert advance(worker, clock, 0.5) == 1
        assert inv.result(TIMEOUT) == "early"
    assert RAN == ["d"]


def _steps(engine: Engine, instance_id: str) -> list[tuple[Any, ...]]:
    return query(engine, "SELECT key, state FROM memable_steps WHERE instance_id = ? ORDER BY seq",
                 (instance_id,))


def test_a_signal_to_an_instance_waiting_for_its_start_does_not_start_it(
    make_engine: Callable[..., Engine],
) -> None:
    """A signal to an instance whose delayed start is not due yet is stored, and wakes
    nothing: the instance starts at ``start_at``, not at the signal (the signal's
    wake-up claimed any suspended instance, so the run began 4.5 s early)."""
    RAN.clear()
    engine = make_engine(poll_interval=0.05)
    engine.register("waits", waits_for_go)
    with engine:
        _signalled_early(engine, engine)


def test_a_signal_from_another_engine_does_not_start_a_delayed_instance(
    pg_schema: str,
) -> None:
    """PostgreSQL: the signal comes from another engine; its NOTIFY wakes the worker, whose
    claim must leave an instance waiting for its start alone."""
    RAN.clear()
    worker = build(POSTGRES_URL, schema=pg_schema, poll_interval=0.05).engine
    worker.register("waits", waits_for_go)
    client = Engine.open(POSTGRES_URL, schema=pg_schema)  # runs nothing: registers nothing
    with worker, client:
        _signalled_early(worker, client)
