"""The fixed SQL of the PostgreSQL store (see ``store``).

Every statement names its tables unqualified: each connection's
``search_path`` is the store's schema. Fencing: a write of a run locks its
instance row (``FOR SHARE`` or ``FOR UPDATE``) in the same statement or
transaction and writes only while the row's owner is this engine, so a
takeover (an ``UPDATE`` of the owner) waits for the write's commit, and a
write that comes after the takeover sees the new owner and writes nothing.
Leases are judged by the server's clock (``NOW_EPOCH``), so hosts whose
clocks differ agree on them.
"""

from __future__ import annotations

from .._store.sql import instances as shared
from .._store.sql.execute import pg
from .._store.sql.instances import INSTANCE_COLUMNS

#: The server's clock, as seconds since the epoch: what leases are judged by.
NOW_EPOCH = "extract(epoch FROM clock_timestamp())::double precision"

# An instance is free to claim when nobody runs it, or its owner's lease ran out.
OWNER_FREE = f"""(
    instances.owner IS NULL OR instances.owner = %(me)s OR NOT EXISTS (
        SELECT 1 FROM owners WHERE owners.id = instances.owner
        AND owners.heartbeat + owners.lease >= {NOW_EPOCH}))"""
INSTANCE_RETURNING = ", ".join(INSTANCE_COLUMNS)
# The server-side functions (``functions``), one round trip each.
CLAIM = "SELECT instance, steps FROM memable_claim(%s, %s, %s, %s, %s)"
SELECT_RUN_STEPS = (
    "SELECT key, seq, kind, state, result, result_type, status, attempts "
    "FROM steps WHERE workflow = %s AND instance_id = %s"
)
SELECT_STEP = SELECT_RUN_STEPS + " AND key = %s"
INSERT_INSTANCE = (
    f"INSERT INTO instances ({INSTANCE_RETURNING}) "
    f"VALUES ({', '.join(['%s'] * len(INSTANCE_COLUMNS))}) ON CONFLICT DO NOTHING"
)
#: A queued instance and, if this made it, the "queued" notice (channel, payload), in one
#: statement: one round trip, one transaction. Its rowcount says whether it was made.
INSERT_QUEUED_INSTANCE = (
    f"WITH created AS ({INSERT_INSTANCE} RETURNING 1) SELECT pg_notify(%s, %s) FROM created"
)
CHECK_RUN = "SELECT status, owner FROM instances WHERE workflow = %s AND instance_id = %s"
# Children of one workflow and parent, running and owned by this engine; those
# whose id exists are left as they are. Returns the ids created.
INSERT_CHILDREN = """
INSERT INTO instances (workflow, instance_id, status, input, input_type, created_at,
                       updated_at, owner, parent_workflow, parent_id, parent_key, parent_group,
                       queue, priority, queued_at, timeout, timeout_at)
SELECT %(workflow)s, c.id, %(status)s, c.input, c.input_type, %(at)s, %(at)s, %(owner)s,
       %(parent_workflow)s, %(parent_id)s, c.key, %(parent_group)s, %(queue)s,
       %(priority)s, %(queued_at)s, %(timeout)s, %(timeout_at)s
FROM unnest(%(ids)s::text[], %(inputs)s::text[], %(types)s::text[], %(keys)s::text[])
    AS c(id, input, input_type, key)
ON CONFLICT DO NOTHING RETURNING instance_id
"""
# A parent's child steps, waiting (a failed one turns waiting: its child is resumed).
INSERT_WAITING = pg(shared.INSERT_WAITING)
# The instance row, locked against a takeover until this transaction commits.
OWNED_ROW = (
    "SELECT 1 FROM instances WHERE workflow = %(workflow)s "
    "AND instance_id = %(instance_id)s AND owner = %(me)s FOR SHARE"
)
# A completed step is never overwritten, nor a row of another kind (see ``_sqlite.sql``).
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
# Locks the instance for the rest of the transaction (suspend, signal, cancel).
LOCK_INSTANCE = (
    "SELECT status, owner FROM instances WHERE workflow = %s AND instance_id = %s FOR UPDATE"
)
SET_STATUS = (
    "UPDATE instances SET status_message = %s WHERE workflow = %s AND instance_id = %s "
    "AND owner = %s"
)
SET_IN_FLIGHT = (
    "UPDATE instances SET step_key = %s, step_started = %s WHERE workflow = %s "
    "AND instance_id = %s AND owner = %s AND status = 'running'"
)
SET_TRACEPARENT = pg(shared.SET_TRACEPARENT)
