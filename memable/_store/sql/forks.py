"""Forking an instance from a step, written once for both stores (``:name`` parameters,
spelled by the transaction).

A fork is a new instance of the same workflow with the same input, whose
completed steps reached before the key it re-runs from (by ``seq``, the order
first reached) are copied as memos: its first run replays them and executes
that key and everything after it. It is stored suspended, nobody's and ready
(as ``memable resume`` leaves one), so the next look of an engine that runs
the workflow takes it (onto its queue, if it has one). The source is only read.

The source's row is read first, share-locked (PostgreSQL: ``FOR SHARE``), and
stays locked until the fork commits: the fork reads the source in several
statements, and a purge (which passes over locked rows) must not delete it in
between, leaving a fork with no steps (or refusing its id as taken). On SQLite
the transaction holds the write lock from the first read. An engine that runs
the workflow is told (a "signal" to the new instance), so it takes it at once.
"""

from __future__ import annotations

from datetime import datetime

from ..._clock import iso_utc
from ..._errors import InstanceNotFound, StepNotFound
from ..transaction import Transaction

#: The source's row, read first and share-locked: the source is the fork's until it
#: commits; a purge's ``FOR UPDATE ... SKIP LOCKED`` passes it over.
SOURCE = (
    "SELECT 1 FROM instances WHERE workflow = :workflow AND instance_id = :instance_id"
    "{for_share}"
)
#: The source's steps, in the order first reached: where a fork may start.
KEYS = (
    "SELECT key, seq FROM steps WHERE workflow = :workflow AND instance_id = :instance_id "
    "ORDER BY seq, key"
)
#: The new instance: the source's input, queue, priority and concurrency key; ready for an
#: engine's look. Its workflow timeout (the source's) counts from the fork's creation.
INSERT_FORK = """
INSERT INTO instances (workflow, instance_id, status, message, input, input_type,
    created_at, updated_at, children_pending, queue, priority, concurrency_key,
    timeout, timeout_at)
SELECT workflow, :new_id, 'suspended', :message, input, input_type, :at, :at, 0,
    queue, priority, concurrency_key, timeout, :created + timeout
FROM instances WHERE workflow = :workflow AND instance_id = :instance_id
ON CONFLICT DO NOTHING
"""
_COPY_STEPS = """
INSERT INTO steps (workflow, instance_id, key, seq, kind, state, result, result_type,
    status, error, attempts, completed_at, started_at, traceback)
SELECT workflow, :new_id, key, seq, kind, state, result, result_type, status, error,
    attempts, completed_at, started_at, traceback
FROM steps WHERE workflow = :workflow AND instance_id = :instance_id
AND state = 'completed'
"""
#: The completed steps reached before ``:seq``, copied to the new instance.
COPY_STEPS_BEFORE = _COPY_STEPS + "AND seq < :seq"
#: Every completed step, copied to the new instance (a fork with no key).
COPY_ALL_STEPS = _COPY_STEPS


def fork(
    tx: Transaction, workflow: str, instance_id: str, new_id: str, from_key: str | None,
    at: float,
) -> bool:
    """Create ``new_id`` as a fork of the instance from ``from_key`` (None: after every
    completed step) at ``at`` (epoch seconds, UTC), atomically, and tell the engines;
    False, and nothing written, if ``new_id`` exists.

    Raise ``InstanceNotFound`` for an unknown source and ``StepNotFound`` (naming
    the keys it has) for a key it never reached; each writes nothing. The source
    is only read, and locked against a purge until the fork commits.
    """
    where = {"workflow": workflow, "instance_id": instance_id}
    if tx.execute(SOURCE, where).fetchone() is None:
        raise InstanceNotFound(workflow, instance_id)
    keys = {str(key): int(seq) for key, seq in tx.execute(KEYS, where).fetchall()}
    if from_key is not None and from_key not in keys:
        raise StepNotFound(workflow, instance_id, from_key, list(keys))
    message = f"forked from {instance_id!r}" + (
        f" at {from_key!r}" if from_key is not None else "")
    text = iso_utc(at)  # as stored; its timeout counts from the stored creation time
    params = {**where, "new_id": new_id, "message": message, "at": text,
              "created": datetime.fromisoformat(text).timestamp()}
    if tx.execute(INSERT_FORK, params).rowcount != 1:
        return False
    if from_key is None:
        tx.execute(COPY_ALL_STEPS, params)
    else:
        tx.execute(COPY_STEPS_BEFORE, {**params, "seq": keys[from_key]})
    # An engine that runs the workflow takes it now, not at its next poll.
    tx.notify("signal", workflow, new_id)
    return True
