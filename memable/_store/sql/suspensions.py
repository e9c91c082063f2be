"""A run's suspension: the end of this engine's run at a key it waits on, or going on."""

from __future__ import annotations

from ..._clock import iso_utc
from ..._errors import key_taken
from ..control import LostInstance
from ..rows import RunSnapshot, StepWrite, Suspend, fired_now, instance_row, settled, step_params
from ..transaction import LOCK_INSTANCE, Transaction
from . import timers
from .children import PENDING_IN_GROUP
from .instances import INSERT_WAITING, INSTANCE_COLUMNS
from .steps import SELECT_RUN_STEPS, SELECT_STEP, UPSERT_STEP, stored_step

_SELECT_INSTANCE = (f"SELECT {', '.join(INSTANCE_COLUMNS)} FROM memable_instances "
                    "WHERE workflow = :workflow AND instance_id = :instance_id")
#: The instance suspended on its key (a group: its children pending), nobody's: if still ours.
_SUSPENDED = """
UPDATE memable_instances SET status = 'suspended', message = :message, waiting_for = :key,
    children_pending = :pending, owner = NULL, updated_at = :at
WHERE workflow = :workflow AND instance_id = :instance_id AND owner = :me
AND status = 'running'
"""


def suspend(tx: Transaction, waiting: StepWrite, message: str, deadline: float | None,
            now: float) -> Suspend:
    """End this engine's run at a suspend point, timer, retry backoff or group ``waiting``,
    if owned (else ``LostInstance``) and running (else "stopped"), its row locked first. The
    key is marked waiting (``deadline`` armed once) and the instance suspended and nobody's
    ("waiting"), unless the key has its outcome (a signal, or a deadline due at ``now``, fired
    here): then it stays running and ours ("ready"). A group waits for its children."""
    workflow, instance_id, key = waiting.workflow, waiting.instance_id, waiting.key
    where = {"workflow": workflow, "instance_id": instance_id, "key": key}
    # One round trip where the store can: the lock, the key's row, its armed deadline.
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
        pending = tx.execute(PENDING_IN_GROUP, {"workflow": workflow, "instance_id": instance_id,
                                                "n": len(prefix), "prefix": prefix}).fetchone()[0]
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
    # A retry backoff's failed row turns waiting either way (the next attempt overwrites
    # it); the timer statements above touch only a timer's or a suspend point's row.
    if waiting.kind == "step" or not ready:
        tx.write(INSERT_WAITING, step_params(waiting, tx.owner))
    if ready:  # go on at once: the instance stays running, and ours
        return _go_on(tx, workflow, instance_id)
    return _suspended(tx, waiting, message, None, armed)


def _go_on(tx: Transaction, workflow: str, instance_id: str) -> Suspend:
    """The run goes on at once ("ready"). No owner or status changed, so the commit needn't
    wait for its flush (``relax_commit``): the run's next durable write covers it; and it
    goes with the snapshot's reads (``last``): run again, the body answers alike."""
    tx.relax_commit()
    where = {"workflow": workflow, "instance_id": instance_id}
    instance, steps = tx.execute_each(
        (_SELECT_INSTANCE, where), (SELECT_RUN_STEPS, where), last=True)
    memo = {s[0]: stored_step(s) for s in steps}
    return Suspend("ready",
                   snapshot=RunSnapshot(instance_row(INSTANCE_COLUMNS, instance[0]), memo))


def _suspended(tx: Transaction, waiting: StepWrite, message: str, pending: int | None,
               armed: float | None) -> Suspend:
    """Suspend the instance on ``waiting.key`` ("waiting"); "stopped" if no longer ours."""
    suspended = tx.execute(_SUSPENDED, {
        "message": message, "key": waiting.key, "pending": pending, "at": iso_utc(waiting.at),
        "workflow": waiting.workflow, "instance_id": waiting.instance_id, "me": tx.owner,
    }).rowcount
    if not suspended:  # cancelled meanwhile
        return Suspend("stopped")
    return Suspend("waiting", deadline=armed)
