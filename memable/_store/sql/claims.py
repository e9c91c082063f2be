"""How an instance comes to run here: it is created (alone, or as a run's child), and it
is claimed (written once for both stores; ``:name`` parameters, spelled by the
transaction).

A new instance is created unless its id is taken (then nothing is written):
a running one is this engine's from its creation, a queued one nobody's (it
waits for a slot of its queue, whose consumers are told), and one with a
delayed start waits, suspended and nobody's, on its start's timer (the
engines are told of the timer). A run's children are created with the
parent's steps that wait for them, while the parent is still this engine's.

A claim takes an instance for a run of this engine: the user's resume, the
wake-up of a suspended instance that is ready, the recovery of a running one
whose owner's lease ran out (``Claim``). A live owner other than this engine
never loses an instance to it. A wake-up or a recovery passes over a row
another transaction holds (another engine's claim, or a lost owner's
transaction the server has not ended yet: the poll finds it again); the
user's resume waits its turn. Leases are judged by the store's clock
(``{now_epoch}``).

Durability: every claim commits at the store's durability (on PostgreSQL, the
session's ``synchronous_commit``), as every other write does: its run acts on
it at once, and a step's side effect must never rest on a claim a crash can
undo (the instance would be queued, or suspended and ready, again, and run a
second time beside the step still running).
"""

from __future__ import annotations

from ..._clock import iso_utc
from ..control import LostInstance, RunCancelled
from ..liveness import OWNER_SUFFIX
from ..rows import (
    UNREACHED,
    Claim,
    InstanceRow,
    RunSnapshot,
    StepWrite,
    instance_row,
    step_params,
)
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

# A claim that takes a running instance from another owner (dead: the claim's
# WHERE says so) recovers it; the expressions of one UPDATE see the old row.
_RECOVERED = "status = 'running' AND owner IS NOT NULL AND owner <> :me"
# The old owner by host and pid: its id without the random digits that end it
# (``liveness.owner_id``; an id of another shape is named as it is).
_OWNER_NAME = f"""CASE WHEN substr(owner, length(owner) - {OWNER_SUFFIX}, 1) = ':'
    THEN substr(owner, 1, length(owner) - {OWNER_SUFFIX + 1}) ELSE owner END"""
# How it was lost: an owner whose row is gone was reaped by an engine of its host,
# which saw its process gone (died); one whose row is there only let its lease
# run out (stalled; on another host, whether it also died is not known here).
_HOW_LOST = """CASE WHEN EXISTS (SELECT 1 FROM owners WHERE owners.id = instances.owner)
    THEN ' stalled past its lease' ELSE ' died' END"""
# What a claim writes: running and owned; an instance of a queue instead
# waits for a slot (queued, nobody's; a queued or recovered one keeps its
# place). A recovery is counted, with the dead owner (cleared by any other
# claim: set, it says this claim recovered the instance), that owner by host and
# pid and how it was lost (kept), and the step it had in flight (its heartbeat
# named it) if that attempt's end was never stored: its execution was lost with
# the owner, and ``COUNT_LOST`` counts it in the same transaction.
CLAIM_SET = f"""status = CASE WHEN queue IS NULL THEN 'running' ELSE 'queued' END,
    owner = CASE WHEN queue IS NULL THEN :me END,
    queued_at = CASE WHEN queue IS NULL OR status IN ('queued', 'running') THEN queued_at
        ELSE :at END,
    recoveries = CASE WHEN {_RECOVERED} THEN COALESCE(recoveries, 0) + 1 ELSE recoveries END,
    lost_owner = CASE WHEN {_RECOVERED} THEN owner END,
    lost_by = CASE WHEN {_RECOVERED} THEN {_OWNER_NAME} || {_HOW_LOST} ELSE lost_by END,
    lost_step = CASE WHEN {_RECOVERED} THEN (SELECT instances.step_key WHERE NOT EXISTS (
        SELECT 1 FROM steps AS done WHERE done.workflow = instances.workflow
        AND done.instance_id = instances.instance_id AND done.key = instances.step_key
        AND (done.state = 'completed' OR done.started_at >= instances.step_started)))
        ELSE lost_step END,
    message = NULL, waiting_for = NULL, updated_at = :at, completed_at = NULL,
    traceback = NULL, step_key = NULL, step_started = NULL, children_pending = NULL,
    run_reason = CASE :claim WHEN 'resume' THEN 'resume' WHEN 'recover' THEN 'recovery' END"""
#: In the transaction of a claim that recovered the instance (``lost_owner`` set) with a
#: step lost in flight (``lost_step``): count that step's lost execution in its
#: ``attempts``. A key never stored yet gets a failed row (after every step reached, but
#: before a signal stored for a key not reached yet, ``UNREACHED``) that names the lost
#: owner, which the run's next attempt replaces; a completed row, or a row of another
#: kind, is left as it is.
COUNT_LOST = f"""
INSERT INTO steps (workflow, instance_id, key, seq, kind, state, error, attempts)
SELECT :workflow, :instance_id, :key, COALESCE(MAX(seq), -1) + 1, 'step', 'failed',
    'engine ' || :lost_by || ' during this attempt', 1
FROM steps WHERE workflow = :workflow AND instance_id = :instance_id AND seq < {UNREACHED}
ON CONFLICT (workflow, instance_id, key) DO UPDATE SET
    attempts = steps.attempts + 1, error = excluded.error
WHERE steps.state <> 'completed' AND steps.kind = 'step'
"""
#: An instance is free to claim when nobody runs it, or its owner's lease ran out by the
#: store's clock.
_OWNER_FREE = OWNER_FREE.replace(":now", "{now_epoch}")
#: Which instances each claim takes (of the row ``instances``).
_CLAIMABLE: dict[Claim, str] = {
    "resume": f"status <> 'cancelled' AND (status <> 'running' OR {_OWNER_FREE})",
    "wake": WAKE,
    "recover": f"status = 'running' AND {_OWNER_FREE}",
}
#: The instance's row, locked, unless another transaction holds it (then no row): a
#: wake-up or a recovery passes over it (SQLite: none is, writers take turns).
_UNLESS_HELD = (
    "(workflow, instance_id) IN (SELECT workflow, instance_id FROM instances "
    "WHERE workflow = :workflow AND instance_id = :instance_id{skip_locked})"
)
#: The claim itself: the instance's row as it writes it, if it may take it.
_TAKE: dict[Claim, str] = {
    claim: f"UPDATE instances SET {CLAIM_SET} WHERE workflow = :workflow "
    f"AND instance_id = :instance_id AND {claimable} "
    + ("" if claim == "resume" else f"AND {_UNLESS_HELD} ")
    + f"RETURNING {', '.join(INSTANCE_COLUMNS)}"
    for claim, claimable in _CLAIMABLE.items()
}


def create(
    tx: Transaction, row: InstanceRow, start_at: float | None = None, token: str | None = None
) -> bool:
    """Create the instance ``row`` (running: this engine's; else nobody's yet); False, and
    nothing written, if its id is taken. A queued one tells its queue's consumers.

    Without ``start_at`` it may run as one statement, outside a transaction, and again
    after its answer was lost: with ``token``, unique to the call, it then answers as
    its first run did (``insert_instance``). A queued one's consumers are told after
    the row committed (a telling without a new row is a late wake-up, no more).

    With ``start_at`` (epoch seconds), a delayed start, atomically with the row: the
    instance (stored suspended, nobody's, waiting on the key ``instances.START_KEY``)
    gets that key as a waiting timer step and its timer, due then, and the engines are
    told of the timer; its firing makes the instance ready, as any timer does.
    """
    if not insert_instance(tx, row, token):
        return False
    if start_at is not None:
        params = {"workflow": row.workflow, "instance_id": row.instance_id,
                  "deadline": start_at}
        tx.execute(INSERT_START_STEP, params)
        tx.execute(INSERT_START_TIMER, params)
        tx.notify("timer", row.workflow, row.instance_id)
    elif row.status != "running":  # it waits for a slot: tell the queue's consumers
        tx.notify("queued", row.workflow, row.instance_id)
    return True


def start_children(tx: Transaction, waits: list[StepWrite], rows: list[InstanceRow]) -> list[str]:
    """Record a parent's child steps ``waits`` as waiting and create the children ``rows``
    (of one workflow), atomically; the ids of the children created.

    Only if the parent (the instance of ``waits``) is this engine's, its row
    locked until commit (else ``LostInstance``), and running (cancelled:
    ``RunCancelled``, nothing written). A child id that exists is left as it
    was, so a parent that crashed after starting a child never makes a second;
    it must be this parent's child at that key (else ``ChildIdTaken``, nothing
    written). Queued children tell their queue's consumers.
    """
    workflow, instance_id = waits[0].workflow, waits[0].instance_id
    found = tx.lock_instance(workflow, instance_id)
    if found is None or found[1] != tx.owner:
        raise LostInstance(workflow, instance_id)
    if found[0] != "running":
        raise RunCancelled()
    tx.executemany(INSERT_WAITING, [step_params(wait, tx.owner) for wait in waits])
    created = insert_instances(tx, rows)
    made = set(created)
    # An id that was there must be this parent's child at this key.
    refuse_taken(tx, rows[0].workflow, (workflow, instance_id),
                 {r.instance_id: str(r.parent_key) for r in rows if r.instance_id not in made})
    if created and rows[0].status != "running":  # they wait for slots: tell the consumers
        tx.notify("queued", workflow, instance_id)
    return created


def begin_run(
    tx: Transaction, workflow: str, instance_id: str, *, now: float, claim: Claim
) -> RunSnapshot | None:
    """Claim the instance for a run of this engine, as ``claim`` allows (see the module
    docstring), at ``now`` (epoch seconds, UTC); None, and nothing written, if it is unknown,
    not claimable, or (a wake-up or recovery) another transaction holds it.

    The claim marks it running and owned and reads its input and steps; an
    instance of a queue is marked queued instead (it waits for a slot; a queued one
    keeps its place: its queue's consumers are told), and its snapshot says so,
    with no steps. A claim that recovers the instance with a step lost in flight
    counts that step's lost execution (``COUNT_LOST``) in the same transaction.
    """
    where = {"workflow": workflow, "instance_id": instance_id}
    # The steps are read by a statement of their own, after the claim took the row: it
    # sees every step the previous owner committed, and that owner can write no more.
    # (Read in the claim's round trip, though a claim that takes nothing discards them.)
    taken, steps = tx.execute_each((_TAKE[claim], {
        **where, "me": tx.owner, "at": iso_utc(now), "claim": claim,
        "now": now,  # the engine's clock (SQLite)
    }), (SELECT_RUN_STEPS, where))
    if not taken:
        return None
    instance = instance_row(INSTANCE_COLUMNS, taken[0])
    if instance.lost_owner is not None and instance.lost_step is not None:
        tx.execute(COUNT_LOST, {**where, "key": instance.lost_step,
                                "lost_by": instance.lost_by})
        steps = tx.execute(SELECT_RUN_STEPS, where).fetchall()  # with the lost execution
    if instance.status == "queued":  # it waits for a slot: nothing to run yet
        tx.notify("queued", workflow, instance_id)
        return RunSnapshot(instance, {})
    return RunSnapshot(instance, {step[0]: stored_step(step) for step in steps})
