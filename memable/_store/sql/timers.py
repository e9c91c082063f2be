"""Timers: a key's deadline, armed once, and fired by exactly one engine when due.

A row of ``timers`` is a deadline armed for one key of an instance: a
timer's, a suspend point's (its timeout), or a step's retry backoff.
Deleting the row claims it: of several engines (or processes), exactly one
fires each timer, and a signal that drops a suspend point's deadline first
leaves none to fire. Firing completes a timer's key, times out a suspend
point that holds no signal yet, and only ends a retry backoff (its step is
left for the run's next attempt).
"""

from __future__ import annotations

from collections.abc import Callable

from ..._clock import iso_utc
from ..transaction import Transaction
from .instances import NEXT_TIMEOUT, due_after_read

# What firing a due timer row does to its key: a timer completes; a suspend
# point's deadline times it out, unless a signal completed it first; a step's
# retry backoff only ends (the run makes the next attempt). ``{at}`` is the
# parameter holding the time.
FIRE_KEY = """state = CASE kind WHEN 'timer' THEN 'completed' ELSE 'timed_out' END,
    result = CASE kind WHEN 'timer' THEN 'null' END, result_type = NULL,
    attempts = CASE kind WHEN 'timer' THEN attempts + 1 ELSE attempts END,
    completed_at = CASE kind WHEN 'timer' THEN {at} END"""
FIRE_KEY_WHERE = "state NOT IN ('completed', 'timed_out') AND kind IN ('timer', 'signal')"

_KEY = "workflow = :workflow AND instance_id = :instance_id AND key = :key"
#: The deadline armed for a key, if any.
ARMED = f"SELECT deadline FROM timers WHERE {_KEY}"
#: Arms a key's deadline.
ARM = (
    "INSERT INTO timers (workflow, instance_id, key, deadline) "
    "VALUES (:workflow, :instance_id, :key, :deadline)"
)
#: Drops (or claims) a key's deadline.
DROP = f"DELETE FROM timers WHERE {_KEY}"
#: Claims a key's deadline if it is due by ``:now``.
_DROP_DUE = DROP + " AND deadline <= :now"
#: What firing does to the key whose timer row was claimed.
_FIRE = f"UPDATE steps SET {FIRE_KEY.format(at=':at')} WHERE {_KEY} AND {FIRE_KEY_WHERE}"
#: The timers due by ``:now``, the ones a call fires at most (``fire`` claims them).
DUE_TIMERS = (
    "SELECT workflow, instance_id, key, deadline FROM timers WHERE deadline <= :now "
    "ORDER BY deadline LIMIT 500"
)
# Claims the due timers of those ``DUE_TIMERS`` read (the arrays ``workflows``, ``ids``,
# ``keys``; judged by a clock read after it): rows another engine is firing (or a signal
# is dropping) are skipped, not waited for. What it does to each key: ``FIRE_KEY``.
# PostgreSQL: one statement (a data-modifying WITH, which SQLite has not).
FIRE_DUE = f"""
WITH due AS (
    DELETE FROM timers WHERE (workflow, instance_id, key) IN (
        SELECT workflow, instance_id, key FROM timers WHERE deadline <= :now
        AND (workflow, instance_id, key) IN (
            SELECT * FROM unnest(:workflows::text[], :ids::text[], :keys::text[]))
        ORDER BY deadline LIMIT 500{{skip_locked}})
    RETURNING workflow, instance_id, key, deadline),
fired AS (
    UPDATE steps SET {FIRE_KEY.format(at=":at")}
    FROM due WHERE steps.workflow = due.workflow AND steps.instance_id = due.instance_id
    AND steps.key = due.key AND {FIRE_KEY_WHERE})
SELECT workflow, instance_id, key, deadline FROM due
"""
#: The earliest timer deadline and the earliest workflow timeout still armed.
_NEXT_DEADLINE = f"SELECT (SELECT MIN(deadline) FROM timers), ({NEXT_TIMEOUT})"


def arm(tx: Transaction, workflow: str, instance_id: str, key: str, deadline: float) -> None:
    """Arm the key's deadline, and tell the engines watching the store (their timer
    threads wait for it)."""
    tx.write(ARM, {"workflow": workflow, "instance_id": instance_id, "key": key,
                   "deadline": deadline})
    tx.notify("timer", workflow, instance_id)


def fire_key(
    tx: Transaction, workflow: str, instance_id: str, key: str, at: float,
    due_by: float | None = None,
) -> bool:
    """Claim the key's timer row (waiting for a transaction that holds it; only if its
    deadline is ``due_by`` at the latest, when given) and, if this claimed it, fire its
    key (``FIRE_KEY``, at ``at``: epoch seconds, UTC); whether it did."""
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
    """The timers due by the time ``clock`` tells, (workflow, id, key, deadline)s, at most
    500, earliest first: a read, which answers most looks (nothing due) without a write.

    A timer is judged due by a reading of ``clock`` taken after it was read
    (``due_after_read``), never by the one it was chosen by.
    """
    return due_after_read(tx.execute(DUE_TIMERS, {"now": clock()}).fetchall(), clock)


def fire(
    tx: Transaction, due: list[tuple[str, str, str, float]], at: float
) -> list[tuple[str, str, str, float]]:
    """Claim the timers ``due`` read and fire each (``FIRE_KEY``, at ``at``: epoch seconds,
    UTC); return
    those this transaction claimed.

    Deleting a row claims it: of several engines, exactly one fires each
    timer; one another engine fired (or a signal dropped) since the read is
    left out. Where rows are locked (PostgreSQL) they are claimed in one
    statement (``FIRE_DUE``: a data-modifying WITH, which SQLite lacks) that
    passes over rows another transaction holds (another engine firing them,
    or a signal dropping its deadline) rather than wait for them; SQLite
    serialises writers, so it deletes them one by one, seeing no other
    claimer meanwhile.
    """
    if not due:
        return []
    if tx.dialect.row_locks:
        rows = tx.execute(FIRE_DUE, {
            "now": max(row[3] for row in due), "at": iso_utc(at),
            "workflows": [row[0] for row in due],
            "ids": [row[1] for row in due], "keys": [row[2] for row in due],
        }).fetchall()
        return [(w, i, k, float(d)) for w, i, k, d in rows]
    return [row for row in due if fire_key(tx, *row[:3], at, due_by=row[3])]


def next_deadline(tx: Transaction) -> float | None:
    """The earliest armed timer deadline or workflow timeout, or None."""
    row = tx.execute(_NEXT_DEADLINE).fetchone()
    deadlines = [float(d) for d in (row or ()) if d is not None]
    return min(deadlines) if deadlines else None
