"""Retention: the SQL of purging finished instances in batches, shared by both stores
(``:name`` parameters; the PostgreSQL store rewrites them with ``execute.pg``).

An instance may go when it is terminal (completed, failed, cancelled), owned
by nobody (no run in flight: a run cancelled in flight stores its last step
first), completed before the cutoff, has no child that has not ended (or
whose run is still in flight), and is not the child of an instance in a run
(that run may read it, or resume it if it failed). A batch is ``:limit``
such instances, found through the index on (status, completed_at), so a
batch reads about as many rows as it deletes, however many instances are
kept; the deletes then take their timers, steps and rows by key (the
primary keys' order: workflow, then the ids of a batch as one IN list).

On SQLite the batch's transaction holds the write lock from the choice to
the commit. On PostgreSQL the chosen rows are locked (``SKIP_LOCKED``), but
the checks of children and parents read the statement's snapshot: a failed
child resumed at the very moment its parent is purged outlives the parent,
and its end then finds no parent step to settle (and writes none).
"""

from __future__ import annotations

from .execute import Execute

_TERMINAL = "('completed', 'failed', 'cancelled')"

#: The instances a batch may purge (no order: a sort would read every old one); a
#: store may append a lock clause.
PURGEABLE = f"""
SELECT i.workflow, i.instance_id FROM instances AS i
WHERE i.completed_at < :before AND i.status IN {_TERMINAL} AND i.owner IS NULL
AND NOT EXISTS (
    SELECT 1 FROM instances AS c
    WHERE c.parent_workflow = i.workflow AND c.parent_id = i.instance_id
    AND (c.status NOT IN {_TERMINAL} OR c.owner IS NOT NULL))
AND NOT (i.parent_id IS NOT NULL AND EXISTS (
    SELECT 1 FROM instances AS p
    WHERE p.workflow = i.parent_workflow AND p.instance_id = i.parent_id
    AND p.owner IS NOT NULL))
LIMIT :limit
"""
#: PostgreSQL's lock clause: the batch's rows are this transaction's until it commits,
#: and rows another transaction holds are passed over, never waited for.
SKIP_LOCKED = "FOR UPDATE OF i SKIP LOCKED"
#: Most ids one DELETE names (SQLite's oldest limit is 999 parameters a statement).
_CHUNK = 500

def purge_batch(execute: Execute, before: str, limit: int, *, lock: str = "") -> int:
    """Delete at most ``limit`` purgeable instances completed before ``before`` (ISO
    8601 text), with their timers and steps, in the caller's transaction; how many.

    Timers go first, then steps, then the rows: the order a timer's firing takes
    them in (timers, then steps), so the two never wait for each other in a ring.

    >>> import sqlite3
    >>> conn = sqlite3.connect(":memory:")
    >>> conn.executescript(
    ...     "CREATE TABLE instances (workflow, instance_id, status, owner, completed_at,"
    ...     " parent_workflow, parent_id);"
    ...     "CREATE TABLE steps (workflow, instance_id, key);"
    ...     "CREATE TABLE timers (workflow, instance_id, key);"
    ...     "INSERT INTO instances VALUES ('wf', 'old', 'completed', NULL, '2026-01-01',"
    ...     " NULL, NULL), ('wf', 'new', 'completed', NULL, '2026-03-01', NULL, NULL),"
    ...     " ('wf', 'held', 'failed', NULL, '2026-01-01', NULL, NULL),"
    ...     " ('wf', 'held/c', 'running', 'e1', NULL, 'wf', 'held');"
    ...     "INSERT INTO steps VALUES ('wf', 'old', 'a'), ('wf', 'new', 'a');") and None
    >>> purge_batch(conn.execute, "2026-02-01", 500)
    1
    >>> conn.execute("SELECT instance_id FROM instances ORDER BY 1").fetchall()
    [('held',), ('held/c',), ('new',)]
    >>> conn.execute("SELECT instance_id FROM steps").fetchall()
    [('new',)]
    >>> conn.close()
    """
    text = PURGEABLE + lock
    by_workflow: dict[str, list[str]] = {}
    for workflow, instance_id in execute(text, {"before": before, "limit": limit}).fetchall():
        by_workflow.setdefault(workflow, []).append(instance_id)
    deleted = 0
    for workflow, ids in sorted(by_workflow.items()):
        ids.sort()
        for start in range(0, len(ids), _CHUNK):
            chunk = ids[start:start + _CHUNK]
            params = {"workflow": workflow, **{f"i{n}": i for n, i in enumerate(chunk)}}
            marks = ", ".join(f":i{n}" for n in range(len(chunk)))
            where = f"WHERE workflow = :workflow AND instance_id IN ({marks})"
            execute(f"DELETE FROM timers {where}", params)
            execute(f"DELETE FROM steps {where}", params)
            deleted += int(execute(f"DELETE FROM instances {where}", params).rowcount)
    return deleted


def purge_all(execute: Execute, before: str, *, lock: str = "") -> int:
    """Delete every instance a batch may take (the same rules), completed before
    ``before``, in batches of 500 in the caller's one transaction (what ``purge`` and
    ``memable purge`` run); how many. (``purge_batch`` shows the rules; the tests
    of ``engine.purge`` run this on both stores.)
    """
    deleted = 0
    while True:
        batch = purge_batch(execute, before, _CHUNK, lock=lock)
        deleted += batch
        if batch < _CHUNK:
            return deleted
