"""The reads of a store: the API's plain reads as transaction bodies, and an operator's reads
(``OperatorReads``), in SQL both stores run through their own ``read_rows``; none writes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ..._clock import iso_utc
from ..._records import StepRecord
from ..rows import (
    UNREACHED,
    InstanceRow,
    InstanceView,
    OwnerRow,
    QueueLook,
    ScheduleRow,
    StepView,
    by_name,
    instance_row,
    step_record,
)
from ..transaction import Cursor, Transaction
from . import schedules as schedules_sql
from .instances import HANDLED_CHILD, INSTANCE_COLUMNS
from .queues import HOLDS_SLOT, KEY_HOLDS, PAUSED, PAUSED_ALL, STARTS
from .queues import STATS as QUEUE_STATS

#: ``read_rows(what, sql, params)``: the rows of one read, as dicts of their columns.
ReadRows = Callable[[str, str, dict[str, Any]], list[dict[str, Any]]]

SELECT_INSTANCE = (
    f"SELECT {', '.join(INSTANCE_COLUMNS)} FROM memable_instances "
    "WHERE workflow = :workflow AND instance_id = :instance_id")
LIST_INSTANCES = (
    f"SELECT {', '.join(INSTANCE_COLUMNS)} FROM memable_instances WHERE workflow = :workflow "
    "ORDER BY created_at, instance_id")
LIST_STEPS = (
    "SELECT * FROM memable_steps WHERE workflow = :workflow AND instance_id = :instance_id "
    "ORDER BY seq")


def get_instance(tx: Transaction, workflow: str, instance_id: str) -> InstanceRow | None:
    """The instance's row, or None."""
    row = tx.execute(SELECT_INSTANCE, {"workflow": workflow, "instance_id": instance_id})
    found = row.fetchone()
    return None if found is None else instance_row(INSTANCE_COLUMNS, found)


def list_instances(tx: Transaction, workflow: str) -> list[InstanceRow]:
    """Every instance of ``workflow``, oldest first."""
    rows = tx.execute(LIST_INSTANCES, {"workflow": workflow}).fetchall()
    return [instance_row(INSTANCE_COLUMNS, row) for row in rows]


def list_steps(tx: Transaction, workflow: str, instance_id: str) -> list[StepRecord]:
    """The instance's stored keys, in the order first reached."""
    cursor = tx.execute(LIST_STEPS, {"workflow": workflow, "instance_id": instance_id})
    return [step_record(row) for row in _dicts(cursor)]


def read_rows(tx: Transaction, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The rows of one read-only query (``:name`` parameters) as dicts: a store's ``read_rows``."""
    return _dicts(tx.execute(sql, params))


def _dicts(cursor: Cursor) -> list[dict[str, Any]]:
    names = [column[0] for column in cursor.description]
    return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]


_OWNER_COLUMNS = (
    "id", "host", "pid", "heartbeat", "lease", "boot_id", "pid_ns", "proc_start", "declares")
_INSTANCE = ", ".join(f"i.{c}" for c in INSTANCE_COLUMNS)
_OWNER = ", ".join(f"o.{c} AS owner_{c}" for c in _OWNER_COLUMNS)


def _owner(row: dict[str, Any]) -> OwnerRow | None:
    if row.get("owner_id") is None:
        return None
    return by_name(OwnerRow, _OWNER_COLUMNS, (row[f"owner_{c}"] for c in _OWNER_COLUMNS))


_STEP_VIEW_COLUMNS = tuple(field.name for field in attrs.fields(StepView))


def _step_view(row: dict[str, Any]) -> StepView:
    """The ``StepView`` of a ``steps`` row: a signal stored before the run reached its key
    (seq ``UNREACHED``) has no place yet (None)."""
    return StepView(**{**row, "seq": None if row["seq"] == UNREACHED else row["seq"]})


def _instance(row: dict[str, Any]) -> InstanceRow:
    return instance_row(INSTANCE_COLUMNS, (row[c] for c in INSTANCE_COLUMNS))


def list_view(
    read: ReadRows, workflow: str | None, status: str | None, schedule: str | None = None
) -> list[tuple[InstanceRow, OwnerRow | None]]:
    """Instances, oldest first, filtered where given, with each running one's owner row."""
    where, params = [], {}
    for column, value in (("workflow", workflow), ("status", status), ("schedule", schedule)):
        if value is not None:
            where.append(f"i.{column} = :{column}")
            params[column] = value
    rows = read("list instances",
        f"SELECT {_INSTANCE}, {_OWNER} FROM memable_instances AS i "
        "LEFT JOIN memable_owners AS o ON o.id = i.owner AND i.status = 'running' "
        + (f"WHERE {' AND '.join(where)} " if where else "")
        + "ORDER BY i.created_at, i.workflow, i.instance_id", params)
    return [(_instance(row), _owner(row)) for row in rows]


def inspect(read: ReadRows, workflow: str, instance_id: str, now: float) -> InstanceView | None:
    """One instance with its owner, steps, timers, awaited signals, children and queue place."""
    where = {"workflow": workflow, "instance_id": instance_id}
    found = read("read the instance",
        f"SELECT {_INSTANCE}, {_OWNER} FROM memable_instances AS i "
        "LEFT JOIN memable_owners AS o ON o.id = i.owner "
        "WHERE i.workflow = :workflow AND i.instance_id = :instance_id", where)
    if not found:
        return None
    steps = read("read the steps",
        f"SELECT {', '.join(_STEP_VIEW_COLUMNS)} FROM memable_steps WHERE workflow = :workflow "
        "AND instance_id = :instance_id ORDER BY seq, key", where)
    timers = read("read the timers",
        "SELECT key, deadline FROM memable_timers "
        "WHERE workflow = :workflow AND instance_id = :instance_id ORDER BY deadline", where)
    children = read("read the children",
        "SELECT workflow, instance_id, status FROM memable_instances "
        "WHERE parent_workflow = :workflow AND parent_id = :instance_id "
        "ORDER BY created_at, instance_id", where)
    instance = _instance(found[0])
    return InstanceView(
        instance=instance, owner=_owner(found[0]), steps=[_step_view(step) for step in steps],
        timers=[(t["key"], float(t["deadline"])) for t in timers],
        awaiting=awaited_signals(read, workflow, instance_id),
        children=[(c["workflow"], c["instance_id"], c["status"]) for c in children],
        queue=queue_look(read, instance, now) if instance.status == "queued" else None)


def queue_look(read: ReadRows, row: InstanceRow, now: float) -> QueueLook | None:
    """Where the queued instance ``row`` stands in its queue, and who could run it, at ``now``."""
    if row.queue is None:
        return None
    where = {"queue": row.queue, "priority": row.priority or 0,
             "queued_at": row.queued_at or "", "instance_id": row.instance_id}
    ahead = read("count the instances ahead in the queue",
        "SELECT count(*) AS n FROM memable_instances WHERE queue = :queue AND status = 'queued' "
        "AND (priority < :priority OR (priority = :priority AND (queued_at < :queued_at "
        "OR (queued_at = :queued_at AND instance_id < :instance_id))))", where)
    running = read("count the queue's running instances",
        "SELECT owner, count(*) AS n FROM memable_instances "
        f"WHERE queue = :queue AND {HOLDS_SLOT} GROUP BY owner", {**where, "now": now})
    starts = read("read the queue's starts", STARTS, where)
    paused = read("read whether the queue is paused", PAUSED, where)
    key = row.concurrency_key
    key_running = None if key is None else int(read(
        "count the running instances of its concurrency key", KEY_HOLDS,
        {**where, "key": key, "now": now})[0]["n"])
    return QueueLook(
        position=int(ahead[0]["n"]) + 1, running={str(r["owner"]): int(r["n"]) for r in running},
        starts=[float(r["at"]) for r in starts], live=live_owners(read, now), now=now,
        paused=bool(paused), paused_at=paused[0]["paused_at"] if paused else None,
        key_running=key_running)


def awaited_signals(read: ReadRows, workflow: str, instance_id: str) -> list[str]:
    """The keys of the suspend points the instance waits on now (a finished instance awaits
    nothing, whatever rows its last run left waiting)."""
    rows = read("read the awaited signals",
        "SELECT s.key FROM memable_steps AS s JOIN memable_instances AS i "
        "ON i.workflow = s.workflow AND i.instance_id = s.instance_id "
        "WHERE s.workflow = :workflow AND s.instance_id = :instance_id AND s.kind = 'signal' "
        "AND s.state = 'waiting' AND i.status IN ('running', 'suspended') ORDER BY s.seq",
        {"workflow": workflow, "instance_id": instance_id})
    return [row["key"] for row in rows]


def _distinct(column: str) -> str:
    """The distinct non-null values of ``column`` of instances, in order, as a walk through an
    index (one short read per value), where ``SELECT DISTINCT`` reads every entry."""
    return (
        f"WITH RECURSIVE found(v) AS (SELECT min({column}) FROM memable_instances "
        f"WHERE {column} IS NOT NULL UNION ALL "
        f"SELECT (SELECT min({column}) FROM memable_instances "
        f"WHERE {column} > found.v) FROM found WHERE found.v IS NOT NULL) "
        f"SELECT v AS {column} FROM found WHERE v IS NOT NULL ORDER BY v")


def workflows(read: ReadRows) -> list[str]:
    """The workflow names the store has instances of."""
    rows = read("list the workflows", _distinct("workflow"), {})
    return [row["workflow"] for row in rows]


def schedules(read: ReadRows) -> list[ScheduleRow]:
    """Every schedule the store knows, by name."""
    return [ScheduleRow(**row) for row in read("list the schedules", schedules_sql.SELECT_ALL, {})]


def queue_stats(read: ReadRows, queue: str, now: float) -> tuple[int, int, str | None]:
    """(runnable, holding a slot, when the oldest runnable one became runnable) at ``now``."""
    [row] = read("read the queue's numbers", QUEUE_STATS, {"queue": queue, "now": now})
    return int(row["queued"]), int(row["running"]), row["oldest"]


def live_owners(read: ReadRows, now: float) -> list[OwnerRow]:
    """The owners whose lease has not run out at ``now``: the engines running."""
    live = read("read the live owners",
        f"SELECT {_OWNER} FROM memable_owners AS o "
        "WHERE o.heartbeat + o.lease >= :now ORDER BY o.id",
        {"now": now})
    return [owner for owner in map(_owner, live) if owner is not None]


def status_counts(read: ReadRows) -> list[tuple[str, str, int]]:
    """(workflow, status, instances) for every pair the store holds, by workflow and status: one
    pass over the index on (workflow, status, created_at, instance_id), or over the table where
    PostgreSQL's planner prefers it (the one read here that grows with the store)."""
    rows = read("count the instances by workflow and status",
        "SELECT workflow, status, count(*) AS n FROM memable_instances "
        "GROUP BY workflow, status ORDER BY workflow, status", {})
    return [(row["workflow"], row["status"], int(row["n"])) for row in rows]


def _filter(
    workflow: str | None, status: str | None, id_prefix: str | None
) -> tuple[list[str], dict[str, Any]]:
    """The WHERE terms and parameters of an operator's filter (None: not filtered by it). The id
    prefix is compared by ``substr``, not ``LIKE``, whose case rules differ between stores."""
    where: list[str] = []
    params: dict[str, Any] = {}
    for column, value in (("workflow", workflow), ("status", status)):
        if value is not None:
            where.append(f"{column} = :{column}")
            params[column] = value
    if id_prefix:
        where.append("substr(instance_id, 1, :prefix_length) = :prefix")
        params.update(prefix=id_prefix, prefix_length=len(id_prefix))
    return where, params


def instance_page(
    read: ReadRows, workflow: str | None, status: str | None, id_prefix: str | None,
    offset: int, limit: int,
) -> list[InstanceRow]:
    """One page of filtered instances, newest first: ``limit`` rows after the first ``offset``
    (an index walked backwards, stopping after ``offset + limit`` entries: no sort, no scan)."""
    where, params = _filter(workflow, status, id_prefix)
    rows = read("list a page of instances",
        f"SELECT {', '.join(INSTANCE_COLUMNS)} FROM memable_instances "
        + (f"WHERE {' AND '.join(where)} " if where else "")
        + "ORDER BY created_at DESC, workflow DESC, instance_id DESC "
        "LIMIT :limit OFFSET :offset", {**params, "limit": limit, "offset": offset})
    return [_instance(row) for row in rows]


def failed_instances(
    read: ReadRows, workflow: str | None, *, id_prefix: str | None = None,
    since: float | None = None, until: float | None = None, limit: int,
) -> list[tuple[str, str, str]]:
    """(workflow, id, when it failed, as stored) of failed instances, oldest failure first: of one
    workflow, whose id starts with ``id_prefix``, failed at or after ``since`` and at or before
    ``until`` (epoch seconds, UTC, compared with the stored ``iso_utc`` text), where given; at most
    ``limit``. A failed child whose failure was handled (``HANDLED_CHILD``) is left out: a bulk
    resume leaves it alone."""
    where, params = _filter(workflow, "failed", id_prefix)
    where.append(f"NOT {HANDLED_CHILD}")
    for bound, op in ((since, ">="), (until, "<=")):
        if bound is not None:
            name = "since" if op == ">=" else "until"
            where.append(f"completed_at {op} :{name}")
            params[name] = iso_utc(bound)
    rows = read("list failed instances",
        f"SELECT workflow, instance_id, completed_at FROM memable_instances "
        f"WHERE {' AND '.join(where)} "
        "ORDER BY completed_at, workflow, instance_id LIMIT :limit", {**params, "limit": limit})
    return [(row["workflow"], row["instance_id"], row["completed_at"]) for row in rows]


def queue_names(read: ReadRows) -> list[str]:
    """The queues the store has instances of, by name."""
    rows = read("list the queues", _distinct("queue"), {})
    return [row["queue"] for row in rows]


def paused_queues(read: ReadRows) -> dict[str, str | None]:
    """The queues stored as paused, by name, each with when it was paused."""
    rows = read("read the paused queues", PAUSED_ALL, {})
    return {row["queue"]: row["paused_at"] for row in rows}


class OperatorReads:
    """The operator reads of a store, for a store class that has ``read_rows``."""

    read_rows: ReadRows

    def list_view(
        self, workflow: str | None, status: str | None, schedule: str | None = None
    ) -> list[tuple[InstanceRow, OwnerRow | None]]:
        return list_view(self.read_rows, workflow, status, schedule)

    def inspect(self, workflow: str, instance_id: str, now: float) -> InstanceView | None:
        return inspect(self.read_rows, workflow, instance_id, now)

    def workflows(self) -> list[str]:
        return workflows(self.read_rows)

    def awaited_signals(self, workflow: str, instance_id: str) -> list[str]:
        return awaited_signals(self.read_rows, workflow, instance_id)

    def schedules(self) -> list[ScheduleRow]:
        return schedules(self.read_rows)

    def live_owners(self, now: float) -> list[OwnerRow]:
        return live_owners(self.read_rows, now)

    def queue_stats(self, queue: str, now: float) -> tuple[int, int, str | None]:
        return queue_stats(self.read_rows, queue, now)

    def status_counts(self) -> list[tuple[str, str, int]]:
        return status_counts(self.read_rows)

    def instance_page(
        self, workflow: str | None, status: str | None, id_prefix: str | None,
        offset: int, limit: int,
    ) -> list[InstanceRow]:
        return instance_page(self.read_rows, workflow, status, id_prefix, offset, limit)

    def failed_instances(
        self, workflow: str | None, *, id_prefix: str | None = None,
        since: float | None = None, until: float | None = None, limit: int,
    ) -> list[tuple[str, str, str]]:
        return failed_instances(self.read_rows, workflow, id_prefix=id_prefix, since=since,
                                until=until, limit=limit)

    def queue_names(self) -> list[str]:
        return queue_names(self.read_rows)

    def paused_queues(self) -> dict[str, str | None]:
        return paused_queues(self.read_rows)
