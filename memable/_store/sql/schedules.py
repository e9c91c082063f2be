"""The SQL of schedules, shared by both stores (``:name`` parameters; see ``execute.pg``).

A schedule's row holds its declaration (cron, zone, workflow), the newest
tick it accounted for (``last_tick``), when it started counting (``since``)
and how many ticks were skipped or missed. Firing a tick compares and sets
``last_tick`` in the transaction that creates the tick's instance, so of the
engines that fire one tick, one writes it and the others write nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from ..rows import InstanceRow, ScheduleRow, TickFiring, TicksFired
from .execute import Execute

COLUMNS = "name, cron, timezone, workflow, last_tick, since, skipped, missed"
SELECT = f"SELECT {COLUMNS} FROM schedules WHERE name = :name"
SELECT_ALL = f"SELECT {COLUMNS} FROM schedules ORDER BY name"
#: A schedule seen for the first time counts its ticks from now.
INSERT = """
INSERT INTO schedules (name, cron, timezone, workflow, last_tick, since, skipped, missed)
VALUES (:name, :cron, :timezone, :workflow, NULL, :at, 0, 0)
ON CONFLICT (name) DO NOTHING
"""
#: A declaration whose cron or zone differs from the stored one wins, and starts from
#: now: no catch-up across a change.
RESTART = """
UPDATE schedules SET cron = :cron, timezone = :timezone, workflow = :workflow, since = :at
WHERE name = :name AND (cron <> :cron OR timezone <> :timezone)
"""
WORKFLOW = "UPDATE schedules SET workflow = :workflow WHERE name = :name"
#: Compare and set: only while the newest tick is still the one the firing planned from.
ADVANCE = """
UPDATE schedules SET last_tick = :tick, missed = missed + :missed, skipped = skipped + :skipped
WHERE name = :name AND COALESCE(last_tick, '') = COALESCE(:last, '')
"""
DECLARED = "SELECT cron, timezone FROM schedules WHERE name = :name"
#: An earlier tick's instance of the schedule that has not ended.
RUNNING = """
SELECT 1 FROM instances WHERE schedule = :name
AND status NOT IN ('completed', 'failed', 'cancelled') LIMIT 1
"""


def declare(execute: Execute, schedules: list[ScheduleRow], at: str) -> list[ScheduleRow]:
    """Store each declaration (a new one from ``at``; a changed cron or zone restarts from
    ``at``); return the stored rows, in order."""
    stored = []
    for row in schedules:
        params = {"name": row.name, "cron": row.cron, "timezone": row.timezone,
                  "workflow": row.workflow, "at": at}
        execute(INSERT, params)
        execute(RESTART, params)
        execute(WORKFLOW, params)
        stored.append(ScheduleRow(*execute(SELECT, params).fetchone()))
    return stored


def fire(
    execute: Execute, name: str, last: str | None, firing: TickFiring,
    insert: Callable[[InstanceRow], bool],
) -> TicksFired:
    """Record ``firing`` of ``name`` planned from ``last``: its instances (``insert``
    creates one; False if its id is there already) and the new last tick."""
    claimed = execute(ADVANCE, {"name": name, "tick": firing.last_tick, "missed": firing.missed,
                                "skipped": 0, "last": last})
    if claimed.rowcount != 1:
        return TicksFired(won=False)
    created, skipped = [], 0
    for row in firing.rows:
        if firing.skip_overlap and execute(RUNNING, {"name": name}).fetchone() is not None:
            skipped += 1
        elif insert(row):
            created.append(row.instance_id)
    if skipped:
        execute(ADVANCE, {"name": name, "tick": firing.last_tick, "missed": 0,
                          "skipped": skipped, "last": firing.last_tick})
    cron, zone = execute(DECLARED, {"name": name}).fetchone()
    return TicksFired(won=True, created=created, skipped=skipped, declared=(cron, zone))
