"""Retention: purging finished instances in batches, written once for both stores.

An instance may go when terminal, completed before the cutoff, with no run in flight or to
come (owned by nobody, or by a dead owner: a cancel keeps the owner, and an engine that died
holding a cancelled instance never clears it), no child not ended (or in a run), no parent
in a run (it may read it, or resume it if failed), and no parent waiting for it (its child
step waiting: the child's run is about to start). A batch is ``:limit`` such instances,
found through the index on (status, completed_at), so it reads about as many rows as it
deletes; the deletes go by key (workflow, then the batch's ids as one IN list).

On SQLite the batch's transaction holds the write lock from the choice to the commit. On
PostgreSQL the chosen rows are locked as chosen (``CHOOSE``), but the rules read kin in the
statement's snapshot (a run may take a failed child back, or an operator resume a failed
parent's child, just after): so the batch then share-locks those parents and children
(skipping rows others hold, keeping back instances whose kin it could not lock) and reads
the rules again in a new snapshot: until the commit, no run takes kin it judged by."""

from __future__ import annotations

from collections.abc import Iterable

from ..._clock import iso_utc
from ..transaction import Transaction

_TERMINAL = "('completed', 'failed', 'cancelled')"


def _in_a_run(row: str) -> str:
    """SQL: the instance ``row`` has a run in flight or to come: it is owned, and has not
    ended (a run of a dead owner is recovered) or its owner's lease holds by the store's
    clock (a cancelled run still storing its step)."""
    return (f"({row}.owner IS NOT NULL AND ({row}.status NOT IN {_TERMINAL} OR EXISTS ("
            f"SELECT 1 FROM memable_owners AS o WHERE o.id = {row}.owner "
            f"AND o.heartbeat + o.lease >= {{now_epoch}})))")


def purgeable(only: str = "") -> str:
    """The instances a batch may purge (no order: a sort would read every old one), with
    their parents' keys; leases judged by the store's clock (``{now_epoch}``: SQLite's
    ``:now``, the engine's wall clock; PostgreSQL's server clock), ``only`` more terms."""
    return f"""
SELECT i.workflow, i.instance_id, i.parent_workflow, i.parent_id FROM memable_instances AS i
WHERE i.completed_at < :before AND i.status IN {_TERMINAL} AND NOT {_in_a_run("i")}
{only}
AND NOT EXISTS (
    SELECT 1 FROM memable_instances AS c
    WHERE c.parent_workflow = i.workflow AND c.parent_id = i.instance_id
    AND (c.status NOT IN {_TERMINAL} OR {_in_a_run("c")}))
AND NOT (i.parent_id IS NOT NULL AND EXISTS (
    SELECT 1 FROM memable_instances AS p
    WHERE p.workflow = i.parent_workflow AND p.instance_id = i.parent_id
    AND ({_in_a_run("p")} OR (p.status NOT IN {_TERMINAL} AND EXISTS (
        SELECT 1 FROM memable_steps AS s
        WHERE s.workflow = p.workflow AND s.instance_id = p.instance_id
        AND s.key = i.parent_key AND s.kind = 'child' AND s.state = 'waiting')))))
LIMIT :limit
"""


#: A batch's choice: its rows locked until commit (PostgreSQL); rows another transaction
#: holds are passed over, not waited for (it reads one table, ``i``: the lock is of its rows).
CHOOSE = purgeable() + "{skip_locked}"
#: The children of some of one workflow's instances (``{ids}``), with their parents.
CHILDREN = (
    "SELECT c.workflow, c.instance_id, c.parent_workflow, c.parent_id FROM memable_instances AS c "
    "WHERE c.parent_workflow = :workflow AND c.parent_id IN ({ids})"
)
#: The parents of some of one workflow's instances (``{ids}``).
PARENTS = (
    "SELECT p.workflow, p.instance_id FROM memable_instances AS p "
    "WHERE (p.workflow, p.instance_id) IN (SELECT i.parent_workflow, i.parent_id "
    "FROM memable_instances AS i WHERE i.workflow = :workflow AND i.instance_id IN ({ids}))"
)
#: Most ids one statement names (SQLite's oldest limit is 999 parameters a statement).
_CHUNK = 500

Row = tuple[str, str, str | None, str | None]


def any_purgeable(tx: Transaction, before: float, now: float) -> bool:
    """Whether an instance completed before ``before`` may be purged (leases judged at ``now``
    on SQLite): most looks find none, and this one read answers them."""
    params = {"before": iso_utc(before), "limit": 1, "now": now}
    return tx.execute(purgeable(), params).fetchone() is not None


def purge_batch(tx: Transaction, before: float, limit: int, now: float) -> int:
    """Delete at most ``limit`` purgeable instances completed before ``before`` (compared as
    ``iso_utc`` text), with their timers and steps, in ``tx``; return how many.

    Leases are judged by the store's clock (``now`` on SQLite). Timers go first, then steps,
    then rows: the order a timer's firing takes them in, so the two never wait in a ring.

    >>> import sqlite3
    >>> from memable._sqlite.transaction import SQLiteTransaction
    >>> conn = sqlite3.connect(":memory:")
    >>> conn.executescript(
    ...     "CREATE TABLE memable_instances (workflow, instance_id, status, owner, completed_at,"
    ...     " parent_workflow, parent_id, parent_key);"
    ...     "CREATE TABLE memable_owners (id, heartbeat, lease);"
    ...     "CREATE TABLE memable_steps (workflow, instance_id, key, kind, state);"
    ...     "CREATE TABLE memable_timers (workflow, instance_id, key);"
    ...     "INSERT INTO memable_instances VALUES ('wf', 'old', 'completed', NULL, '2026-01-01',"
    ...     " NULL, NULL, NULL), ('wf', 'new', 'completed', NULL, '2026-03-01', NULL, NULL,"
    ...     " NULL), ('wf', 'held', 'failed', NULL, '2026-01-01', NULL, NULL, NULL),"
    ...     " ('wf', 'held/c', 'running', 'e1', NULL, 'wf', 'held', 'c'),"
    ...     " ('wf', 'dead', 'cancelled', 'e2', '2026-01-01', NULL, NULL, NULL);"
    ...     "INSERT INTO memable_owners VALUES ('e1', 100.0, 30.0), ('e2', 10.0, 30.0);"
    ...     "INSERT INTO memable_steps VALUES ('wf', 'old', 'a', 'step', 'completed'),"
    ...     " ('wf', 'new', 'a', 'step', 'completed');") and None
    >>> purge_batch(SQLiteTransaction(conn, "me"), 1769904000.0, 500, now=110.0)  # 2026-02-01
    2
    >>> conn.execute("SELECT instance_id FROM memable_instances ORDER BY 1").fetchall()
    [('held',), ('held/c',), ('new',)]
    >>> conn.execute("SELECT instance_id FROM memable_steps").fetchall()
    [('new',)]
    >>> conn.close()
    """
    params = {"before": iso_utc(before), "limit": limit, "now": now}
    chosen: list[Row] = [tuple(row) for row in tx.execute(CHOOSE, params).fetchall()]
    if tx.dialect.row_locks and chosen:
        chosen = _judged_again(tx, chosen, params)
    deleted = 0
    for workflow, ids in _by_workflow(chosen):
        where, marks = _where(workflow, ids)
        for table in ("memable_timers", "memable_steps", "memable_instances"):  # instances last
            gone = tx.execute(f"DELETE FROM {table} WHERE workflow = :workflow "
                              f"AND instance_id IN ({marks})", where).rowcount
        deleted += int(gone)
    return deleted


def _judged_again(tx: Transaction, chosen: list[Row], params: dict[str, object]) -> list[Row]:
    """Of the ``chosen`` (locked), those still purgeable in a new snapshot once their kin are
    locked too (``FOR SHARE``, skipping rows others hold: one whose kin are not all locked
    stays). One without kin is not judged again: its own row is locked (a run that would
    start a child claims it first), and PostgreSQL reads a locked row's terms again on its
    newest version. (Each statement reads one table, ``c`` or ``p``: the lock is of its rows.)"""
    rows = {(row[0], row[1]): row for row in chosen}
    kept: list[Row] = []
    share = "{share_skip_locked}"
    for workflow, ids in _by_workflow(chosen):
        where, marks = _where(workflow, ids)
        children = tx.execute(CHILDREN.format(ids=marks), where).fetchall()
        with_parent = [i for i in ids if rows[(workflow, i)][3] is not None]
        kin = {(row[2], row[3]) for row in children} | {(workflow, i) for i in with_parent}
        stay: set[tuple[str | None, str | None]] = set()
        if children:  # a child another transaction holds may be changing: keep its parent
            held = {tuple(r) for r in tx.execute(CHILDREN.format(ids=marks) + share,
                                                  where).fetchall()}
            stay |= {(row[2], row[3]) for row in children if tuple(row) not in held}
        if with_parent:  # and a parent so held: keep its child
            text = PARENTS.format(ids=marks)
            parents = {tuple(r) for r in tx.execute(text, where).fetchall()}
            held = {tuple(r) for r in tx.execute(text + share, where).fetchall()}
            stay |= {(workflow, i) for i in with_parent
                     if tuple(rows[(workflow, i)][2:]) in parents - held}
        kept.extend(rows[(workflow, i)] for i in ids if (workflow, i) not in kin)
        judged = [i for i in ids if (workflow, i) in kin and (workflow, i) not in stay]
        if not judged:
            continue
        where, marks = _where(workflow, judged)
        only = f"AND i.workflow = :workflow AND i.instance_id IN ({marks})"
        again = tx.execute(purgeable(only), {**params, **where, "limit": len(judged)})
        kept.extend(tuple(row) for row in again.fetchall())
    return kept


def _by_workflow(rows: Iterable[Row]) -> list[tuple[str, list[str]]]:
    """The ids of ``rows`` by workflow, in primary-key order, in chunks a statement may name."""
    by_workflow: dict[str, list[str]] = {}
    for workflow, instance_id, _, _ in rows:
        by_workflow.setdefault(workflow, []).append(instance_id)
    out: list[tuple[str, list[str]]] = []
    for workflow, ids in sorted(by_workflow.items()):
        ids.sort()
        out.extend((workflow, ids[start:start + _CHUNK]) for start in range(0, len(ids), _CHUNK))
    return out


def _where(workflow: str, ids: list[str]) -> tuple[dict[str, object], str]:
    """The parameters naming ``ids`` of ``workflow``, and their marks for an IN list."""
    params: dict[str, object] = {"workflow": workflow, **{f"i{n}": i for n, i in enumerate(ids)}}
    return params, ", ".join(f":i{n}" for n in range(len(ids)))
