"""Queues: their claims, counts and pauses, written once for both stores.

A queued instance has ``status = 'queued'``, no owner, its ``queue``, ``priority`` and
``queued_at`` (when it became runnable). A paused queue has a row in ``queue_states`` with
``paused = 1``. Claims and pauses of a queue take turns under one lock (``_lock``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..._clock import iso_utc
from ..rows import Claimed, RunSnapshot, instance_row
from ..transaction import Transaction
from .instances import INSTANCE_COLUMNS
from .steps import SELECT_RUN_STEPS, stored_step

# A cancelled instance whose run has not stopped yet (a cancel leaves the owner;
# the run's end clears it) holds its slot, unless that owner is dead (its lease ran
# out by ``:now``, or its row was reaped): nobody else clears that owner.
_CANCELLED_HOLDING = """status = 'cancelled' AND EXISTS (
    SELECT 1 FROM memable_owners WHERE memable_owners.id = memable_instances.owner
    AND memable_owners.heartbeat + memable_owners.lease >= :now)"""
#: Which of a queue's instances hold a slot, judged at ``:now`` (what ``RUNNING``
#: counts; for ``memable show``'s "why it waits").
HOLDS_SLOT = f"(status = 'running' OR ({_CANCELLED_HOLDING}))"
ANY_QUEUED = "SELECT 1 FROM memable_instances WHERE status = 'queued' AND queue = :queue LIMIT 1"
PAUSED = "SELECT paused_at FROM memable_queue_states WHERE queue = :queue AND paused = 1"
PAUSED_ALL = "SELECT queue, paused_at FROM memable_queue_states WHERE paused = 1 ORDER BY queue"
#: Pause ``:queue`` at ``:at``; a row written (rowcount 1) only if it was not paused.
PAUSE = """
INSERT INTO memable_queue_states (queue, paused, paused_at) VALUES (:queue, 1, :at)
ON CONFLICT (queue) DO UPDATE SET paused = 1, paused_at = excluded.paused_at
WHERE memable_queue_states.paused <> 1
"""
#: Resume ``:queue``; a row written (rowcount 1) only if it was paused.
RESUME = ("UPDATE memable_queue_states SET paused = 0, paused_at = NULL "
          "WHERE queue = :queue AND paused = 1")
COUNT_QUEUED = (
    "SELECT count(*) FROM memable_instances WHERE status = 'queued' AND queue = :queue "
    "AND workflow IN ({workflows}) AND NOT EXISTS ("
    "SELECT 1 FROM memable_queue_states WHERE memable_queue_states.queue = :queue AND paused = 1)")
# The slots taken (``HOLDS_SLOT``), counted as two index range reads (queue, status).
RUNNING = f"""
SELECT (SELECT count(*) FROM memable_instances WHERE queue = :queue AND status = 'running')
    + (SELECT count(*) FROM memable_instances WHERE queue = :queue AND {_CANCELLED_HOLDING})
"""
RUNNING_MINE = (
    "SELECT count(*) FROM memable_instances WHERE queue = :queue "
    "AND status IN ('running', 'cancelled') AND owner = :me")
FORGET_STARTS = "DELETE FROM memable_queue_starts WHERE queue = :queue AND at <= :since"
STARTS = "SELECT at FROM memable_queue_starts WHERE queue = :queue ORDER BY at"
#: The next ones (up to ``:n``) of ``:queue`` a claim takes, in the queue's order, each
#: locked as it is read, passing over those another transaction holds.
NEXT = """
SELECT workflow, instance_id FROM memable_instances
WHERE queue = :queue AND status = 'queued' AND workflow IN ({workflows})
ORDER BY priority, queued_at, instance_id LIMIT :n{skip_locked}
"""
#: The keys of ``:queue`` whose instances hold ``:per_key`` slots or more (``HOLDS_SLOT``, read
# as ``RUNNING`` reads them). ``count(concurrency_key)`` counts keys only, so the instances
# without one are never at a limit (and a NULL never reaches ``NOT IN``).
SATURATED_KEYS = f"""
SELECT concurrency_key FROM (
    SELECT concurrency_key FROM memable_instances WHERE queue = :queue AND status = 'running'
    UNION ALL
    SELECT concurrency_key FROM memable_instances WHERE queue = :queue AND {_CANCELLED_HOLDING}
) AS held GROUP BY concurrency_key HAVING count(concurrency_key) >= :per_key
"""
#: ``NEXT`` under a per-key limit: with each one's key, and none of a key at its limit.
NEXT_KEYED = f"""
SELECT workflow, instance_id, concurrency_key FROM memable_instances
WHERE queue = :queue AND status = 'queued' AND workflow IN ({{workflows}})
AND (concurrency_key IS NULL OR concurrency_key NOT IN ({SATURATED_KEYS}))
ORDER BY priority, queued_at, instance_id LIMIT :n{{skip_locked}}
"""
#: How many of ``:queue``'s instances with the concurrency key ``:key`` hold a slot
#: (``HOLDS_SLOT`` at ``:now``; each an index range read of (queue, key, status)).
KEY_HOLDS = f"""
SELECT (SELECT count(*) FROM memable_instances
        WHERE queue = :queue AND concurrency_key = :key AND status = 'running')
    + (SELECT count(*) FROM memable_instances
       WHERE queue = :queue AND concurrency_key = :key AND {_CANCELLED_HOLDING}) AS n
"""
TAKE = f"""
UPDATE memable_instances SET status = 'running', owner = :me, updated_at = :at, message = NULL,
    waiting_for = NULL, completed_at = NULL, traceback = NULL, step_key = NULL,
    step_started = NULL, children_pending = NULL
WHERE workflow = :workflow AND instance_id = :instance_id AND status = 'queued'
RETURNING {', '.join(INSTANCE_COLUMNS)}
"""
STARTED = "INSERT INTO memable_queue_starts (queue, at) VALUES (:queue, :now)"
#: One claimer (or pauser) of ``:queue`` at a time, across every engine on the server,
#: until the transaction ends: where the database locks rows (PostgreSQL), a claim
#: cannot lock the rows it will count before it reads them. Named by the store's schema.
LOCK_QUEUE = (
    "SELECT pg_advisory_xact_lock(hashtextextended("
    "'memable-queue:' || current_schema() || ':' || :queue, 0))")
#: Read once after a claim's lock: whether the queue is paused, and the clock the claim
#: judges by (the engine's, ``:now``, on SQLite; the server's on PostgreSQL).
_PAUSED_AND_NOW = (
    "SELECT EXISTS (SELECT 1 FROM memable_queue_states WHERE queue = :queue AND paused = 1), "
    "{now_epoch}")


def _listing(template: str, workflows: list[str]) -> tuple[str, dict[str, Any]]:
    """``template`` with marks for ``workflows`` in its ``{workflows}``, and their parameters."""
    marks = ", ".join(f":w{i}" for i in range(len(workflows)))
    return template.replace("{workflows}", marks), {f"w{i}": w for i, w in enumerate(workflows)}


def _lock(tx: Transaction, queue: str) -> None:
    """Keep every other claim and pause of ``queue`` out until ``tx`` ends (``LOCK_QUEUE``;
    SQLite's write transaction does already)."""
    for statement, params in _locking(tx, queue):
        tx.execute(statement, params)


def _locking(tx: Transaction, queue: str) -> list[tuple[str, dict[str, Any]]]:
    """The statement ``_lock`` runs, if the dialect needs one, to run first in the round trip of
    what the lock keeps."""
    return [(LOCK_QUEUE, {"queue": queue})] if tx.dialect.row_locks else []


def any_queued(tx: Transaction, queue: str) -> bool:
    """Whether ``queue`` has a queued instance (read before any lock: most looks find none)."""
    return tx.execute(ANY_QUEUED, {"queue": queue}).fetchone() is not None


def claim(
    tx: Transaction, *, queue: str, workflows: list[str], concurrency: int | None,
    per_process: int | None, rate: tuple[int, float] | None, clock: Callable[[], float], at: float,
    batch: int, per_key: int | None = None,
) -> Claimed:
    """Claim up to ``batch`` queued instances of ``queue`` (of ``workflows``) for this engine,
    within its limits, each with its steps, at ``at`` (epoch seconds, UTC); none while paused.

    One claimer of the queue at a time, from its count to its claim (``_lock``); the instances
    taken are locked as they are read, passing over any another transaction holds. The limits are
    judged by the store's clock, read once after the lock (``clock`` on SQLite); ``rate`` counts
    rows of ``queue_starts``; under ``per_key`` a key at its limit is passed over, not waited on.
    The claim commits at the store's durability: its runs act on it at once."""
    where = {"queue": queue, "me": tx.owner}
    *_, read = tx.execute_each(*_locking(tx, queue), (_PAUSED_AND_NOW, {**where, "now": clock()}))
    paused, now = read[0]
    if paused:  # nothing starts
        return Claimed()
    now = float(now)
    room = batch
    if concurrency is not None:
        held = tx.execute(RUNNING, {**where, "now": now}).fetchone()[0]
        room = min(room, concurrency - int(held))
    if per_process is not None:
        room = min(room, per_process - int(tx.execute(RUNNING_MINE, where).fetchone()[0]))
    starts: list[float] = []
    if rate is not None:
        count, period = rate
        tx.execute(FORGET_STARTS, {**where, "since": now - period})
        starts = [float(row[0]) for row in tx.execute(STARTS, where).fetchall()]
        room = min(room, count - len(starts))
    taken: list[RunSnapshot] = []

    def take(*instances: tuple[str, str]) -> None:
        """Take each of ``instances`` (the ones still queued), in one round trip."""
        if not instances:
            return
        ones = [{**where, "workflow": w, "instance_id": i, "at": iso_utc(at)}
                for w, i in instances]
        # Each one's steps are read after its take (discarded if it took none).
        reads = tx.execute_each(*[
            statement for one in ones for statement in ((TAKE, one), (SELECT_RUN_STEPS, one))])
        for row, steps in zip(reads[::2], reads[1::2], strict=True):
            if not row:
                continue
            taken.append(RunSnapshot(instance_row(INSTANCE_COLUMNS, row[0]),
                                     {s[0]: stored_step(s) for s in steps}))
            if rate is not None:  # only a rate counts starts (and forgets old ones)
                tx.execute(STARTED, {**where, "now": now})
                starts.append(now)

    text, params = _listing(NEXT, workflows)
    params.update(where, n=room, now=now, per_key=per_key)
    if room > 0 and per_key is None:
        take(*[(str(w), str(i)) for w, i in tx.execute(text, params).fetchall()])
    # Rounds: each finds the next ones of the keys below their limit, and takes each whose key
    # is still below it (counting this round's takes); a round that takes nothing ends them.
    text = _listing(NEXT_KEYED, workflows)[0]
    while per_key is not None and len(taken) < room:
        params["n"] = room - len(taken)
        found = tx.execute(text, params).fetchall()
        before = len(taken)
        for workflow, instance_id, key in found:
            if key is not None and int(tx.execute(
                    KEY_HOLDS, {**where, "key": key, "now": now}).fetchone()[0]) >= per_key:
                continue
            take((workflow, instance_id))
        if len(taken) == before:
            break
    retry_in = None
    if rate is not None and len(starts) >= rate[0]:
        # Room again once the oldest of the last ``count`` starts leaves the window.
        retry_in = max(0.0, sorted(starts)[len(starts) - rate[0]] + rate[1] - now)
    return Claimed(taken, retry_in)


def queued(tx: Transaction, queue: str, workflows: list[str]) -> int:
    """How many instances of ``workflows`` a claim of ``queue`` could take now, limits
    aside: none while it is paused."""
    if not workflows:
        return 0
    text, params = _listing(COUNT_QUEUED, workflows)
    row = tx.execute(text, {**params, "queue": queue}).fetchone()
    return 0 if row is None else int(row[0])


def set_paused(tx: Transaction, queue: str, paused: bool, at: float) -> bool:
    """Pause or resume ``queue`` (at ``at``: epoch seconds, UTC); whether that changed its state.

    Under the claims' lock (``_lock``): a claim under way commits first, and every later one reads
    the new state. A resume tells the queue's consumers (NOTIFY)."""
    _lock(tx, queue)
    text = PAUSE if paused else RESUME
    changed = tx.execute(text, {"queue": queue, "at": iso_utc(at)}).rowcount == 1
    if changed and not paused:
        tx.notify("queued", None, queue)
    return changed


#: What the queue gauges show of ``:queue``: its runnable instances, those holding a slot at
#: ``:now`` (counted as a claim counts them, ``RUNNING``), and when the oldest became runnable.
STATS = f"""
SELECT (SELECT count(*) FROM memable_instances WHERE queue = :queue AND status = 'queued')
    AS queued,
    ({RUNNING}) AS running,
    (SELECT min(queued_at) FROM memable_instances WHERE queue = :queue AND status = 'queued')
    AS oldest
"""
