"""Cancelling an instance and its descendants, for good (an operator's or a timeout's)."""

from __future__ import annotations

from ..._clock import iso_utc
from ..._errors import InstanceFinished, InstanceNotFound
from ..rows import Ended
from ..transaction import Transaction
from . import children

#: One instance cancelled: it ends, waits for nothing more.
CANCEL = ("UPDATE memable_instances SET status = 'cancelled', message = NULL, waiting_for = NULL, "
          "children_pending = NULL, updated_at = :at, completed_at = :at "
          "WHERE workflow = :workflow AND instance_id = :instance_id")
#: A cancelled instance's timers: none of them fires any more.
DROP_TIMERS = ("DELETE FROM memable_timers WHERE workflow = :workflow "
               "AND instance_id = :instance_id")


def cancel(tx: Transaction, workflow: str, instance_id: str, now: float) -> Ended:
    """Cancel the instance (its row locked first) and its descendants, at ``now`` (epoch s);
    ``InstanceNotFound``, or ``InstanceFinished`` if it completed or was cancelled already."""
    found = tx.lock_instance(workflow, instance_id)
    if found is None:
        raise InstanceNotFound(workflow, instance_id)
    if found[0] in ("completed", "cancelled"):
        raise InstanceFinished(workflow, instance_id, f"it is {found[0]}")
    return cancel_in(tx, workflow, instance_id, now)


def cancel_in(tx: Transaction, workflow: str, instance_id: str, now: float) -> Ended:
    """Cancel the instance (locked by the caller) and its descendants not ended, dropping their
    timers and telling their engines; settle its parent's step. Rows are locked top down, a
    child's end (``instances.finish``) bottom up: one is refused as a deadlock and retried."""
    where = {"workflow": workflow, "instance_id": instance_id}
    descendants = [(str(w), str(i)) for w, i in tx.execute(children.DESCENDANTS, where).fetchall()]
    at = iso_utc(now)
    # The owners stay: a run in flight stores its current step, then stops.
    for w, i in [(workflow, instance_id), *descendants]:
        one = {"workflow": w, "instance_id": i}
        tx.execute(CANCEL, {**one, "at": at})
        tx.execute(DROP_TIMERS, one)
        tx.notify("cancel", w, i)
    parent = tx.execute(children.PARENT_OF, where).fetchone()
    wake = children.settle_parent(tx, tuple(parent), status="cancelled", message="cancelled",
                                  output=None, at=now)
    return Ended(wake=wake, cancelled=descendants)
