"""The SQL of instances and their keys, written once for both stores (``:name`` parameters)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..._clock import iso_utc
from ..._errors import InstanceFinished, InstanceNotFound
from ..rows import TERMINAL, Ended, InstanceRow, RunEnd, TimedOut
from ..transaction import Transaction
from . import children
from .cancel import cancel_in
from .children import TOLD
from .steps import OWNED_ROW

#: The columns of an instance row, in ``InstanceRow``'s order, with their types.
INSTANCE_COLUMNS: dict[str, type] = {
    "workflow": str, "instance_id": str, "status": str, "message": str, "input": str,
    "input_type": str, "output": str, "output_type": str, "created_at": str,
    "updated_at": str, "completed_at": str,
    "waiting_for": str,  # v2: the signal or timer key a suspended instance waits on
    "owner": str,  # v3: the engine running the instance (owners.id), NULL when none
    # v6: the last status message, the step in flight (heartbeat) and since when, a traceback
    "status_message": str, "step_key": str, "step_started": str, "traceback": str,
    # v7: a child's parent (workflow, id, step key, children group); a group's children pending
    "parent_workflow": str, "parent_id": str, "parent_key": str, "parent_group": str,
    "children_pending": int,
    # v8: its queue, priority (lower first) and when it became runnable there
    "queue": str, "priority": int, "queued_at": str,
    # v9: recoveries from a dead owner, the last such owner and the step it had in flight
    "recoveries": int, "lost_owner": str, "lost_step": str,
    "schedule": str,  # v10: the schedule whose tick the instance is
    # v11: the trace context its next run continues (W3C), and why a queued claim was made
    "traceparent": str, "run_reason": str,
    # v13: the workflow timeout (s), its deadline (epoch s), and its queue's per-key key
    "timeout": float, "timeout_at": float, "concurrency_key": str,
    # v14: the last recovery's lost owner by host and pid, and "died" or "stalled ..."
    "lost_by": str,
}

_COLUMNS = ", ".join(INSTANCE_COLUMNS)
#: A new instance's row unless its id is taken, with the creating call's token
#: (``created_by``: SQLite schema 15, PostgreSQL 10), by which a retried call knows its row.
INSERT_INSTANCE = (f"INSERT INTO memable_instances ({_COLUMNS}, created_by) "
                   f"VALUES ({', '.join(f':{name}' for name in INSTANCE_COLUMNS)}, :created_by) "
                   "ON CONFLICT DO NOTHING")
#: The instance, if the call of the token ``created_by`` created it.
CREATED_BY = ("SELECT 1 FROM memable_instances WHERE workflow = :workflow "
              "AND instance_id = :instance_id AND created_by = :created_by")
_ARRAY_OF = {str: "text[]", int: "integer[]", float: "double precision[]"}
#: New instances' rows from one array per column (``array_parameters``); the ids created.
INSERT_INSTANCES = (
    f"INSERT INTO memable_instances ({_COLUMNS}) SELECT * FROM unnest("
    f"{', '.join(f':{name}::{_ARRAY_OF[kind]}' for name, kind in INSTANCE_COLUMNS.items())}"
    ") ON CONFLICT DO NOTHING RETURNING instance_id"
)


def _owned_row(tx: Transaction, row: InstanceRow) -> InstanceRow:
    """``row`` as stored new: running, this engine's; else nobody's (awaiting a slot or start)."""
    return attrs.evolve(row, owner=tx.owner if row.status == "running" else None)


def insert_instance(tx: Transaction, row: InstanceRow, token: str | None = None) -> bool:
    """Create the instance ``row``; False, and nothing written, if its id is taken. With
    ``token`` (unique to the call), a row it created counts: a retry after a lost answer."""
    values = attrs.asdict(_owned_row(tx, row), recurse=False)
    if int(tx.execute(INSERT_INSTANCE, {**values, "created_by": token}).rowcount) == 1:
        return True
    return token is not None and tx.execute(CREATED_BY, {
        "workflow": row.workflow, "instance_id": row.instance_id, "created_by": token,
    }).fetchone() is not None


def insert_instances(tx: Transaction, rows: list[InstanceRow]) -> list[str]:
    """Create each instance of ``rows`` whose id is free; the ids created, in order."""
    if not tx.dialect.array_parameters:
        return [row.instance_id for row in rows if insert_instance(tx, row)]
    owned = [_owned_row(tx, row) for row in rows]
    columns: dict[str, list[Any]] = {name: [_as(kind, getattr(row, name)) for row in owned]
                                      for name, kind in INSTANCE_COLUMNS.items()}
    made = {str(found[0]) for found in tx.execute(INSERT_INSTANCES, columns).fetchall()}
    return [row.instance_id for row in rows if row.instance_id in made]


def _as(kind: type, value: Any) -> Any:
    """``value`` as an array of ``kind`` holds it (one type: an int timeout becomes a float)."""
    return None if value is None else kind(value)


# An instance is free to claim when nobody runs it, or its owner's lease ran out.
OWNER_FREE = """(
    memable_instances.owner IS NULL OR memable_instances.owner = :me OR NOT EXISTS (
        SELECT 1 FROM memable_owners WHERE memable_owners.id = memable_instances.owner
        AND memable_owners.heartbeat + memable_owners.lease >= :now))"""

#: The instance is this engine's, its row kept from a takeover until commit.
OWNED = f"EXISTS ({OWNED_ROW})"

# A suspend point or timer reached, or a retry backoff (the failed row turns waiting,
# ``result`` the attempt number); never replaces a row of another kind.
INSERT_WAITING = f"""
INSERT INTO memable_steps (workflow, instance_id, key, seq, kind, state, result, status, attempts)
SELECT :workflow, :instance_id, :key, :seq, :kind, 'waiting', :result, :status, 0
WHERE {OWNED}
ON CONFLICT (workflow, instance_id, key) DO UPDATE SET
    state = 'waiting', result = excluded.result
WHERE memable_steps.state = 'failed' AND memable_steps.kind = excluded.kind
"""

#: A key whose wait is over (as ``memable._store.rows.settled`` says).
SETTLED = ("(memable_steps.state IN ('completed', 'timed_out') "
           "OR (memable_steps.kind = 'child' AND memable_steps.state = 'failed'))")
#: The awaited key's row (``steps``) is settled, or a retry backoff whose timer is gone.
_AWAITED_DONE = f"""({SETTLED} OR (
    memable_steps.kind = 'step' AND NOT EXISTS (SELECT 1 FROM memable_timers
    WHERE memable_timers.workflow = memable_steps.workflow
    AND memable_timers.instance_id = memable_steps.instance_id
    AND memable_timers.key = memable_steps.key)))"""
# Suspended instances (of the ``marks`` workflows) whose awaited key or children group ended.
LOOK_READY = f"""
SELECT memable_instances.workflow, memable_instances.instance_id
FROM memable_instances JOIN memable_steps ON memable_steps.workflow = memable_instances.workflow
AND memable_steps.instance_id = memable_instances.instance_id
AND memable_steps.key = memable_instances.waiting_for
WHERE memable_instances.status = 'suspended' AND {_AWAITED_DONE}
AND memable_instances.workflow IN ({{marks}})
UNION
SELECT workflow, instance_id FROM memable_instances
WHERE status = 'suspended' AND children_pending = 0 AND workflow IN ({{marks}})
"""
#: What a wake-up claims: a suspended instance ``LOOK_READY`` finds ready, and no other (a
#: signal or timer wakes its instance whatever key it waits on: one still waiting stays).
WAKE = f"""memable_instances.status = 'suspended' AND (
    memable_instances.children_pending = 0 OR EXISTS (
    SELECT 1 FROM memable_steps WHERE memable_steps.workflow = memable_instances.workflow
    AND memable_steps.instance_id = memable_instances.instance_id
    AND memable_steps.key = memable_instances.waiting_for
    AND {_AWAITED_DONE}))"""
#: The end of a run, if still this engine's and running; returns the parent and queue. A
#: run released at a wait it may go past (the engine stopped) is left ready, for the poll.
FINISH = """
UPDATE memable_instances SET status = :status, message = :message, output = :output,
    output_type = :output_type, waiting_for = :waiting_for, owner = NULL, updated_at = :at,
    completed_at = :completed_at, traceback = :traceback, step_key = NULL, step_started = NULL,
    children_pending = CASE WHEN :status = 'suspended' THEN 0 END
WHERE workflow = :workflow AND instance_id = :instance_id AND owner = :me
AND status = 'running'
RETURNING parent_workflow, parent_id, parent_key, parent_group, queue
"""
#: A run that stopped on a cancel lets go of its instance (and of its queue's slot).
RELEASE = """
UPDATE memable_instances SET owner = NULL
WHERE workflow = :workflow AND instance_id = :instance_id AND owner = :me
RETURNING queue
"""


def finish_params(workflow: str, instance_id: str, owner: str, end: RunEnd) -> dict[str, Any]:
    """The parameters of ``FINISH`` (and ``RELEASE``) for a run of ``owner`` ending so.

    >>> params = finish_params("wf", "i", "me", RunEnd("completed", 0.0, output=("1", None)))
    >>> params["output"], params["completed_at"]
    ('1', '1970-01-01T00:00:00+00:00')
    """
    text, tag = end.output if end.output is not None else (None, None)
    at = iso_utc(end.at)
    return {
        "workflow": workflow, "instance_id": instance_id, "me": owner, "status": end.status,
        "message": end.message, "output": text, "output_type": tag,
        "waiting_for": end.waiting_for, "at": at, "traceback": end.traceback,
        "completed_at": at if end.status in TERMINAL else None,
    }


def finish(tx: Transaction, workflow: str, instance_id: str, end: RunEnd) -> Ended:
    """Record the end of this engine's run (if still its own and running; cancelled: only
    let go) and settle its parent's step. The row is locked before its parent's, against a
    cascading cancel's order: one is retried. Not idempotent: it runs as a transaction.

    An instance the run read without a parent (``end.read``) ends in one round trip, the
    ``COMMIT`` with it (``execute_each(last=True)``). Its answer lost, the body runs again:
    if the first committed, the second finds the run's end recorded already and answers
    ``recorded=False``, and the runner reads the stored state, the one it recorded."""
    params = finish_params(workflow, instance_id, tx.owner, end)
    if end.read is not None and end.read.parent_id is None:
        if end.read.queue is not None:  # a slot comes free (or none was held: a look)
            tx.notify("queued", workflow, instance_id)
        found_rows, _ = tx.execute_each((FINISH, params), (RELEASE, params), last=True)
        return Ended(recorded=bool(found_rows))
    found = tx.execute(FINISH, params).fetchone()
    if found is None:  # cancelled meanwhile: let go of it all the same
        released = tx.execute(RELEASE, params).fetchall()
        if released and released[0][0] is not None:
            tx.notify("queued", workflow, instance_id)
        return Ended(recorded=False)
    *parent, queue = found
    if queue is not None:  # a slot is free: tell the queue's consumers
        tx.notify("queued", workflow, instance_id)
    wake = children.settle_parent(tx, (parent[0], parent[1], parent[2], parent[3]),
                                  status=end.status, message=end.message, output=end.output,
                                  at=end.at)
    return Ended(wake=wake)


#: The trace context a signal or a resume leaves for the instance's next run.
SET_TRACEPARENT = """
UPDATE memable_instances SET traceparent = :traceparent
WHERE workflow = :workflow AND instance_id = :instance_id
"""
# ``memable resume``: ready for the next poll of an engine that runs it.
_RESUME = """
UPDATE memable_instances SET status = 'suspended', message = 'resumed from the command line',
    waiting_for = NULL, children_pending = 0, owner = NULL, completed_at = NULL,
    traceback = NULL, updated_at = :at
WHERE workflow = :workflow AND instance_id = :instance_id
"""
MARK_RESUMABLE = _RESUME + "AND status IN ('failed', 'suspended', 'completed')"
#: A failed child whose parent has ended (or is gone) or raised ``ChildFailed`` for it (its
#: step holds ``TOLD``): resumed alone, it would settle a step with an outcome the parent
#: never saw, and a replay of the parent diverge.
HANDLED_CHILD = f"""(memable_instances.parent_id IS NOT NULL AND (
    NOT EXISTS (SELECT 1 FROM memable_instances AS p
        WHERE p.workflow = memable_instances.parent_workflow
        AND p.instance_id = memable_instances.parent_id
        AND p.status NOT IN ('completed', 'failed', 'cancelled'))
    OR EXISTS (SELECT 1 FROM memable_steps AS s
        WHERE s.workflow = memable_instances.parent_workflow
        AND s.instance_id = memable_instances.parent_id AND s.key = memable_instances.parent_key
        AND s.kind = 'child' AND s.state = 'failed' AND s.result = '{TOLD}')))"""
#: A bulk resume's one instance: only the failure it counted, and no handled child.
RESUME_FAILURE = (
    _RESUME + f"AND status = 'failed' AND completed_at = :failed_at AND NOT {HANDLED_CHILD}"
)


def mark_resumable(tx: Transaction, workflow: str, instance_id: str, now: float) -> str:
    """``memable resume``: make a failed, suspended or completed instance ready, at ``now``
    (epoch s), its row locked first; the status it had (``InstanceFinished`` if cancelled)."""
    found = tx.lock_instance(workflow, instance_id)
    if found is None:
        raise InstanceNotFound(workflow, instance_id)
    status = str(found[0])
    if status == "cancelled":
        raise InstanceFinished(workflow, instance_id, "it is cancelled")
    where = {"workflow": workflow, "instance_id": instance_id, "at": iso_utc(now)}
    if tx.execute(MARK_RESUMABLE, where).rowcount:
        tx.notify("signal", workflow, instance_id)
    return status


def resume_failure(tx: Transaction, workflow: str, instance_id: str, failed_at: str,
                   now: float) -> bool:
    """Resume one failed instance as ``mark_resumable`` does, only if it still holds the failure
    counted (``completed_at`` = ``failed_at``) and is no handled child; whether it was."""
    params = {"workflow": workflow, "instance_id": instance_id, "failed_at": failed_at,
              "at": iso_utc(now)}
    if not tx.execute(RESUME_FAILURE, params).rowcount:
        return False
    # An engine that runs it takes it now, not at its next poll.
    tx.notify("signal", workflow, instance_id)
    return True


def set_traceparent(tx: Transaction, workflow: str, instance_id: str, traceparent: str) -> None:
    """Leave ``traceparent`` for the instance's next run (one idempotent statement)."""
    tx.write(SET_TRACEPARENT, {"workflow": workflow, "instance_id": instance_id,
                               "traceparent": traceparent})


#: A delayed start's (``invoke(start_at=)``) timer step's key, at seq -1 (before every step).
START_KEY = "_start"
#: A delayed start's timer step and its timer, written with the instance.
INSERT_START_STEP = ("INSERT INTO memable_steps "
                     "(workflow, instance_id, key, seq, kind, state, attempts) "
                     "VALUES (:workflow, :instance_id, '_start', -1, 'timer', 'waiting', 0)")
INSERT_START_TIMER = ("INSERT INTO memable_timers (workflow, instance_id, key, deadline) "
                      "VALUES (:workflow, :instance_id, '_start', :deadline)")

#: The statuses of an instance that a workflow timeout still cancels (it has not ended).
TIMES_OUT = "status IN ('running', 'suspended', 'queued')"
#: Armed workflow timeouts (queries repeat its terms, so either database uses this index).
TIMEOUTS_INDEX = ("CREATE INDEX IF NOT EXISTS instances_by_timeout "
                  f"ON memable_instances (timeout_at) "
                  f"WHERE timeout_at IS NOT NULL AND {TIMES_OUT}")
#: A queue's instances by their concurrency key, for its ``per_key`` count.
CONCURRENCY_KEY_INDEX = (
    "CREATE INDEX IF NOT EXISTS instances_by_concurrency_key "
    "ON memable_instances (queue, concurrency_key, status) WHERE concurrency_key IS NOT NULL"
)
#: The earliest deadline of a workflow timeout still armed (NULL: none).
NEXT_TIMEOUT = (
    f"SELECT min(timeout_at) FROM memable_instances WHERE timeout_at IS NOT NULL AND {TIMES_OUT}"
)
#: Instances whose workflow timeout passed by ``:now`` (epoch seconds), not ended yet.
DUE_TIMEOUTS = ("SELECT workflow, instance_id FROM memable_instances "
                f"WHERE timeout_at IS NOT NULL AND {TIMES_OUT} AND timeout_at <= :now "
                "ORDER BY timeout_at LIMIT 100")
#: The timeout of an instance still due at ``:now``, read in the transaction cancelling it.
STILL_DUE = (
    "SELECT timeout FROM memable_instances WHERE workflow = :workflow "
    f"AND instance_id = :instance_id AND timeout_at IS NOT NULL AND {TIMES_OUT} "
    "AND timeout_at <= :now"
)
#: What a timed-out instance (cancelled in the same transaction) says it ended by.
SET_TIMED_OUT = ("UPDATE memable_instances SET message = :message, status_message = :message "
                 "WHERE workflow = :workflow AND instance_id = :instance_id")


def any_timeout_due(tx: Transaction, now: float) -> bool:
    """Whether a workflow timeout passed by ``now`` (most looks find none: a plain read)."""
    return tx.execute(DUE_TIMEOUTS, {"now": now}).fetchone() is not None


def time_out_due(tx: Transaction, clock: Callable[[], float], at: float) -> list[TimedOut]:
    """Cancel each instance whose workflow timeout passed, at ``at`` (epoch s); due rows are
    locked as read, skipping held ones, and read again. ``clock`` is read after the store read:
    read before, a clock that went back (a frozen test's) could time out a new instance."""
    due = tx.execute(DUE_TIMEOUTS + "{skip_locked}", {"now": clock()}).fetchall()
    now = clock()
    out = []
    for workflow, instance_id in due:
        where = {"workflow": workflow, "instance_id": instance_id}
        found = tx.execute(STILL_DUE, {**where, "now": now}).fetchone()
        if found is None:
            continue
        ended = cancel_in(tx, workflow, instance_id, at)
        message = timed_out_message(float(found[0]))
        tx.execute(SET_TIMED_OUT, {**where, "message": message})
        out.append(TimedOut(workflow, instance_id, message, ended))
    return out


def due_after_read(read: list[Any],
                   clock: Callable[[], float]) -> list[tuple[str, str, str, float]]:
    """Of the timers ``read`` (workflow, id, key, deadline), those due by ``clock`` read now,
    after the store read (``time_out_due`` says why).

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
