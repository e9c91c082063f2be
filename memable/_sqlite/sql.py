"""The fixed SQL of the SQLite store's hot paths, and its row conversions (see ``store``).

sqlite-utils introspects the schema on every call, so the per-step
statements are prepared text on the connection; they live here, apart from
the store's logic. The SQL the PostgreSQL store runs too is the store
protocol's (``memable._store.sql``).
"""

from __future__ import annotations

from datetime import datetime

from .._store.rows import Claim
from .._store.sql.instances import INSTANCE_COLUMNS, OWNER_FREE, WAKE

CLAIMS: dict[Claim, str] = {
    "resume": f"status != 'cancelled' AND (status != 'running' OR {OWNER_FREE})",
    "wake": WAKE,
    "recover": f"status = 'running' AND {OWNER_FREE}",
}
# Before a step executes: the instance's status, and whose it is.
CHECK_RUN = "SELECT status, owner FROM instances WHERE workflow = ? AND instance_id = ?"
SELECT_RUN_STEPS = (
    "SELECT key, seq, kind, state, result, result_type, status, attempts "
    "FROM steps WHERE workflow = ? AND instance_id = ?"
)
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


def wall_of(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


