"""A run's suspension: the end of this engine's run at a key it waits on, or going on.

A run that reaches a suspend point, a timer, a retry backoff or a group of
children marks the key waiting (arming its deadline once) and its instance
suspended and nobody's, in one transaction, fenced by the instance's row:
unless the wait is over already (the key has its outcome, or its deadline
is due, which fires it here), when the instance stays running and this
engine's, and the run goes on with the steps stored.
"""

from __future__ import annotations

from ..._clock import iso_utc
from ..._errors import key_taken
from ..control import LostInstance
from ..rows import (
    RunSnapshot,
    StepWrite,
    Suspend,
    fired_now,
    instance_row,
    settled,
    step_params,
)
from ..transaction import LOCK_INSTANCE, Transaction
from . import timers
from .children import PENDING_IN_GROUP
from .instances import INSERT_WAITING, INSTANCE_COLUMNS
from .steps import SELECT_RUN_STEPS, SELECT_STEP, UPSERT_STEP, stored_step

_SELECT_INSTANCE = (
    f"SELECT {', '.join(INSTANCE_COLUMNS)} FROM instances "
    "WHERE workflow = :workflow AND instance_id = :instance_id"
)
#: The instance suspended on its key (and, for a group, how many children it waits for),
#: and nobody's: only while it is still this engine's and running.
_SUSPENDED = """
UPDATE instances SET status = 'suspended', message = :message, waiting_for = :key,
    children_pending = :pending, owner = NULL, updated_at = :at
WHERE workflow = :workflow AND instance_id = :instance_id AND owner = :me
AND status = 'running'
"""


def suspend(
    tx: Transaction, waiting: StepWrite, message: str, deadline: float | None, now: float
) -> Suspend:
    """End this engine's run at a suspend point, timer or retry backoff ``waiting``.

    The instance's row is locked first: only if owned (else ``LostInstance``)
    and still running; a cancelled instance gets no waiting row and no timer
    ("stopped"). A key stored as another kind raises ``InvalidKey``, writing
    nothing. Else the key is marked waiting (its ``deadline`` armed once:
    runs after the first do not move it; arming tells the engines watching
    the store, "timer") and the instance suspended and nobody's ("waiting",
    with the deadline armed). If the key has its outcome meanwhile (a signal
    arrived, or its deadline is due at ``now``, which fires it here: a timer
    completes, a deadline times the key out, a retry backoff ends), the
    instance stays running and this engine's instead ("ready", with the
    steps to go on with). A retry backoff's failed row turns waiting either
    way (the next attempt overwrites it). A group of children
    (``waiting.kind`` "children") has no row of its own: it waits for as
    many children of the group as are still waiting, and goes on at once if
    none is.
    """
    workflow, instance_id, key = waiting.workflow, waiting.instance_id, waiting.key
    where = {"workflow": workflow, "instance_id": instance_id, "key": key}
    # In one round trip where the store can: the lock, then the key's row and the
    # deadline armed for it if it may have one (a group has no row of its own).
    reads = [] if waiting.kind == "children" else [
        (SELECT_STEP, where), *([] if deadline is None else [(timers.ARMED, where)])]
    locked, *read = tx.execute_each((LOCK_INSTANCE, where), *reads)
    state = locked[0] if locked else None
    if state is None or state[1] != tx.owner:
        raise LostInstance(workflow, instance_id)
    if state[0] != "running":  # cancelled meanwhile: arm nothing, write nothing
        return Suspend("stopped")
    if waiting.kind == "children":  # a group: no row of its own, a count
        prefix = f"{key}["
        pending = tx.execute(PENDING_IN_GROUP, {
            "workflow": workflow, "instance_id": instance_id, "n": len(prefix),
            "prefix": prefix,
        }).fetchone()[0]
        if not pending:
            return _go_on(tx, workflow, instance_id)
        return _suspended(tx, waiting, message, int(pending), None)
    found, *armed_rows = read
    step = stored_step(found[0]) if found else None
    if step is not None and step.kind != waiting.kind:
        raise key_taken(workflow, instance_id, key, step.kind, waiting.kind)
    ready = step is not None and settled(step.kind, step.state)
    armed = None
    if not ready and deadline is not None:
        # The first arming sets the deadline; runs after it do not move it.
        row = armed_rows[0][0] if armed_rows[0] else None
        armed = deadline if row is None else float(row[0])
        if armed <= now:  # due already: fire it here, no timer thread needed
            if row is not None:
                timers.fire_key(tx, workflow, instance_id, key, waiting.at)
            elif waiting.kind != "step":  # never armed: store it fired (or timed out)
                tx.write(UPSERT_STEP, step_params(fired_now(waiting), tx.owner))
            # (a retry backoff already over: the next attempt goes on now)
            ready = True
        elif row is None:
            timers.arm(tx, workflow, instance_id, key, deadline)
    # The key is reached: a suspend point or timer waits, unless it goes on at once; a
    # retry backoff's failed row turns waiting either way. The timer statements above
    # touch no row of another kind than a timer's or a suspend point's.
    if waiting.kind == "step" or not ready:
        tx.write(INSERT_WAITING, step_params(waiting, tx.owner))
    if ready:  # go on at once: the instance stays running, and ours
        return _go_on(tx, workflow, instance_id)
    return _suspended(tx, waiting, message, None, armed)


def _go_on(tx: Transaction, workflow: str, instance_id: str) -> Suspend:
    """The run goes on at once: its instance and steps as they are now ("ready").

    Nothing here changes an owner or a status: the instance stays running and
    this engine's. So the transaction may commit without waiting for its flush
    (``Transaction.relax_commit``): the run's next write commits durably and
    makes this durable too.
    """
    tx.relax_commit()
    where = {"workflow": workflow, "instance_id": instance_id}
    instance, steps = tx.execute_each((_SELECT_INSTANCE, where), (SELECT_RUN_STEPS, where))
    memo = {s[0]: stored_step(s) for s in steps}
    return Suspend("ready",
                   snapshot=RunSnapshot(instance_row(INSTANCE_COLUMNS, instance[0]), memo))


def _suspended(
    tx: Transaction, waiting: StepWrite, message: str, pending: int | None,
    armed: float | None,
) -> Suspend:
    """The instance suspended on ``waiting.key`` and nobody's ("waiting", with the
    deadline ``armed``); "stopped" if it is no longer this engine's running one."""
    suspended = tx.execute(_SUSPENDED, {
        "message": message, "key": waiting.key, "pending": pending, "at": iso_utc(waiting.at),
        "workflow": waiting.workflow, "instance_id": waiting.instance_id, "me": tx.owner,
    }).rowcount
    if not suspended:  # cancelled meanwhile
        return Suspend("stopped")
    return Suspend("waiting", deadline=armed)
