"""The fixed SQL of the SQLite store's hot paths, and its row conversions (see ``_sqlite``).

sqlite-utils introspects the schema on every call, so the per-step
statements are prepared text on the connection; they live here, apart from
the store's logic.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime

from ._errors import InstanceNotFound
from ._schema import INSTANCE_COLUMNS
from ._store import Claim

# An instance is free to claim when nobody runs it, or its owner's lease ran out.
OWNER_FREE = """(
    instances.owner IS NULL OR instances.owner = :me OR NOT EXISTS (
        SELECT 1 FROM owners WHERE owners.id = instances.owner
        AND owners.heartbeat + owners.lease >= :now))"""
CLAIMS: dict[Claim, str] = {
    "resume": f"status != 'cancelled' AND (status != 'running' OR {OWNER_FREE})",
    "wake": "status = 'suspended'",
    "recover": f"status = 'running' AND {OWNER_FREE}",
}
# A claim that takes a running instance from another owner (dead: the claim's
# WHERE says so) recovers it; the expressions of one UPDATE see the old row.
_RECOVERED = "status = 'running' AND owner IS NOT NULL AND owner <> :me"
# What a claim writes: running and owned; an instance of a queue instead
# waits for a slot (queued, nobody's; a queued or recovered one keeps its
# place). A recovery is counted, with the dead owner (cleared by any other
# claim: set, it says this claim recovered the instance) and the step it had
# in flight, if that never completed (its execution was lost with it).
CLAIM_SET = f"""status = CASE WHEN queue IS NULL THEN 'running' ELSE 'queued' END,
    owner = CASE WHEN queue IS NULL THEN :me END,
    queued_at = CASE WHEN queue IS NULL OR status IN ('queued', 'running') THEN queued_at
        ELSE :at END,
    recoveries = CASE WHEN {_RECOVERED} THEN COALESCE(recoveries, 0) + 1 ELSE recoveries END,
    lost_owner = CASE WHEN {_RECOVERED} THEN owner END,
    lost_step = CASE WHEN {_RECOVERED} THEN (SELECT instances.step_key WHERE NOT EXISTS (
        SELECT 1 FROM steps AS done WHERE done.workflow = instances.workflow
        AND done.instance_id = instances.instance_id AND done.key = instances.step_key
        AND done.state = 'completed')) ELSE lost_step END,
    message = NULL, waiting_for = NULL, updated_at = :at, completed_at = NULL,
    traceback = NULL, step_key = NULL, step_started = NULL, children_pending = NULL"""
OWNED = (
    "EXISTS (SELECT 1 FROM instances WHERE workflow = :workflow "
    "AND instance_id = :instance_id AND owner = :me)"
)
# A completed step is never overwritten: that is the exactly-once record. Nor
# is a row of another kind: a stored row is only ever served as what it was
# written as.
UPSERT_STEP = f"""
INSERT INTO steps (workflow, instance_id, key, seq, kind, state, result, result_type,
                   status, error, attempts, completed_at, started_at, traceback)
SELECT :workflow, :instance_id, :key, :seq, :kind, :state, :result, :result_type,
       :status, :error, 1, :completed_at, :started_at, :traceback
WHERE {OWNED}
ON CONFLICT (workflow, instance_id, key) DO UPDATE SET
    state = excluded.state, result = excluded.result, result_type = excluded.result_type,
    status = excluded.status, error = excluded.error, attempts = steps.attempts + 1,
    completed_at = excluded.completed_at, started_at = excluded.started_at,
    traceback = excluded.traceback
WHERE steps.state != 'completed' AND steps.kind = excluded.kind
"""
# Before a step executes: the instance's status, and whose it is.
CHECK_RUN = "SELECT status, owner FROM instances WHERE workflow = ? AND instance_id = ?"
SELECT_RUN_STEPS = (
    "SELECT key, seq, kind, state, result, result_type, status, attempts "
    "FROM steps WHERE workflow = ? AND instance_id = ?"
)
SELECT_STEP = SELECT_RUN_STEPS + " AND key = ?"
# A waiting row marks a suspend point or timer reached, or a step waiting out a
# retry backoff (its failed row turns waiting, ``result`` holding the attempt
# number the backoff follows). It never replaces a row of another kind.
INSERT_WAITING = f"""
INSERT INTO steps (workflow, instance_id, key, seq, kind, state, result, status, attempts)
SELECT :workflow, :instance_id, :key, :seq, :kind, 'waiting', :result, :status, 0
WHERE {OWNED}
ON CONFLICT (workflow, instance_id, key) DO UPDATE SET
    state = 'waiting', result = excluded.result
WHERE steps.state = 'failed' AND steps.kind = excluded.kind
"""
# What firing a due timer row does to its key: a timer completes; a suspend
# point's deadline times it out, unless a signal completed it first; a step's
# retry backoff only ends (the run makes the next attempt). ``{at}`` is the
# parameter holding the time.
FIRE_KEY = """state = CASE kind WHEN 'timer' THEN 'completed' ELSE 'timed_out' END,
    result = CASE kind WHEN 'timer' THEN 'null' END, result_type = NULL,
    attempts = CASE kind WHEN 'timer' THEN attempts + 1 ELSE attempts END,
    completed_at = CASE kind WHEN 'timer' THEN {at} END"""
FIRE_KEY_WHERE = "state NOT IN ('completed', 'timed_out') AND kind IN ('timer', 'signal')"
INSTANCE_RETURNING = ", ".join(INSTANCE_COLUMNS)
SELECT_INSTANCE = (
    f"SELECT {INSTANCE_RETURNING} FROM instances WHERE workflow = ? AND instance_id = ?"
)
INSERT_INSTANCE = (
    f"INSERT OR IGNORE INTO instances ({INSTANCE_RETURNING}) "
    f"VALUES ({', '.join('?' * len(INSTANCE_COLUMNS))})"
)

SET_STATUS = (
    "UPDATE instances SET status_message = ? WHERE workflow = ? AND instance_id = ? "
    "AND owner = ?"
)
SET_IN_FLIGHT = (
    "UPDATE instances SET step_key = ?, step_started = ? WHERE workflow = ? "
    "AND instance_id = ? AND owner = ? AND status = 'running'"
)

def status_of(conn: sqlite3.Connection, workflow: str, instance_id: str) -> str:
    """The stored status of the instance; InstanceNotFound if there is none."""
    row = conn.execute(
        "SELECT status FROM instances WHERE workflow = ? AND instance_id = ?",
        (workflow, instance_id),
    ).fetchone()
    if row is None:
        raise InstanceNotFound(workflow, instance_id)
    return str(row[0])


def wall_of(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


#: A key whose wait is over (as ``_store.settled`` says): a value, a deadline
#: passed, a child that ended failed.
SETTLED = (
    "(steps.state IN ('completed', 'timed_out') "
    "OR (steps.kind = 'child' AND steps.state = 'failed'))"
)
# Suspended instances whose awaited key has its outcome, or whose retry backoff ended
# (its timer row is gone), or whose group of children has all ended, among the
# workflows named by the ``marks`` parameters.
LOOK_READY = f"""
SELECT instances.workflow, instances.instance_id FROM instances JOIN steps
ON steps.workflow = instances.workflow AND steps.instance_id = instances.instance_id
AND steps.key = instances.waiting_for
WHERE instances.status = 'suspended' AND ({SETTLED} OR (
    steps.kind = 'step' AND NOT EXISTS (SELECT 1 FROM timers
    WHERE timers.workflow = steps.workflow AND timers.instance_id = steps.instance_id
    AND timers.key = steps.key)))
AND instances.workflow IN ({{marks}})
UNION
SELECT workflow, instance_id FROM instances
WHERE status = 'suspended' AND children_pending = 0 AND workflow IN ({{marks}})
"""
# ``memable resume``: ready for the next poll of an engine that runs it (see
# Store.mark_resumable); a running or queued instance is left as it is.
MARK_RESUMABLE = """
UPDATE instances SET status = 'suspended', message = 'resumed from the command line',
    waiting_for = NULL, children_pending = 0, owner = NULL, completed_at = NULL,
    traceback = NULL, updated_at = :at
WHERE workflow = :workflow AND instance_id = :instance_id
AND status IN ('failed', 'suspended', 'completed')
"""
