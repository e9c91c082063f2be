"""The SQL of schedules, written once for both stores (``:name`` parameters, spelled by the
transaction).

A schedule's row holds its declaration (cron, zone, workflow), the newest
tick it accounted for (``last_tick``), when it started counting (``since``)
and how many ticks were skipped or missed. Firing a tick compares and sets
``last_tick`` in the transaction that creates the tick's instance, so of the
engines that fire one tick, one writes it and the others write nothing.
"""

from __future__ import annotations

from ..._clock import iso_utc
from ..rows import ScheduleRow, TickFiring, TicksFired, by_name
from ..transaction import Transaction
from .instances import insert_instance

#: The columns of a ``ScheduleRow``, as ``SELECT`` and ``SELECT_ALL`` read them.
SCHEDULE_COLUMNS = (
    "name", "cron", "timezone", "workflow", "last_tick", "since", "skipped", "missed",
)
COLUMNS = ", ".join(SCHEDULE_COLUMNS)
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


def declare(tx: Transaction, schedules: list[ScheduleRow], at: float) -> list[ScheduleRow]:
    """Store this engine's schedule declarations, atomically; return the stored rows, in
    order.

    A schedule new to the store counts its ticks from ``at`` (epoch seconds, UTC; stored
    as ``since``); one
    whose stored cron or zone differs takes the declaration's and counts from
    ``at`` too (no catch-up across a change); its workflow is the declaration's.
    """
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
    """Record ``firing`` of schedule ``name`` planned from its last tick ``last``,
    atomically.

    Only while the stored last tick is still ``last``: else another engine fired
    these ticks, and nothing is written (``won`` False). Else the last tick
    becomes ``firing.last_tick``, its missed ticks are counted, and each of
    ``firing.rows`` is created (running here, this engine's, or queued), unless
    ``firing.skip_overlap`` and an earlier tick's instance of the schedule has
    not ended (then it is counted skipped), or its id is there already. A created
    queued instance tells the queue's consumers.
    """
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
