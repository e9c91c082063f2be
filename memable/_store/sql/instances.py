"""The SQL of instances and their keys that both stores run (``:name`` parameters; the
PostgreSQL store rewrites them with ``children.pg``, or fills in its own marks).

What a claim writes, a step's waiting row, what firing a due timer does to
its key, which suspended instances are ready to go on, and ``memable
resume``'s mark: the same rules, written once, on either store.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..liveness import OWNER_SUFFIX
from ..rows import TERMINAL, UNREACHED, Ended, RunEnd, TimedOut
from .children import TOLD
from .execute import Execute

#: The columns of an instance row, in ``InstanceRow``'s order, with their types.
INSTANCE_COLUMNS: dict[str, type] = {
    "workflow": str,
    "instance_id": str,
    "status": str,
    "message": str,
    "input": str,
    "input_type": str,
    "output": str,
    "output_type": str,
    "created_at": str,
    "updated_at": str,
    "completed_at": str,
    "waiting_for": str,  # v2: the signal or timer key a suspended instance waits on
    "owner": str,  # v3: the engine running the instance (owners.id), NULL when none
    # v6: what an operator sees of a run: the status message last set, the
    # step in flight (written at the owner's heartbeat) and since when, and
    # the traceback of a failure
    "status_message": str,
    "step_key": str,
    "step_started": str,
    "traceback": str,
    # v7: the parent of a child instance (its workflow, id, the key of its step
    # in the parent, and the group of ``ctx.children`` it belongs to), and how
    # many children a parent suspended on a group still waits for
    "parent_workflow": str,
    "parent_id": str,
    "parent_key": str,
    "parent_group": str,
    "children_pending": int,
    # v8: the queue an instance runs through, its priority (lower first) and
    # when it became runnable there
    "queue": str,
    "priority": int,
    "queued_at": str,
    # v9: how often the instance was taken over from a dead owner, the last such
    # owner and the step it had in flight (its executions lost with it)
    "recoveries": int,
    "lost_owner": str,
    "lost_step": str,
    # v10: the schedule whose tick the instance is
    "schedule": str,
    # v11: the trace context its next run continues (W3C traceparent), and why the
    # claim that queued it was made (its run's reason, once a queue's consumer runs it)
    "traceparent": str,
    "run_reason": str,
    # v13: the workflow timeout (seconds) and its durable deadline (epoch seconds, from
    # the instance's creation), and the key a per-key limit of its queue counts it under
    "timeout": float,
    "timeout_at": float,
    "concurrency_key": str,
    # v14: the owner the last recovery took the instance from, by host and pid, and how
    # it was lost ("died" or "stalled past its lease"); kept by later claims
    "lost_by": str,
}

# An instance is free to claim when nobody runs it, or its owner's lease ran out.
OWNER_FREE = """(
    instances.owner IS NULL OR instances.owner = :me OR NOT EXISTS (
        SELECT 1 FROM owners WHERE owners.id = instances.owner
        AND owners.heartbeat + owners.lease >= :now))"""

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
OWNED = (
    "EXISTS (SELECT 1 FROM instances WHERE workflow = :workflow "
    "AND instance_id = :instance_id AND owner = :me)"
)

# A waiting row marks a suspend point or timer reached, or a step waiting out a
# retry backoff (its failed row turns waiting, ``result`` holding the attempt
# number the backoff follows). It never replaces a row of another kind.
INSERT_WAITING = f"""
INSERT INTO steps (workflow, instance_id, key, seq, kind, state, result, status, attempts)
SELECT :workflow, :instance_id, :key, :seq, :kind, 'waiting', :result, :status, 0
WHERE {OWNED}
ON CONFLICT (workflow, instance_id, key) DO UPDATE SET
    state = 'waiting', result = excluded.result
WHERE steps.state = 'failed' AND steps.kind = excluded.kind
"""

# What firing a due timer row does to its key: a timer completes; a suspend
# point's deadline times it out, unless a signal completed it first; a step's
# retry backoff only ends (the run makes the next attempt). ``{at}`` is the
# parameter holding the time.
FIRE_KEY = """state = CASE kind WHEN 'timer' THEN 'completed' ELSE 'timed_out' END,
    result = CASE kind WHEN 'timer' THEN 'null' END, result_type = NULL,
    attempts = CASE kind WHEN 'timer' THEN attempts + 1 ELSE attempts END,
    completed_at = CASE kind WHEN 'timer' THEN {at} END"""
FIRE_KEY_WHERE = "state NOT IN ('completed', 'timed_out') AND kind IN ('timer', 'signal')"

#: A key whose wait is over (as ``memable._store.rows.settled`` says): a value, a deadline
#: passed, a child that ended failed.
SETTLED = (
    "(steps.state IN ('completed', 'timed_out') "
    "OR (steps.kind = 'child' AND steps.state = 'failed'))"
)
#: The awaited key's row (``steps``) ends the wait: it has its outcome, or it is a retry
#: backoff that ended (its timer row is gone).
_AWAITED_DONE = f"""({SETTLED} OR (
    steps.kind = 'step' AND NOT EXISTS (SELECT 1 FROM timers
    WHERE timers.workflow = steps.workflow AND timers.instance_id = steps.instance_id
    AND timers.key = steps.key)))"""
# Suspended instances whose awaited key ended its wait, or whose group of children has
# all ended, among the workflows named by the ``marks`` parameters.
LOOK_READY = f"""
SELECT instances.workflow, instances.instance_id FROM instances JOIN steps
ON steps.workflow = instances.workflow AND steps.instance_id = instances.instance_id
AND steps.key = instances.waiting_for
WHERE instances.status = 'suspended' AND {_AWAITED_DONE}
AND instances.workflow IN ({{marks}})
UNION
SELECT workflow, instance_id FROM instances
WHERE status = 'suspended' AND children_pending = 0 AND workflow IN ({{marks}})
"""
#: What a wake-up claims (of the row ``instances``): a suspended instance that
#: ``LOOK_READY`` finds ready, and no other. A signal or a timer wakes the instance it
#: touched whatever key it waits on; one still waiting (on another key, or on its delayed
#: start, ``START_KEY``) stays as it is: the signal is stored, its start waits for its
#: time.
WAKE = f"""instances.status = 'suspended' AND (instances.children_pending = 0 OR EXISTS (
    SELECT 1 FROM steps WHERE steps.workflow = instances.workflow
    AND steps.instance_id = instances.instance_id AND steps.key = instances.waiting_for
    AND {_AWAITED_DONE}))"""
#: The end of a run, recorded if the instance is still this engine's and running; it
#: names the parent (of a child) and the queue (whose slot it frees). A run released
#: at a wait it may go past (the engine stopped) is left ready, for the poll.
_FINISH = """
UPDATE instances SET status = :status, message = :message, output = :output,
    output_type = :output_type, waiting_for = :waiting_for, owner = NULL, updated_at = :at,
    completed_at = :completed_at, traceback = :traceback, step_key = NULL, step_started = NULL,
    children_pending = CASE WHEN :status = 'suspended' THEN 0 END
WHERE workflow = :workflow AND instance_id = :instance_id AND owner = :me
AND status = 'running'
"""
FINISH = _FINISH + "RETURNING parent_workflow, parent_id, parent_key, parent_group, queue\n"
#: ``FINISH`` of an instance that has no parent to settle: no row for one that has one.
FINISH_TOP_LEVEL = _FINISH + "AND parent_id IS NULL RETURNING queue\n"
#: A run that stopped on a cancel lets go of its instance (and of its queue's slot).
RELEASE = """
UPDATE instances SET owner = NULL
WHERE workflow = :workflow AND instance_id = :instance_id AND owner = :me
RETURNING queue
"""


def finish_params(workflow: str, instance_id: str, owner: str, end: RunEnd) -> dict[str, Any]:
    """The parameters of ``FINISH`` (and ``RELEASE``) for a run of ``owner`` ending so.

    >>> params = finish_params("wf", "i", "me", RunEnd("completed", "T", output=("1", None)))
    >>> params["output"], params["completed_at"]
    ('1', 'T')
    """
    text, tag = end.output if end.output is not None else (None, None)
    return {
        "workflow": workflow, "instance_id": instance_id, "me": owner, "status": end.status,
        "message": end.message, "output": text, "output_type": tag,
        "waiting_for": end.waiting_for, "at": end.at, "traceback": end.traceback,
        "completed_at": end.at if end.status in TERMINAL else None,
    }


#: The trace context a signal or a resume leaves for the instance's next run.
SET_TRACEPARENT = """
UPDATE instances SET traceparent = :traceparent
WHERE workflow = :workflow AND instance_id = :instance_id
"""
#: A signal stored before the run reached its key, placed where the run reached it (by
#: the owner alone; again, alike, if a lost commit is retried).
PLACE_SIGNAL = f"""
UPDATE steps SET seq = :seq
WHERE workflow = :workflow AND instance_id = :instance_id AND key = :key AND kind = 'signal'
AND {OWNED}
"""
# ``memable resume``: ready for the next poll of an engine that runs it (see
# Store.mark_resumable); a running or queued instance is left as it is.
_RESUME = """
UPDATE instances SET status = 'suspended', message = 'resumed from the command line',
    waiting_for = NULL, children_pending = 0, owner = NULL, completed_at = NULL,
    traceback = NULL, updated_at = :at
WHERE workflow = :workflow AND instance_id = :instance_id
"""
MARK_RESUMABLE = _RESUME + "AND status IN ('failed', 'suspended', 'completed')"
#: A failed child whose failure was handled (of a row of ``instances`` not aliased): its
#: parent has ended (or is gone), or has raised ``ChildFailed`` for it (its step holds
#: ``TOLD``, written by the parent's run). Resuming it alone would settle the parent's
#: step with an outcome the parent never saw, and a later replay of the parent diverge.
HANDLED_CHILD = f"""(instances.parent_id IS NOT NULL AND (
    NOT EXISTS (SELECT 1 FROM instances AS p WHERE p.workflow = instances.parent_workflow
        AND p.instance_id = instances.parent_id
        AND p.status NOT IN ('completed', 'failed', 'cancelled'))
    OR EXISTS (SELECT 1 FROM steps AS s WHERE s.workflow = instances.parent_workflow
        AND s.instance_id = instances.parent_id AND s.key = instances.parent_key
        AND s.kind = 'child' AND s.state = 'failed' AND s.result = '{TOLD}')))"""
#: A bulk resume's one instance: only the failure it counted (failed at ``:failed_at``,
#: not one after a resume since), and not a handled child's (``HANDLED_CHILD``).
RESUME_FAILURE = (
    _RESUME + f"AND status = 'failed' AND completed_at = :failed_at AND NOT {HANDLED_CHILD}"
)


#: The key of a delayed start (``invoke(start_at=)``): an engine's timer step, waited on
#: by the new instance until its timer fires (its seq -1: before every step of the run).
START_KEY = "_start"
#: A delayed start's timer step and its timer, written with the instance.
INSERT_START_STEP = (
    "INSERT INTO steps (workflow, instance_id, key, seq, kind, state, attempts) "
    "VALUES (:workflow, :instance_id, '_start', -1, 'timer', 'waiting', 0)"
)
INSERT_START_TIMER = (
    "INSERT INTO timers (workflow, instance_id, key, deadline) "
    "VALUES (:workflow, :instance_id, '_start', :deadline)"
)

#: The statuses of an instance that a workflow timeout still cancels (it has not ended).
TIMES_OUT = "status IN ('running', 'suspended', 'queued')"
#: The deadlines of workflow timeouts still armed: only instances that have not ended
#: (a query names the same terms, so either database uses this partial index).
TIMEOUTS_INDEX = (
    "CREATE INDEX IF NOT EXISTS instances_by_timeout ON instances (timeout_at) "
    f"WHERE timeout_at IS NOT NULL AND {TIMES_OUT}"
)
#: A queue's instances by their concurrency key, for its ``per_key`` count.
CONCURRENCY_KEY_INDEX = (
    "CREATE INDEX IF NOT EXISTS instances_by_concurrency_key "
    "ON instances (queue, concurrency_key, status) WHERE concurrency_key IS NOT NULL"
)
#: The earliest deadline of a workflow timeout still armed (NULL: none).
NEXT_TIMEOUT = (
    f"SELECT min(timeout_at) FROM instances WHERE timeout_at IS NOT NULL AND {TIMES_OUT}"
)
#: Instances whose workflow timeout passed by ``:now`` (epoch seconds), not ended yet.
DUE_TIMEOUTS = (
    "SELECT workflow, instance_id FROM instances "
    f"WHERE timeout_at IS NOT NULL AND {TIMES_OUT} AND timeout_at <= :now "
    "ORDER BY timeout_at LIMIT 100"
)
#: The timeout of an instance still due to time out at ``:now`` (none: it ended, or another
#: engine timed it out, meanwhile): read in the transaction that cancels it.
STILL_DUE = (
    "SELECT timeout FROM instances WHERE workflow = :workflow AND instance_id = :instance_id "
    f"AND timeout_at IS NOT NULL AND {TIMES_OUT} AND timeout_at <= :now"
)
#: What a timed-out instance (cancelled in the same transaction) says it ended by.
SET_TIMED_OUT = (
    "UPDATE instances SET message = :message, status_message = :message "
    "WHERE workflow = :workflow AND instance_id = :instance_id"
)


def time_out_due(
    execute: Execute, due: list[tuple[str, str]], clock: Callable[[], float],
    cancel: Callable[[str, str], Ended],
) -> list[TimedOut]:
    """In the caller's transaction, cancel (with ``cancel``, the store's own, children
    too) each of the ``due`` instances still due now and not ended, and give it its
    "timed out after" status; one that ended meanwhile, or that another engine timed
    out, is left as it is.

    "Now" is read from ``clock`` here, after the caller read ``due`` from the store:
    each of them was created, its deadline counted from the clock, before that read.
    A reading taken before it (the one the caller chose ``due`` by) may be later than
    the clock that created one of them, if the clock went back in between (a frozen
    test clock started while a look was under way): judged by it, an instance would
    time out the moment it was created.
    """
    now = clock()
    out = []
    for workflow, instance_id in due:
        where = {"workflow": workflow, "instance_id": instance_id}
        found = execute(STILL_DUE, {**where, "now": now}).fetchone()
        if found is None:
            continue
        ended = cancel(workflow, instance_id)
        message = timed_out_message(float(found[0]))
        execute(SET_TIMED_OUT, {**where, "message": message})
        out.append(TimedOut(workflow, instance_id, message, ended))
    return out


def due_after_read(
    read: list[Any], clock: Callable[[], float]
) -> list[tuple[str, str, str, float]]:
    """Of the timers ``read`` from the store, (workflow, id, key, deadline) rows chosen by
    an earlier reading, those due by a reading of ``clock`` taken now, after the read:
    each was armed, its deadline counted from the clock, before it. The earlier reading
    may be later than the clock that armed one of them, if the clock went back in
    between (a frozen test clock started while a look was under way): judged by it, a
    timer would fire the moment it was armed (as ``time_out_due`` says of timeouts).

    >>> read = [("w", "a", "t", 100.0), ("w", "b", "t", 200.0)]
    >>> due_after_read(read, lambda: 150.0)
    [('w', 'a', 't', 100.0)]
    """
    now = clock()
    return [(str(w), str(i), str(k), float(d)) for w, i, k, d in read if float(d) <= now]


def timed_out_message(timeout: float) -> str:
    """The status of an instance its workflow timeout cancelled.

    >>> timed_out_message(30), timed_out_message(0.25), timed_out_message(5400)
    ('timed out after 30s', 'timed out after 0.25s', 'timed out after 1h 30m')
    """
    return f"timed out after {duration_text(timeout)}"


def duration_text(seconds: float) -> str:
    """A duration as people write it: days, hours, minutes, seconds (to the millisecond).

    >>> duration_text(90061.5), duration_text(0)
    ('1d 1h 1m 1.5s', '0s')
    """
    parts = []
    rest = seconds
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if rest >= size:
            whole = int(rest // size)
            parts.append(f"{whole}{unit}")
            rest -= whole * size
    if rest > 0 or not parts:
        parts.append(f"{rest:.3f}".rstrip("0").rstrip(".") + "s")
    return " ".join(parts)
