"""The PostgreSQL store's operations on several instances at once: cancelling an instance
with its descendants, starting children, claiming queued instances (see ``_postgres``).

A mixin of ``PostgresStore``, apart only to keep each module to one job.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg

from . import _children_sql as children_sql
from . import _postgres_sql as sql
from . import _queue_sql as queue_sql
from ._control import LostInstance, RunCancelled
from ._errors import InstanceFinished, InstanceNotFound
from ._postgres_conn import NOT_DONE, Connections
from ._postgres_listen import payload
from ._store import Claimed, Ended, InstanceRow, StepWrite, step_params


class PostgresComposition:
    """Cancel with descendants, children and queue claims, for ``PostgresStore``."""

    owner: str
    schema: str
    _db: Connections

    @staticmethod
    def _pg_execute(conn: psycopg.Connection[Any]) -> children_sql.Execute:
        """Run the shared child and queue SQL (``:name`` parameters) on ``conn``."""
        return lambda text, params: conn.execute(children_sql.pg(text), params)

    def _notify(self, conn: psycopg.Connection[Any], text: str) -> None:
        raise NotImplementedError  # PostgresStore's

    def cancel(self, workflow: str, instance_id: str, *, now: str) -> Ended:
        def cancel_it(conn: psycopg.Connection[Any]) -> Ended:
            found = conn.execute(sql.LOCK_INSTANCE, (workflow, instance_id)).fetchone()
            if found is None:
                raise InstanceNotFound(workflow, instance_id)
            if found[0] in ("completed", "cancelled"):
                raise InstanceFinished(workflow, instance_id, f"it is {found[0]}")
            execute = self._pg_execute(conn)
            where = {"workflow": workflow, "instance_id": instance_id}
            descendants = [(w, i) for w, i in execute(children_sql.DESCENDANTS, where)]
            # The owners stay: a run in flight stores its current step, then stops.
            for w, i in [(workflow, instance_id), *descendants]:
                conn.execute(sql.CANCEL, (now, now, w, i))
                conn.execute(
                    "DELETE FROM timers WHERE workflow = %s AND instance_id = %s", (w, i)
                )
                self._notify(conn, payload("cancel", self.owner, w, i))
            parent = execute(children_sql.PARENT_OF, where).fetchone()
            wake = children_sql.settle_parent(
                execute, tuple(parent), status="cancelled", message="cancelled", output=None,
                at=now, lock=children_sql.LOCK_PARENT,
            )
            if wake is not None:
                self._notify(conn, payload("signal", self.owner, *wake))
            return Ended(wake=wake, cancelled=descendants)

        def read_back(conn: psycopg.Connection[Any]) -> object:
            row = conn.execute(sql.SELECT_INSTANCE, (workflow, instance_id)).fetchone()
            found = None if row is None else InstanceRow(*row)
            done = found is not None and found.status == "cancelled" and found.updated_at == now
            return Ended() if done else NOT_DONE

        return self._db.run(
            "cancel the instance", cancel_it, workflow, instance_id, read_back=read_back
        )

    def claim_queued(
        self, queue: str, workflows: list[str], *, concurrency: int | None,
        per_process: int | None, rate: tuple[int, float] | None, clock: Callable[[], float],
        at: str,
        batch: int,
    ) -> Claimed:
        if not workflows:
            return Claimed()
        lock = f"memable-queue:{self.schema}:{queue}"

        def take(conn: psycopg.Connection[Any]) -> Claimed:
            execute = self._pg_execute(conn)
            # Most looks find nothing queued: a read answers those, without the lock.
            if execute(queue_sql.ANY_QUEUED, {"queue": queue}).fetchone() is None:
                return Claimed()
            # One claimer of the queue at a time, across every engine on the server,
            # from its count to its claim; and a rate judged by the server's clock.
            conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock,))
            server_now = conn.execute(f"SELECT {sql.NOW_EPOCH}").fetchone()
            assert server_now is not None
            return queue_sql.claim(
                execute, queue=queue, workflows=workflows, me=self.owner,
                concurrency=concurrency, per_process=per_process, rate=rate,
                now=float(server_now[0]), at=at, batch=batch, columns=sql.INSTANCE_RETURNING,
                workflow_marks="SELECT unnest(%(workflows)s::text[])",
                lock_rows=" FOR UPDATE SKIP LOCKED",
            )

        def read_back(conn: psycopg.Connection[Any]) -> object:
            # What a lost commit claimed is this engine's, running and not run here:
            # the poll's look at "mine" runs it again.
            return Claimed()

        return self._db.run("claim queued instances", take, read_back=read_back)

    def queued(self, queue: str, workflows: list[str]) -> int:
        text = children_sql.pg(queue_sql.COUNT_QUEUED.format(
            workflows="SELECT unnest(%(workflows)s::text[])"))

        def count(conn: psycopg.Connection[Any]) -> int:
            row = conn.execute(text, {"queue": queue, "workflows": workflows}).fetchone()
            return 0 if row is None else int(row[0])

        return self._db.run("count the queued instances", count, transaction=False)

    def start_children(self, waits: list[StepWrite], rows: list[InstanceRow]) -> list[str]:
        if not rows:
            return []
        workflow, instance_id = waits[0].workflow, waits[0].instance_id

        def start(conn: psycopg.Connection[Any]) -> list[str]:
            found = conn.execute(sql.LOCK_INSTANCE, (workflow, instance_id)).fetchone()
            if found is None or found[1] != self.owner:
                raise LostInstance(workflow, instance_id)
            if found[0] != "running":
                raise RunCancelled()
            with conn.cursor() as cursor:
                cursor.executemany(
                    sql.INSERT_WAITING, [step_params(wait, self.owner) for wait in waits]
                )
            ids = [row.instance_id for row in rows]
            template = rows[0]
            queued = template.status != "running"
            created = conn.execute(sql.INSERT_CHILDREN, {
                "workflow": template.workflow, "at": template.created_at,
                "owner": None if queued else self.owner, "status": template.status,
                "queue": template.queue, "priority": template.priority,
                "queued_at": template.queued_at,
                "parent_workflow": template.parent_workflow, "parent_id": template.parent_id,
                "parent_group": template.parent_group, "ids": ids,
                "inputs": [row.input for row in rows],
                "types": [row.input_type for row in rows],
                "keys": [row.parent_key for row in rows],
            }).fetchall()
            made = {child_id for (child_id,) in created}
            # An id that was there must be this parent's child at this key.
            children_sql.refuse_taken(
                self._pg_execute(conn), template.workflow, (workflow, instance_id),
                {r.instance_id: str(r.parent_key) for r in rows if r.instance_id not in made},
            )
            if created and queued:
                self._notify(conn, payload("queued", self.owner, workflow, instance_id))
            return [child_id for (child_id,) in created]

        def read_back(conn: psycopg.Connection[Any]) -> object:
            # The children a lost commit created cannot be told from ones that were
            # there: none is started here, and recovery runs them (their owner is us,
            # running, and the poll's "mine, not running here" finds them).
            return []

        return self._db.run(
            "start the children", start, workflow, instance_id, waits[0].key,
            read_back=read_back,
        )

