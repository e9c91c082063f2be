"""Signals: a payload sent from outside a run, stored as its key's completed value.

A signal may come before the run reaches its key: it is stored at
``UNREACHED`` (after every step), and the run places it (``place``) where it
reaches the key. The key's deadline, if armed, is dropped in the signal's
transaction: of a signal and a deadline firing at once, exactly one takes
the key.
"""

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
INSERT INTO steps (workflow, instance_id, key, seq, kind, state, result, result_type,
                   attempts, completed_at)
VALUES (:workflow, :instance_id, :key, :seq, 'signal', 'completed', :result, :result_type,
        1, :at)
ON CONFLICT (workflow, instance_id, key) DO UPDATE SET state = 'completed',
    result = excluded.result, result_type = excluded.result_type, attempts = 1,
    completed_at = excluded.completed_at
"""
#: A signal stored before the run reached its key, placed where the run reached it (by
#: the owner alone; again, alike, if a lost commit is retried).
PLACE_SIGNAL = f"""
UPDATE steps SET seq = :seq
WHERE workflow = :workflow AND instance_id = :instance_id AND key = :key AND kind = 'signal'
AND {OWNED}
"""


def deliver(tx: Transaction, write: StepWrite, traceparent: str | None = None) -> None:
    """Store a signal payload as its key's completed value, atomically (and, if given,
    the trace context the instance's next run continues), and tell the engines watching
    the store ("signal").

    The instance's row is locked first. Raise InstanceNotFound,
    InstanceFinished (a terminal instance) or SignalRejected (the key holds a
    value, timed out, or was reached as a step or a timer), writing nothing,
    when the instance cannot take it. A key the run has reached keeps its
    seq; one it has not is stored at ``UNREACHED`` (after every step) until
    the run reaches it. The key's deadline goes first: a firing that holds
    its row is waited for (and then seen: the key timed out); one that comes
    later finds no row.
    """
    workflow, instance_id, key = write.workflow, write.instance_id, write.key
    where = {"workflow": workflow, "instance_id": instance_id, "key": key}
    # In one round trip where the store can: the lock, then the deadline's drop and the
    # key's row (undone if the lock's row refuses the signal).
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
    """Store ``seq`` as the place of a signal stored before the run reached its key (seq
    ``UNREACHED``), now that it has; only if owned (else ``LostInstance``). One
    statement, which writes and answers alike if run again."""
    params = {"workflow": workflow, "instance_id": instance_id, "key": key, "seq": seq,
              "me": tx.owner}
    if tx.execute(PLACE_SIGNAL, params).rowcount == 0:
        raise LostInstance(workflow, instance_id)
