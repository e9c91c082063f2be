"""Signals: a payload sent from outside a run, stored as its key's completed value."""

from __future__ import annotations

from ..._clock import iso_utc
from ..._errors import InstanceNotFound, SignalRejected, instance_finished
from ..control import LostInstance
from ..rows import TERMINAL, UNREACHED, StepWrite
from ..transaction import LOCK_INSTANCE, Transaction
from . import timers
from .instances import OWNED, set_traceparent
from .steps import SELECT_STEP, stored_step

#: The signal's value, completing its key (a waiting suspend point's row, or a new one).
_STORE = """
INSERT INTO memable_steps (workflow, instance_id, key, seq, kind, state, result, result_type,
                   attempts, completed_at)
VALUES (:workflow, :instance_id, :key, :seq, 'signal', 'completed', :result, :result_type,
        1, :at)
ON CONFLICT (workflow, instance_id, key) DO UPDATE SET state = 'completed',
    result = excluded.result, result_type = excluded.result_type, attempts = 1,
    completed_at = excluded.completed_at
"""
#: An early signal placed where the run reached its key (by the owner; idempotent).
PLACE_SIGNAL = f"""
UPDATE memable_steps SET seq = :seq
WHERE workflow = :workflow AND instance_id = :instance_id AND key = :key AND kind = 'signal'
AND {OWNED}
"""


def deliver(tx: Transaction, write: StepWrite, traceparent: str | None = None) -> None:
    """Store a signal as its key's completed value (and ``traceparent``), its instance's row
    locked first; at ``UNREACHED`` until the run ``place``s it. The key's deadline is dropped
    first: a firing holding its row is waited for (the key timed out), a later one finds none."""
    workflow, instance_id, key = write.workflow, write.instance_id, write.key
    where = {"workflow": workflow, "instance_id": instance_id, "key": key}
    # One round trip if it can: the lock, the deadline's drop, the key's row (undone if refused).
    found, _, stored_rows = tx.execute_each(
        (LOCK_INSTANCE, where), (timers.DROP, where), (SELECT_STEP, where))
    if not found:
        raise InstanceNotFound(workflow, instance_id)
    status = found[0][0]
    if status in TERMINAL:
        raise instance_finished(workflow, instance_id, status)
    if stored_rows:
        step = stored_step(stored_rows[0])
        if step.kind != "signal":
            why = f"the key is a {step.kind}, not a suspend point"
            raise SignalRejected(workflow, instance_id, key, why)
        if step.state == "completed":
            raise SignalRejected(workflow, instance_id, key, "the key already holds a value")
        if step.state == "timed_out":
            why = "the suspend point timed out before it"
            raise SignalRejected(workflow, instance_id, key, why)
        seq = step.seq
    else:  # not reached yet: after every step until the run reaches it
        seq = UNREACHED
    tx.write(_STORE, {**where, "seq": seq, "result": write.result,
                      "result_type": write.result_type, "at": iso_utc(write.at)})
    if traceparent is not None:  # in the signal's transaction
        set_traceparent(tx, workflow, instance_id, traceparent)
    tx.notify("signal", workflow, instance_id)


def place(tx: Transaction, workflow: str, instance_id: str, key: str, seq: int) -> None:
    """Place an early signal (seq ``UNREACHED``) at ``seq``, now its key is reached; only if
    owned (else ``LostInstance``). One statement, alike if run again."""
    params = {"workflow": workflow, "instance_id": instance_id, "key": key, "seq": seq,
              "me": tx.owner}
    if tx.execute(PLACE_SIGNAL, params).rowcount == 0:
        raise LostInstance(workflow, instance_id)
