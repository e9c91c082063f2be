"""How an instance comes to run here: created (alone, or as a run's child), or claimed.

Written once for both stores (``:name`` parameters, spelled by the transaction). A claim
(``Claim``) is a resume, the wake-up of a ready suspended instance, or the recovery of a
running one whose owner's lease ran out by the store's clock (``{now_epoch}``): a live other
owner never loses an instance. A wake-up or recovery passes over a row another transaction
holds (the poll finds it again); a resume waits its turn. Every claim commits durably: a
step's side effect must never rest on a claim a crash can undo, or it could run twice.
"""

from __future__ import annotations

from ..._clock import iso_utc
from ..control import LostInstance, RunCancelled
from ..liveness import OWNER_SUFFIX
from ..rows import UNREACHED, Claim, InstanceRow, RunSnapshot, StepWrite, instance_row, step_params
from ..transaction import Transaction
from .children import refuse_taken
from .instances import (
    INSERT_START_STEP,
    INSERT_START_TIMER,
    INSERT_WAITING,
    INSTANCE_COLUMNS,
    OWNER_FREE,
    WAKE,
    insert_instance,
    insert_instances,
)
from .steps import SELECT_RUN_STEPS, stored_step

# Taking a running row from another (dead) owner recovers it; each SET term sees the old row.
_RECOVERED = "status = 'running' AND owner IS NOT NULL AND owner <> :me"
# The old owner by host and pid: its id without its random suffix (``liveness.owner_id``).
_OWNER_NAME = f"""CASE WHEN substr(owner, length(owner) - {OWNER_SUFFIX}, 1) = ':'
    THEN substr(owner, 1, length(owner) - {OWNER_SUFFIX + 1}) ELSE owner END"""
# How it was lost: an owner whose row is gone was reaped by its host's engine (died); one
# whose row is there let its lease run out (stalled; whether it died is not known here).
_HOW_LOST = """CASE WHEN EXISTS (SELECT 1 FROM memable_owners
    WHERE memable_owners.id = memable_instances.owner)
    THEN ' stalled past its lease' ELSE ' died' END"""
# What a claim writes: running and owned, or a queue's instance queued and nobody's (a queued
# or recovered one keeps its place). A recovery sets ``lost_owner`` (other claims clear it),
# ``lost_by`` and the step in flight whose end was never stored (``lost_step``).
CLAIM_SET = f"""status = CASE WHEN queue IS NULL THEN 'running' ELSE 'queued' END,
    owner = CASE WHEN queue IS NULL THEN :me END,
    queued_at = CASE WHEN queue IS NULL OR status IN ('queued', 'running') THEN queued_at
        ELSE :at END,
    recoveries = CASE WHEN {_RECOVERED} THEN COALESCE(recoveries, 0) + 1 ELSE recoveries END,
    lost_owner = CASE WHEN {_RECOVERED} THEN owner END,
    lost_by = CASE WHEN {_RECOVERED} THEN {_OWNER_NAME} || {_HOW_LOST} ELSE lost_by END,
    lost_step = CASE WHEN {_RECOVERED} THEN (SELECT memable_instances.step_key WHERE NOT EXISTS (
        SELECT 1 FROM memable_steps AS done WHERE done.workflow = memable_instances.workflow
        AND done.instance_id = memable_instances.instance_id
        AND done.key = memable_instances.step_key
        AND (done.state = 'completed' OR done.started_at >= memable_instances.step_started)))
        ELSE lost_step END,
    message = NULL, waiting_for = NULL, updated_at = :at, completed_at = NULL,
    traceback = NULL, step_key = NULL, step_started = NULL, children_pending = NULL,
    run_reason = CASE :claim WHEN 'resume' THEN 'resume' WHEN 'recover' THEN 'recovery' END"""
#: After a recovery with a step lost in flight: count its lost execution in ``attempts``. A
#: key never stored gets a failed row naming the lost owner (after every step reached, before
#: ``UNREACHED``); a completed row, or one of another kind, is left as it is.
COUNT_LOST = f"""
INSERT INTO memable_steps (workflow, instance_id, key, seq, kind, state, error, attempts)
SELECT :workflow, :instance_id, :key, COALESCE(MAX(seq), -1) + 1, 'step', 'failed',
    'engine ' || :lost_by || ' during this attempt', 1
FROM memable_steps WHERE workflow = :workflow AND instance_id = :instance_id AND seq < {UNREACHED}
ON CONFLICT (workflow, instance_id, key) DO UPDATE SET
    attempts = memable_steps.attempts + 1, error = excluded.error
WHERE memable_steps.state <> 'completed' AND memable_steps.kind = 'step'
"""
#: ``OWNER_FREE`` by the store's clock.
_OWNER_FREE = OWNER_FREE.replace(":now", "{now_epoch}")
#: Which instances each claim takes (of the row ``instances``).
_CLAIMABLE: dict[Claim, str] = {
    "resume": f"status <> 'cancelled' AND (status <> 'running' OR {_OWNER_FREE})",
    "wake": WAKE,
    "recover": f"status = 'running' AND {_OWNER_FREE}",
}
#: The instance's row, locked, unless another transaction holds it (SQLite: writers take turns).
_UNLESS_HELD = ("(workflow, instance_id) IN (SELECT workflow, instance_id FROM memable_instances "
                "WHERE workflow = :workflow AND instance_id = :instance_id{skip_locked})")
#: The claim itself: the instance's row as it writes it, if it may take it.
_TAKE: dict[Claim, str] = {
    claim: f"UPDATE memable_instances SET {CLAIM_SET} WHERE workflow = :workflow "
    f"AND instance_id = :instance_id AND {claimable} "
    + ("" if claim == "resume" else f"AND {_UNLESS_HELD} ")
    + f"RETURNING {', '.join(INSTANCE_COLUMNS)}"
    for claim, claimable in _CLAIMABLE.items()
}


def create(tx: Transaction, row: InstanceRow, start_at: float | None = None,
           token: str | None = None) -> bool:
    """Create the instance ``row``; False, and nothing written, if its id is taken. Without
    ``start_at`` it may run as one statement, retried with ``token`` (``insert_instance``);
    with it (epoch seconds), the instance waits on a timer step at ``START_KEY``."""
    if start_at is None and row.status != "running":
        # It waits for a slot: tell the queue's consumers. Asked before the insert, the
        # notice goes with it (one round trip); an id taken makes it a look that finds none.
        tx.notify("queued", row.workflow, row.instance_id)
    if not insert_instance(tx, row, token):
        return False
    if start_at is not None:
        params = {"workflow": row.workflow, "instance_id": row.instance_id, "deadline": start_at}
        tx.execute(INSERT_START_STEP, params)
        tx.execute(INSERT_START_TIMER, params)
        tx.notify("timer", row.workflow, row.instance_id)
    return True


def start_children(tx: Transaction, waits: list[StepWrite], rows: list[InstanceRow]) -> list[str]:
    """Record a parent's child steps ``waits`` as waiting and create its children ``rows`` (one
    workflow's) atomically, if it is ours and running; the ids created. An id already its child
    at that key is kept (a crashed parent makes no second), else ``ChildIdTaken``."""
    workflow, instance_id = waits[0].workflow, waits[0].instance_id
    found = tx.lock_instance(workflow, instance_id)
    if found is None or found[1] != tx.owner:
        raise LostInstance(workflow, instance_id)
    if found[0] != "running":
        raise RunCancelled()
    tx.executemany(INSERT_WAITING, [step_params(wait, tx.owner) for wait in waits])
    created = insert_instances(tx, rows)
    made = set(created)
    refuse_taken(tx, rows[0].workflow, (workflow, instance_id),
                 {r.instance_id: str(r.parent_key) for r in rows if r.instance_id not in made})
    if created and rows[0].status != "running":  # they wait for slots: tell the consumers
        tx.notify("queued", workflow, instance_id)
    return created


def begin_run(tx: Transaction, workflow: str, instance_id: str, *, now: float,
              claim: Claim) -> RunSnapshot | None:
    """Claim the instance for a run here, as ``claim`` allows, at ``now`` (epoch seconds);
    None, and nothing written, if unknown, not claimable, or held by another transaction.
    A queue's instance is marked queued instead, its snapshot with no steps."""
    where = {"workflow": workflow, "instance_id": instance_id}
    # Read after the claim took the row: every step the old owner committed; it can write no more.
    taken, steps = tx.execute_each((_TAKE[claim], {
        **where, "me": tx.owner, "at": iso_utc(now), "claim": claim,
        "now": now,  # the engine's clock (SQLite)
    }), (SELECT_RUN_STEPS, where))
    if not taken:
        return None
    instance = instance_row(INSTANCE_COLUMNS, taken[0])
    if instance.lost_owner is not None and instance.lost_step is not None:
        tx.execute(COUNT_LOST, {**where, "key": instance.lost_step, "lost_by": instance.lost_by})
        steps = tx.execute(SELECT_RUN_STEPS, where).fetchall()  # with the lost execution
    if instance.status == "queued":  # it waits for a slot: nothing to run yet
        tx.notify("queued", workflow, instance_id)
        return RunSnapshot(instance, {})
    return RunSnapshot(instance, {step[0]: stored_step(step) for step in steps})
