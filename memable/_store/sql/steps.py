"""A run's writes of its own steps and status: each fenced by the instance's owner.

An engine that lost the instance writes nothing, and learns so (``LostInstance``). A completed step
is never overwritten, nor a row of another kind: that is the exactly-once record."""

from __future__ import annotations

from typing import Any

from ..._clock import iso_utc
from ..._errors import key_taken
from ..._records import StatusName
from ..control import LostInstance
from ..rows import StepWrite, StoredStep, by_name, step_params
from ..transaction import Transaction

#: The instance's row, owned by this engine, kept from a takeover until commit.
OWNED_ROW = (
    "SELECT 1 FROM memable_instances WHERE workflow = :workflow AND instance_id = :instance_id "
    "AND owner = :me{for_share}")
UPSERT_STEP = f"""
INSERT INTO memable_steps (workflow, instance_id, key, seq, kind, state, result, result_type,
                   status, error, attempts, completed_at, started_at, traceback)
SELECT :workflow, :instance_id, :key, :seq, :kind, :state, :result, :result_type,
       :status, :error, 1, :completed_at, :started_at, :traceback
FROM ({OWNED_ROW}) AS owned WHERE true
ON CONFLICT (workflow, instance_id, key) DO UPDATE SET
    state = excluded.state, result = excluded.result, result_type = excluded.result_type,
    status = excluded.status, error = excluded.error, attempts = memable_steps.attempts + 1,
    completed_at = excluded.completed_at, started_at = excluded.started_at,
    traceback = excluded.traceback
WHERE memable_steps.state <> 'completed' AND memable_steps.kind = excluded.kind
"""
STORED_STEP_COLUMNS = (
    "key", "seq", "kind", "state", "result", "result_type", "status", "attempts")
SELECT_RUN_STEPS = (
    f"SELECT {', '.join(STORED_STEP_COLUMNS)} "
    "FROM memable_steps WHERE workflow = :workflow AND instance_id = :instance_id")
SELECT_STEP = SELECT_RUN_STEPS + " AND key = :key"


def stored_step(values: Any) -> StoredStep:
    """The ``StoredStep`` of a row ``SELECT_RUN_STEPS`` or ``SELECT_STEP`` read, by name."""
    return by_name(StoredStep, STORED_STEP_COLUMNS, values)

CHECK_RUN = (
    "SELECT status, owner FROM memable_instances WHERE workflow = :workflow "
    "AND instance_id = :instance_id")
_SET_STATUS = (
    "UPDATE memable_instances SET status_message = :message WHERE workflow = :workflow "
    "AND instance_id = :instance_id AND owner = :me")
_SET_IN_FLIGHT = (
    "UPDATE memable_instances SET step_key = :key, step_started = :started WHERE "
    "workflow = :workflow AND instance_id = :instance_id AND owner = :me "
    "AND status = 'running'")


def save(tx: Transaction, write: StepWrite) -> None:
    """Store ``write`` (one statement); when it matched no row, ``refused`` says why."""
    if tx.execute(UPSERT_STEP, step_params(write, tx.owner)).rowcount == 0:
        refused(tx, write)


def refused(tx: Transaction, write: StepWrite) -> None:
    """Say why a step write matched nothing: the instance is lost, or the key taken."""
    where = {"workflow": write.workflow, "instance_id": write.instance_id, "key": write.key}
    row = tx.execute(CHECK_RUN, where).fetchone()
    if row is None or row[1] != tx.owner:
        raise LostInstance(write.workflow, write.instance_id)
    found = tx.execute(SELECT_STEP, where).fetchone()
    step = None if found is None else stored_step(found)
    if step is not None and step.kind != write.kind:
        raise key_taken(write.workflow, write.instance_id, write.key, step.kind, write.kind)
    # Else the key completed meanwhile (a timer fired): that row stands.


def read(tx: Transaction, workflow: str, instance_id: str, key: str) -> StoredStep | None:
    """The stored step ``key`` of the instance, if any."""
    where = {"workflow": workflow, "instance_id": instance_id, "key": key}
    row = tx.execute(SELECT_STEP, where).fetchone()
    return None if row is None else stored_step(row)


def check_run(tx: Transaction, workflow: str, instance_id: str) -> StatusName:
    """The instance's status; ``LostInstance`` when it is not this engine's."""
    row = tx.execute(CHECK_RUN, {"workflow": workflow, "instance_id": instance_id}).fetchone()
    if row is None or row[1] != tx.owner:
        raise LostInstance(workflow, instance_id)
    return row[0]  # type: ignore[no-any-return]


def set_status(tx: Transaction, workflow: str, instance_id: str, message: str) -> None:
    """Store the run's status message; ``LostInstance`` when it is not this engine's."""
    params = {"message": message, "workflow": workflow, "instance_id": instance_id, "me": tx.owner}
    if tx.execute(_SET_STATUS, params).rowcount == 0:
        raise LostInstance(workflow, instance_id)


def record_in_flight(tx: Transaction, steps: list[tuple[str, str, str, float]]) -> None:
    """Name each ``(workflow, instance_id, key, started)`` step in flight (``started``: epoch
    seconds, UTC) on its instance, while that is still this engine's and running."""
    tx.executemany(_SET_IN_FLIGHT, [
        {"workflow": w, "instance_id": i, "key": k, "started": iso_utc(t), "me": tx.owner}
        for w, i, k, t in steps])
