"""The engine's clock: every time an engine stores is read from its ``Clock``
(``Options.clock``), and stored in UTC.

A test hands the engine a wall clock fixed years away from the real time, with
no freezegun: a time read from anywhere else (the system's clock) shows up as a
date near today's. PostgreSQL still judges leases by its server's clock (by
design): nothing here reads a lease.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from helpers import PATIENCE, build, store_of

from memable import Context, Engine
from memable._clock import Clock

#: The test's "now": far from the real time, and not a round hour of today's date.
FIXED = datetime(2041, 3, 5, 12, 34, 56, 789000, tzinfo=timezone.utc)


def _times(engine: Engine, sql: str) -> list[dict[str, Any]]:
    return store_of(engine).read_rows("read stored times (test)", sql, {})  # type: ignore[attr-defined,no-any-return]


def _engine(store_target: dict[str, Any], clock: Clock) -> Engine:
    """An engine on the parametrised store, reading ``clock``; no poll nor heartbeat soon."""
    return build(**store_target, poll_interval=60, lease=600, clock=clock).engine


@pytest.fixture
def clocked(store_target: dict[str, Any]) -> Iterator[tuple[Engine, list[float]]]:
    """An engine whose wall clock reads ``now[0]`` (at first ``FIXED``), and ``now``."""
    now = [FIXED.timestamp()]
    engine = _engine(store_target, Clock(wall=lambda: now[0]))
    try:
        yield engine, now
    finally:
        engine.close()


def one_step(ctx: Context, moment: Any = None) -> int:
    return int(ctx.step("a").run(lambda: 1))


def waits(ctx: Context) -> Any:
    return ctx.suspend("go:v1")


def test_what_an_engine_stores_is_dated_by_its_clock(
    clocked: tuple[Engine, list[float]],
) -> None:
    """Instance times (created, updated, completed, queued), step times, a signal's time, a
    queue's pause, the owner row's start, a schedule tick's instance and a purge's cutoff
    all come from the engine's clock, not the system's: each is the fixed time given."""
    engine, now = clocked
    engine.register("one", one_step)
    engine.register("waits", waits)
    engine.queue("q")
    engine.schedule("hourly", "0 * * * *", "one")
    fixed = FIXED.isoformat()
    with engine:
        assert engine.invoke("one", instance_id="o").result(timeout=PATIENCE) == 1
        engine.invoke("waits", instance_id="w").wait(timeout=PATIENCE)
        assert engine.signal("waits", "w", "go:v1", "yes").result(timeout=PATIENCE) == "yes"
        engine.pause_queue("q")
        engine.invoke("one", instance_id="queued", queue="q")

        [owner] = _times(engine, "SELECT started_at FROM memable_owners")
        assert owner["started_at"] == fixed
        rows = {r["instance_id"]: r for r in _times(
            engine, "SELECT instance_id, created_at, updated_at, completed_at, queued_at "
                    "FROM memable_instances")}
        for instance_id in ("o", "w"):
            times = rows[instance_id]
            assert (times["created_at"], times["updated_at"], times["completed_at"]) == (
                fixed, fixed, fixed), instance_id
        assert (rows["queued"]["created_at"], rows["queued"]["queued_at"]) == (fixed, fixed)
        steps = _times(engine, "SELECT instance_id, key, started_at, completed_at "
                               "FROM memable_steps ORDER BY instance_id, key")
        assert {(s["instance_id"], s["key"]): (s["started_at"], s["completed_at"])
                for s in steps} == {("o", "a"): (fixed, fixed), ("w", "go:v1"): (None, fixed)}
        [paused] = _times(engine, "SELECT paused_at FROM memable_queue_states")
        assert paused["paused_at"] == fixed

        # The next hour's tick: its instance is dated by the clock too.
        next_hour = FIXED.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
        now[0] = next_hour.timestamp()
        engine.fire_due_timers()
        tick_id = f"hourly@{next_hour:%Y-%m-%dT%H:%M:%SZ}"
        assert engine.invocation("one", tick_id).result(timeout=PATIENCE) == 1
        meta = engine.get_metadata("one", tick_id)
        assert meta is not None
        assert (meta.created_at, meta.completed_at) == (next_hour, next_hour)

        # A purge's cutoff is the clock's now less the age: "o" (finished at FIXED) is
        # older than 20 minutes at the tick's time, the tick's own instance is not.
        assert engine.purge(older_than=timedelta(minutes=20)) == 2  # "o" and "w"
        assert sorted(i for i, _ in engine.list_instances("one")) == [tick_id, "queued"]


@pytest.mark.parametrize("store_target", ["file", "postgres"], indirect=True)
def test_an_owner_row_records_its_start_in_utc(store_target: dict[str, Any]) -> None:
    """The owner row's ``started_at`` is ISO text in UTC (``+00:00``), like every stored
    time, not the host's local time: read under a zone far from UTC."""
    import os
    import time

    zone = os.environ.get("TZ")
    os.environ["TZ"] = "Asia/Kathmandu"  # +05:45: no host's zone is UTC by accident here
    time.tzset()
    try:
        engine = build(**store_target, poll_interval=60).engine
        try:
            with engine:
                [owner] = _times(engine, "SELECT started_at FROM memable_owners")
        finally:
            engine.close()
    finally:
        if zone is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = zone
        time.tzset()
    started = datetime.fromisoformat(owner["started_at"])
    assert started.utcoffset() == timedelta(0), owner["started_at"]
    assert abs(started.timestamp() - time.time()) < 600
