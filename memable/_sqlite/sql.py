"""The fixed SQL of the SQLite store's hot paths, and its row conversions (see ``store``).

sqlite-utils introspects the schema on every call, so the per-step
statements are prepared text on the connection; they live here, apart from
the store's logic. The SQL the PostgreSQL store runs too is the store
protocol's (``memable._store.sql``).
"""

from __future__ import annotations

import sqlite3
from datetime import datetime

from .._errors import InstanceNotFound
from .._store.rows import Claim
from .._store.sql.instances import INSTANCE_COLUMNS, OWNED, OWNER_FREE, WAKE

CLAIMS: dict[Claim, str] = {
    "resume": f"status != 'cancelled' AND (status != 'running' OR {OWNER_FREE})",
    "wake": WAKE,
    "recover": f"status = 'running' AND {OWNER_FREE}",
}
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


