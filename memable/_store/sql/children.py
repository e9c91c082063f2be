"""The SQL of child instances, for both stores (``:name`` parameters).

A child's row names its parent, its step's key there and, for ``ctx.children``, the group
key. A parent suspended on a group counts in ``children_pending`` the children it waits for;
the transaction that ends a child settles the parent's step and counts it down."""

from __future__ import annotations

from typing import Any

from ..._clock import iso_utc
from ..._errors import ChildIdTaken
from ..transaction import Transaction

#: A child instance: its parent's columns, read before the parent's row is locked.
PARENT_OF = (
    "SELECT parent_workflow, parent_id, parent_key, parent_group FROM memable_instances "
    "WHERE workflow = :workflow AND instance_id = :instance_id"
)
PARENT_STEP = (
    "SELECT state FROM memable_steps WHERE workflow = :parent_workflow "
    "AND instance_id = :parent_id AND key = :parent_key AND kind = 'child'"
)
#: The child's end, written into its parent's step: its output, or its failure
#: (``result`` NULL: the parent has not been told yet; see ``TOLD``).
SETTLE_PARENT_STEP = """
UPDATE memable_steps SET state = :state, result = :result, result_type = :result_type,
    error = :error, attempts = attempts + 1, completed_at = :completed_at
WHERE workflow = :parent_workflow AND instance_id = :parent_id AND key = :parent_key
AND kind = 'child' AND state <> 'completed'
"""
TOLD = "told"  # a failed child step's result once the parent raised ChildFailed for it
COUNT_DOWN = """
UPDATE memable_instances SET children_pending = children_pending - 1
WHERE workflow = :parent_workflow AND instance_id = :parent_id AND status = 'suspended'
AND waiting_for = :parent_group AND children_pending > 0
RETURNING children_pending
"""
WAITS_ON_KEY = """
SELECT 1 FROM memable_instances WHERE workflow = :parent_workflow AND instance_id = :parent_id
AND status = 'suspended' AND waiting_for = :parent_key
"""
#: The instance and every descendant of it that has not ended (for a cascading cancel).
DESCENDANTS = """
WITH RECURSIVE family(workflow, instance_id) AS (
    SELECT workflow, instance_id FROM memable_instances
    WHERE parent_workflow = :workflow AND parent_id = :instance_id
    UNION
    SELECT i.workflow, i.instance_id FROM memable_instances AS i JOIN family AS f
    ON i.parent_workflow = f.workflow AND i.parent_id = f.instance_id)
SELECT i.workflow, i.instance_id FROM memable_instances AS i JOIN family AS f
ON i.workflow = f.workflow AND i.instance_id = f.instance_id
WHERE i.status NOT IN ('completed', 'failed', 'cancelled')
"""
#: The children of a group still waited for: keys starting ``:prefix`` (``"{group}["``, ``:n``
#: characters), compared as characters (no collation, no LIKE pattern).
PENDING_IN_GROUP = """
SELECT count(*) FROM memable_steps WHERE workflow = :workflow AND instance_id = :instance_id
AND kind = 'child' AND state = 'waiting' AND substr(key, 1, :n) = :prefix
"""


def refuse_taken(
    tx: Transaction, workflow: str, parent: tuple[str, str], keys: dict[str, str]
) -> None:
    """Raise ``ChildIdTaken`` if a child id of ``keys`` (-> the parent's key) belongs to an
    instance other than ``parent``'s child at that key (rolling back the others' creation)."""
    for child_id, key in keys.items():
        found = tx.execute(PARENT_OF, {"workflow": workflow, "instance_id": child_id}).fetchone()
        holder = None if found is None or found[0] is None else (found[0], found[1], found[2])
        if holder != (*parent, key):
            raise ChildIdTaken(parent[0], parent[1], key, workflow, holder)


def settle_parent(
    tx: Transaction, parent: tuple[Any, Any, Any, Any], *, status: str, message: str | None,
    output: tuple[str, str | None] | None, at: float,
) -> tuple[str, str] | None:
    """Write a child's end (at ``at``: epoch seconds, UTC) into its parent's step; the parent
    this made ready (told by a ``"signal"``), if any. The parent's row is locked first: a
    parent recording its suspension holds that lock while it counts what it waits for, so
    either it sees this end, or this end sees it suspended."""
    parent_workflow, parent_id, parent_key, parent_group = parent
    if parent_workflow is None or status not in ("completed", "failed", "cancelled"):
        return None
    where = {"parent_workflow": parent_workflow, "parent_id": parent_id,
             "parent_key": parent_key, "parent_group": parent_group}
    tx.lock_instance(parent_workflow, parent_id)
    before = tx.execute(PARENT_STEP, where).fetchone()
    if before is None or before[0] == "completed":
        return None
    text, tag = output if output is not None else (None, None)
    done = status == "completed"
    tx.execute(SETTLE_PARENT_STEP, {**where, "state": "completed" if done else "failed",
        "result": text if done else None, "result_type": tag if done else None,
        "completed_at": iso_utc(at) if done else None,
        "error": None if done else (message or status)})
    if before[0] != "waiting":
        return None
    if parent_group is not None:
        left = tx.execute(COUNT_DOWN, where).fetchone()
        ready = left is not None and left[0] == 0
    else:
        ready = tx.execute(WAITS_ON_KEY, where).fetchone() is not None
    if not ready:
        return None
    tx.notify("signal", parent_workflow, parent_id)
    return (parent_workflow, parent_id)
