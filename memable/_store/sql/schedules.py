"""The SQL of schedules, written once for both stores (``:name`` parameters)."""

from __future__ import annotations

from ..._clock import iso_utc
from ..rows import ScheduleRow, TickFiring, TicksFired, by_name
from ..transaction import Transaction
from .instances import insert_instance

#: The columns of a ``ScheduleRow``, as ``SELECT`` and ``SELECT_ALL`` read them.
SCHEDULE_COLUMNS = ("name", "cron", "timezone", "workflow", "last_tick", "since", "skipped",
                    "missed")
COLUMNS = ", ".join(SCHEDULE_COLUMNS)
SELECT = f"SELECT {COLUMNS} FROM memable_schedules WHERE name = :name"
SELECT_ALL = f"SELECT {COLUMNS} FROM memable_schedules ORDER BY name"
#: A schedule seen for the first time counts its ticks from now.
INSERT = """
INSERT INTO memable_schedules (name, cron, timezone, workflow, last_tick, since, skipped, missed)
VALUES (:name, :cron, :timezone, :workflow, NULL, :at, 0, 0)
ON CONFLICT (name) DO NOTHING
"""
#: A declaration whose cron or zone differs wins, from now: no catch-up across a change.
RESTART = """
UPDATE memable_schedules SET cron = :cron, timezone = :timezone, workflow = :workflow, since = :at
WHERE name = :name AND (cron <> :cron OR timezone <> :timezone)
"""
WORKFLOW = "UPDATE memable_schedules SET workflow = :workflow WHERE name = :name"
#: Compare and set, in the transaction creating the tick's instance: of the engines firing
#: one tick, one writes it (while the newest tick is still the one it planned from).
ADVANCE = """
UPDATE memable_schedules
SET last_tick = :tick, missed = missed + :missed, skipped = skipped + :skipped
WHERE name = :name AND COALESCE(last_tick, '') = COALESCE(:last, '')
"""
DECLARED = "SELECT cron, timezone FROM memable_schedules WHERE name = :name"
#: An earlier tick's instance of the schedule that has not ended.
RUNNING = """
SELECT 1 FROM memable_instances WHERE schedule = :name
AND status NOT IN ('completed', 'failed', 'cancelled') LIMIT 1
"""


def declare(tx: Transaction, schedules: list[ScheduleRow], at: float) -> list[ScheduleRow]:
    """Store this engine's schedule declarations, atomically; the stored rows, in order. A
    new schedule, or one whose cron or zone changed, counts ticks from ``at`` (epoch s)."""
    stored = []
    for row in schedules:
        params = {"name": row.name, "cron": row.cron, "timezone": row.timezone,
                  "workflow": row.workflow, "at": iso_utc(at)}
        tx.execute(INSERT, params)
        tx.execute(RESTART, params)
        tx.execute(WORKFLOW, params)
        found = tx.execute(SELECT, params).fetchone()
        stored.append(by_name(ScheduleRow, SCHEDULE_COLUMNS, found))
    return stored


def fire(tx: Transaction, name: str, last: str | None, firing: TickFiring) -> TicksFired:
    """Record ``firing`` of schedule ``name`` planned from its last tick ``last``, atomically,
    if that is still stored (else ``won`` False, nothing written). A row is skipped (and
    counted) under ``skip_overlap`` while an earlier tick's instance has not ended."""
    claimed = tx.execute(ADVANCE, {"name": name, "tick": firing.last_tick,
                                   "missed": firing.missed, "skipped": 0, "last": last})
    if claimed.rowcount != 1:
        return TicksFired(won=False)
    created, skipped = [], 0
    for row in firing.rows:
        if firing.skip_overlap and tx.execute(RUNNING, {"name": name}).fetchone() is not None:
            skipped += 1
        elif insert_instance(tx, row):
            created.append(row.instance_id)
            if row.status != "running":  # it waits for a slot: tell the queue's consumers
                tx.notify("queued", row.workflow, row.instance_id)
    if skipped:
        tx.execute(ADVANCE, {"name": name, "tick": firing.last_tick, "missed": 0,
                             "skipped": skipped, "last": firing.last_tick})
    cron, zone = tx.execute(DECLARED, {"name": name}).fetchone()
    return TicksFired(won=True, created=created, skipped=skipped, declared=(cron, zone))
