"""The fixed SQL of the PostgreSQL store (see ``store``).

Every statement names its tables unqualified: each connection's
``search_path`` is the store's schema. Fencing: a write of a run locks its
instance row (``FOR SHARE`` or ``FOR UPDATE``) in the same statement or
transaction and writes only while the row's owner is this engine, so a
takeover (an ``UPDATE`` of the owner) waits for the write's commit, and a
write that comes after the takeover sees the new owner and writes nothing.
Leases are judged by the server's clock (the dialect's ``now_epoch``,
``memable._store.transaction``), so hosts whose clocks differ agree on them.
"""

from __future__ import annotations

from .._store.sql import instances as shared
from .._store.sql.execute import pg

SELECT_RUN_STEPS = (
    "SELECT key, seq, kind, state, result, result_type, status, attempts "
    "FROM steps WHERE workflow = %s AND instance_id = %s"
)
SELECT_STEP = SELECT_RUN_STEPS + " AND key = %s"
CHECK_RUN = "SELECT status, owner FROM instances WHERE workflow = %s AND instance_id = %s"
# The instance row, locked against a takeover until this transaction commits.
OWNED_ROW = (
    "SELECT 1 FROM instances WHERE workflow = %(workflow)s "
    "AND instance_id = %(instance_id)s AND owner = %(me)s FOR SHARE"
)
# A completed step is never overwritten, nor a row of another kind (``memable._store.sql.steps``).
UPSERT_STEP = f"""
WITH owned AS ({OWNED_ROW})
INSERT INTO steps (workflow, instance_id, key, seq, kind, state, result, result_type,
                   status, error, attempts, completed_at, started_at, traceback)
SELECT %(workflow)s, %(instance_id)s, %(key)s, %(seq)s, %(kind)s, %(state)s, %(result)s,
       %(result_type)s, %(status)s, %(error)s, 1, %(completed_at)s, %(started_at)s,
       %(traceback)s
FROM owned
ON CONFLICT (workflow, instance_id, key) DO UPDATE SET
    state = excluded.state, result = excluded.result, result_type = excluded.result_type,
    status = excluded.status, error = excluded.error, attempts = steps.attempts + 1,
    completed_at = excluded.completed_at, started_at = excluded.started_at,
    traceback = excluded.traceback
WHERE steps.state <> 'completed' AND steps.kind = excluded.kind
"""
SET_STATUS = (
    "UPDATE instances SET status_message = %s WHERE workflow = %s AND instance_id = %s "
    "AND owner = %s"
)
SET_IN_FLIGHT = (
    "UPDATE instances SET step_key = %s, step_started = %s WHERE workflow = %s "
    "AND instance_id = %s AND owner = %s AND status = 'running'"
)
SET_TRACEPARENT = pg(shared.SET_TRACEPARENT)
