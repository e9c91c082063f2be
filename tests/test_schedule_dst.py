"""Daylight saving: the ticks an engine fires across spring-forward and fall-back are, tick
by tick, the ones cronsim's own iteration gives for the same expression and zone.

The engine's clock is frozen; it is moved to one second before each expected tick
(nothing may fire) and then to the tick (exactly that tick's instance appears).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from cronsim import CronSim
from freezegun import freeze_time

from memable import Context, Engine

#: The days the clocks change in 2026: spring forward, fall back.
CHANGES = {
    "Europe/Paris": [datetime(2026, 3, 29), datetime(2026, 10, 25)],
    "America/New_York": [datetime(2026, 3, 8), datetime(2026, 11, 1)],
}
CASES = [
    (cron, zone, day)
    for cron in ("0 2 * * *", "30 1 * * *", "0 * * * *")
    for zone, days in CHANGES.items()
    for day in days
]


def cronsims_ticks(cron: str, zone: str, start: datetime, end: datetime) -> Iterator[datetime]:
    """cronsim's own ticks in (start, end], in UTC."""
    for tick in CronSim(cron, start.astimezone(ZoneInfo(zone))):
        if tick > end:
            return
        yield tick.astimezone(timezone.utc)


@pytest.mark.parametrize(("cron", "zone", "day"), CASES,
                         ids=[f"{c}-{z}-{d:%m-%d}" for c, z, d in CASES])
def test_the_ticks_across_a_clock_change_are_cronsims(cron: str, zone: str, day: datetime) -> None:
    """Across each spring-forward and fall-back day in Paris and New York, the engine fires
    exactly cronsim's ticks for the same cron and zone: nothing a second before a tick, that
    tick's instance at it, and nothing after the last."""
    local = ZoneInfo(zone)
    start = day.replace(tzinfo=local) - timedelta(days=1)
    end = day.replace(tzinfo=local) + timedelta(days=2)
    expected = list(cronsims_ticks(cron, zone, start, end))
    # The changes happen inside the window, so each case has ticks on both sides of one.
    assert len({t.astimezone(local).utcoffset() for t in expected}) == 2

    def job(ctx: Context) -> None:
        return None

    engine = Engine.in_memory(poll_interval=60)
    engine.register("job", job)
    engine.schedule("dst", cron, "job", timezone=zone, catch_up="none")
    fired: list[str] = []
    with freeze_time(start) as clock, engine:
        for tick in expected:
            clock.move_to(tick - timedelta(seconds=1))
            engine.fire_due_timers()
            assert _ids(engine) == fired, f"something fired before {tick}"
            clock.move_to(tick)
            engine.fire_due_timers()
            fired.append(f"dst@{tick:%Y-%m-%dT%H:%M:%SZ}")
            assert _ids(engine) == fired
        clock.move_to(end)
        engine.fire_due_timers()
        assert _ids(engine) == fired
        for instance_id in fired:
            engine.invocation("job", instance_id).wait(10)


def _ids(engine: Engine) -> list[str]:
    return sorted(instance_id for instance_id, _ in engine.list_instances("job"))
