"""Forking an instance from a step, for both stores (``:name`` parameters).

A fork is a new instance of the same workflow and input, with the completed steps reached
before its key (by ``seq``) copied, stored ready as ``memable resume`` leaves one. The source's
row is share-locked first (SQLite: the write lock) until the fork commits, so a purge cannot
delete it between the fork's reads."""

from __future__ import annotations

from datetime import datetime

from ..._clock import iso_utc
from ..._errors import InstanceNotFound, StepNotFound
from ..transaction import Transaction

#: The source's row, share-locked: a purge's ``SKIP LOCKED`` passes it over.
SOURCE = (
    "SELECT 1 FROM memable_instances WHERE workflow = :workflow AND instance_id = :instance_id"
    "{for_share}"
)
KEYS = (
    "SELECT key, seq FROM memable_steps WHERE workflow = :workflow AND instance_id = :instance_id "
    "ORDER BY seq, key"
)
#: Its workflow timeout (the source's) counts from the fork's creation.
INSERT_FORK = """
INSERT INTO memable_instances (workflow, instance_id, status, message, input, input_type,
    created_at, updated_at, children_pending, queue, priority, concurrency_key,
    timeout, timeout_at)
SELECT workflow, :new_id, 'suspended', :message, input, input_type, :at, :at, 0,
    queue, priority, concurrency_key, timeout, :created + timeout
FROM memable_instances WHERE workflow = :workflow AND instance_id = :instance_id
ON CONFLICT DO NOTHING
"""
_COPY_STEPS = """
INSERT INTO memable_steps (workflow, instance_id, key, seq, kind, state, result, result_type,
    status, error, attempts, completed_at, started_at, traceback)
SELECT workflow, :new_id, key, seq, kind, state, result, result_type, status, error,
    attempts, completed_at, started_at, traceback
FROM memable_steps WHERE workflow = :workflow AND instance_id = :instance_id
AND state = 'completed'
"""
COPY_STEPS_BEFORE = _COPY_STEPS + "AND seq < :seq"
COPY_ALL_STEPS = _COPY_STEPS


def fork(
    tx: Transaction, workflow: str, instance_id: str, new_id: str, from_key: str | None, at: float,
) -> bool:
    """Create ``new_id`` as a fork of the instance from ``from_key`` (None: after every
    completed step) at ``at`` (epoch seconds, UTC), and tell the engines; False if ``new_id``
    exists. ``InstanceNotFound``, or ``StepNotFound`` for a key never reached, write nothing."""
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
    tx.notify("signal", workflow, new_id)
    return True
