"""Timers: a key's deadline, armed once, and fired by exactly one engine when due.

A row of ``timers`` is the deadline of a timer, a suspend point's timeout, or a step's retry
backoff. Deleting the row claims it: exactly one engine fires each timer, and a signal that
drops a suspend point's deadline first leaves none to fire."""

from __future__ import annotations

from collections.abc import Callable

from ..._clock import iso_utc
from ..transaction import Transaction
from .instances import NEXT_TIMEOUT, due_after_read

# Firing a key: a timer completes; a suspend point times out unless a signal completed it;
# a retry backoff only ends (the run makes the next attempt). ``{at}``: the time parameter.
FIRE_KEY = """state = CASE kind WHEN 'timer' THEN 'completed' ELSE 'timed_out' END,
    result = CASE kind WHEN 'timer' THEN 'null' END, result_type = NULL,
    attempts = CASE kind WHEN 'timer' THEN attempts + 1 ELSE attempts END,
    completed_at = CASE kind WHEN 'timer' THEN {at} END"""
FIRE_KEY_WHERE = "state NOT IN ('completed', 'timed_out') AND kind IN ('timer', 'signal')"

_KEY = "workflow = :workflow AND instance_id = :instance_id AND key = :key"
ARMED = f"SELECT deadline FROM memable_timers WHERE {_KEY}"
ARM = (
    "INSERT INTO memable_timers (workflow, instance_id, key, deadline) "
    "VALUES (:workflow, :instance_id, :key, :deadline)"
)
DROP = f"DELETE FROM memable_timers WHERE {_KEY}"
_DROP_DUE = DROP + " AND deadline <= :now"
_FIRE = f"UPDATE memable_steps SET {FIRE_KEY.format(at=':at')} WHERE {_KEY} AND {FIRE_KEY_WHERE}"
DUE_TIMERS = (
    "SELECT workflow, instance_id, key, deadline FROM memable_timers WHERE deadline <= :now "
    "ORDER BY deadline LIMIT 500"
)
# PostgreSQL: claims and fires those of the rows ``DUE_TIMERS`` read (the arrays) still due,
# skipping rows another transaction holds.
FIRE_DUE = f"""
WITH due AS (
    DELETE FROM memable_timers WHERE (workflow, instance_id, key) IN (
        SELECT workflow, instance_id, key FROM memable_timers WHERE deadline <= :now
        AND (workflow, instance_id, key) IN (
            SELECT * FROM unnest(:workflows::text[], :ids::text[], :keys::text[]))
        ORDER BY deadline LIMIT 500{{skip_locked}})
    RETURNING workflow, instance_id, key, deadline),
fired AS (
    UPDATE memable_steps SET {FIRE_KEY.format(at=":at")}
    FROM due WHERE memable_steps.workflow = due.workflow
    AND memable_steps.instance_id = due.instance_id
    AND memable_steps.key = due.key AND {FIRE_KEY_WHERE})
SELECT workflow, instance_id, key, deadline FROM due
"""
_NEXT_DEADLINE = f"SELECT (SELECT MIN(deadline) FROM memable_timers), ({NEXT_TIMEOUT})"


def arm(tx: Transaction, workflow: str, instance_id: str, key: str, deadline: float) -> None:
    """Arm the key's deadline, and tell the engines' timer threads."""
    tx.write(ARM, {"workflow": workflow, "instance_id": instance_id, "key": key,
                   "deadline": deadline})
    tx.notify("timer", workflow, instance_id)


def fire_key(
    tx: Transaction, workflow: str, instance_id: str, key: str, at: float,
    due_by: float | None = None,
) -> bool:
    """Claim the key's timer row (waiting for a holder; only if due by ``due_by``, if given)
    and fire its key at ``at`` (epoch seconds, UTC); whether it did."""
    where = {"workflow": workflow, "instance_id": instance_id, "key": key}
    if due_by is None:
        claimed = tx.execute(DROP, where).rowcount
    else:  # not a deadline armed again since it was read (a later retry backoff)
        claimed = tx.execute(_DROP_DUE, {**where, "now": due_by}).rowcount
    if not claimed:
        return False
    tx.write(_FIRE, {**where, "at": iso_utc(at)})
    return True


def due(tx: Transaction, clock: Callable[[], float]) -> list[tuple[str, str, str, float]]:
    """At most 500 due timers, earliest first: a read, which answers most looks without a
    write. Judged due by a ``clock`` reading taken after the read (``due_after_read``)."""
    return due_after_read(tx.execute(DUE_TIMERS, {"now": clock()}).fetchall(), clock)


def fire(
    tx: Transaction, due: list[tuple[str, str, str, float]], at: float
) -> list[tuple[str, str, str, float]]:
    """Claim the timers ``due`` read and fire each at ``at`` (epoch seconds, UTC); those this
    transaction claimed. PostgreSQL claims them in one statement passing over held rows;
    SQLite serialises writers, so it deletes them one by one."""
    if not due:
        return []
    if tx.dialect.row_locks:
        rows = tx.execute(FIRE_DUE, {"now": max(row[3] for row in due), "at": iso_utc(at),
            "workflows": [row[0] for row in due], "ids": [row[1] for row in due],
            "keys": [row[2] for row in due]}).fetchall()
        return [(w, i, k, float(d)) for w, i, k, d in rows]
    return [row for row in due if fire_key(tx, *row[:3], at, due_by=row[3])]


def next_deadline(tx: Transaction) -> float | None:
    """The earliest armed timer deadline or workflow timeout, or None."""
    deadlines = [float(d) for d in (tx.execute(_NEXT_DEADLINE).fetchone() or ()) if d is not None]
    return min(deadlines) if deadlines else None
