"""The SQLite store's operations on several instances at once: cancelling an instance
with its descendants, starting children, claiming queued instances (see ``_sqlite``).

A mixin of ``SQLiteStore``, apart only to keep each module to one job.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from . import _children_sql as children_sql
from . import _queue_sql as queue_sql
from . import _sqlite_sql as sql
from ._control import LostInstance, RunCancelled
from ._errors import InstanceFinished
from ._group_commit import GroupCommit
from ._sqlite_watch import RunChecks
from ._store import Claimed, Ended, InstanceRow, StepWrite, step_params

T = TypeVar("T")


class SQLiteComposition:
    """Cancel with descendants, children and queue claims, for ``SQLiteStore``."""

    owner: str
    _checks: RunChecks | None
    _commits: GroupCommit

    def _using(self, what: str) -> Any:
        raise NotImplementedError  # SQLiteStore's

    def cancel(self, workflow: str, instance_id: str, *, now: str) -> Ended:
        def cancel_it(conn: sqlite3.Connection) -> Ended:
            status = sql.status_of(conn, workflow, instance_id)
            if status in ("completed", "cancelled"):
                raise InstanceFinished(workflow, instance_id, f"it is {status}")
            where = {"workflow": workflow, "instance_id": instance_id}
            descendants = [
                (w, i) for w, i in conn.execute(children_sql.DESCENDANTS, where).fetchall()
            ]
            # The owners stay: a run in flight stores its current step, then stops.
            for w, i in [(workflow, instance_id), *descendants]:
                conn.execute(
                    "UPDATE instances SET status = 'cancelled', message = NULL, "
                    "waiting_for = NULL, children_pending = NULL, updated_at = ?, "
                    "completed_at = ? WHERE workflow = ? AND instance_id = ?",
                    (now, now, w, i),
                )
                conn.execute("DELETE FROM timers WHERE workflow = ? AND instance_id = ?", (w, i))
            parent = conn.execute(children_sql.PARENT_OF, where).fetchone()
            wake = children_sql.settle_parent(
                conn.execute, tuple(parent), status="cancelled", message="cancelled",
                output=None, at=now,
            )
            return Ended(wake=wake, cancelled=descendants)

        return self._commits.write(
            "cancel the instance", workflow, instance_id, None, cancel_it, changes="any"
        )

    def claim_queued(
        self, queue: str, workflows: list[str], *, concurrency: int | None,
        per_process: int | None, rate: tuple[int, float] | None, clock: Callable[[], float],
        at: str,
        batch: int,
    ) -> Claimed:
        if not workflows:
            return Claimed()
        with self._using("look at the queue") as conn:
            # Most looks find nothing queued: answer those without the write lock.
            if conn.execute(queue_sql.ANY_QUEUED, {"queue": queue}).fetchone() is None:
                return Claimed()

        def take(conn: sqlite3.Connection) -> Claimed:
            claimed = queue_sql.claim(
                conn.execute, queue=queue, workflows=workflows, me=self.owner,
                concurrency=concurrency, per_process=per_process, rate=rate,
                # Read under the write lock: claims then record their starts in order.
                now=clock(), at=at,
                batch=batch, columns=sql.INSTANCE_RETURNING,
                workflow_marks=", ".join(f":w{i}" for i in range(len(workflows))),
            )
            for snapshot in claimed.snapshots:
                if self._checks is not None:
                    self._checks.claimed(snapshot.instance.workflow, snapshot.instance.instance_id)
            return claimed

        return self._commits.write("claim queued instances", None, None, None, take, changes="any")

    def queued(self, queue: str, workflows: list[str]) -> int:
        if not workflows:
            return 0
        marks = ", ".join(f":w{i}" for i in range(len(workflows)))
        params: dict[str, Any] = {f"w{i}": w for i, w in enumerate(workflows)}
        with self._using("count the queued instances") as conn:
            row = conn.execute(queue_sql.COUNT_QUEUED.format(workflows=marks),
                               {**params, "queue": queue}).fetchone()
        return int(row[0])

    def start_children(self, waits: list[StepWrite], rows: list[InstanceRow]) -> list[str]:
        if not rows:
            return []
        workflow, instance_id = waits[0].workflow, waits[0].instance_id

        def start(conn: sqlite3.Connection) -> list[str]:
            state = conn.execute(sql.CHECK_RUN, (workflow, instance_id)).fetchone()
            if state is None or state[1] != self.owner:
                raise LostInstance(workflow, instance_id)
            if state[0] != "running":
                raise RunCancelled()
            for wait in waits:
                conn.execute(sql.INSERT_WAITING, step_params(wait, self.owner))
            created = [row for row in rows if conn.execute(
                sql.INSERT_INSTANCE,
                attrs.astuple(attrs.evolve(row, owner=self.owner if row.status == "running"
                                           else None)),
            ).rowcount == 1]
            made = {row.instance_id for row in created}
            # An id that was there must be this parent's child at this key.
            children_sql.refuse_taken(
                conn.execute, rows[0].workflow, (workflow, instance_id),
                {r.instance_id: str(r.parent_key) for r in rows if r.instance_id not in made},
            )
            if self._checks is not None:
                for row in created:
                    if row.status == "running":
                        self._checks.claimed(row.workflow, row.instance_id)
            return [row.instance_id for row in created]

        return self._commits.write(
            "start the children", workflow, instance_id, waits[0].key, start, changes="none"
        )

