"""What the command line shows of a store: instances, one instance in full, schedules, queues.

Reads only, through ``OperatorStore``. The views are JSON-ready dicts (stored JSON decoded,
times as stored ISO text) that ``--json`` prints as they are. Ages and liveness are judged at
the ``clock`` each read is given."""

from __future__ import annotations

import difflib
import json
import os
from collections import Counter
from datetime import datetime, timezone
from typing import Any, NoReturn

import attrs

from ._clock import Clock, iso_utc, utc
from ._engine.targets import open_store, resolve_target
from ._errors import InstanceNotFound, StorageError, WorkflowNotFound
from ._postgres.schema import is_url
from ._queues import Declarations, QueueSpec
from ._schedules.cron import Cron, parse_tick, tick_id
from ._store import liveness as _liveness
from ._store.operator import OperatorStore
from ._store.protocol import Store
from ._store.rows import InstanceRow, OwnerRow, QueueLook, ScheduleRow
from ._store.sql.instances import duration_text

#: What ``memable list --status`` accepts: every status an instance can have.
STATUSES = ("queued", "running", "suspended", "completed", "failed", "cancelled")


def open_existing(target: str, schema: str | None = None) -> Store:
    """Open the store ``target`` names, which must exist (a tool never creates one): a file,
    or a PostgreSQL URL's ``schema``; a store in memory (``sqlite://``) is refused."""
    path = resolve_target(target)
    if path is None:
        raise StorageError(
            f"{target!r} is a store in memory, seen only by the engine that opened it: "
            "give the store's file or PostgreSQL URL")
    target = os.fspath(path)
    if not is_url(target):
        if schema is not None:
            raise StorageError(f"--schema is for a PostgreSQL URL; {target!r} is a SQLite file")
        if not os.path.exists(target):
            raise StorageError(f"no such file: {target}")
        if not os.path.isfile(target):
            raise StorageError(f"not a file: {target}")
    try:
        # Engine.open makes a store of an empty database; a tool must not.
        return open_store(target, "full", schema=schema, create=False, pool_size=2)
    except (TypeError, ValueError) as exc:  # a bad schema name
        raise StorageError(str(exc)) from None


def _decoded(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def list_instances(
    store: OperatorStore, workflow: str | None = None, status: str | None = None,
    schedule: str | None = None, *, clock: Clock,
) -> list[dict[str, Any]]:
    """Instances, oldest first, optionally of one workflow, status and schedule."""
    now = utc(clock)
    listed = []
    for row, owner in store.list_view(workflow, status, schedule):
        age = now - datetime.fromisoformat(row.created_at)
        judged = (_owner(row.owner, owner, now.timestamp())
                  if row.status == "running" and row.owner else None)
        listed.append({
            "workflow": row.workflow, "instance_id": row.instance_id, "status": row.status,
            "message": row.message, "status_message": row.status_message,
            "created_at": row.created_at,
            "updated_at": row.updated_at, "completed_at": row.completed_at,
            "schedule": row.schedule,
            "owner": None if judged is None else {
                "host": judged["host"], "pid": judged["pid"], "alive": judged["alive"],
            },
            "age_seconds": round(age.total_seconds(), 3),
        })
    return listed


def list_schedules(
    store: OperatorStore, *, clock: Clock
) -> tuple[list[dict[str, Any]], list[str]]:
    """Every schedule the store knows, by name, and a note for each whose next tick cannot be
    told here. ``engines``: how many running engines declare it (none: no tick fires)."""
    rows = store.schedules()  # before the owners: an engine stores its owner row first
    now = clock.wall()
    owners = store.live_owners(now)
    engines = Counter(name for declared in Declarations.all_of(o.declares for o in owners)
                      for name in declared.schedules)
    listed, notes = [], []
    for row in rows:
        try:
            upcoming = _next_tick(row, datetime.fromtimestamp(now, timezone.utc))
        except ValueError as exc:  # a zone this machine does not know, say
            upcoming = None
            notes.append(f"schedule {row.name!r}: no next tick: {exc}")
        listed.append({"name": row.name, "cron": row.cron, "timezone": row.timezone,
            "workflow": row.workflow, "last_tick": row.last_tick, "next_tick": upcoming,
            "since": row.since, "skipped": row.skipped, "missed": row.missed,
            "declared": row.name in engines, "engines": engines.get(row.name, 0)})
    return listed, notes


def _next_tick(row: ScheduleRow, now: datetime) -> str | None:
    """The schedule's next tick as its instance names it; ValueError if unreadable here."""
    start = now
    if row.last_tick is not None:
        start = max(start, parse_tick(row.last_tick))
    if row.since is not None:
        start = max(start, datetime.fromisoformat(row.since))
    tick = Cron.parse(row.cron, row.timezone).after(start)
    return None if tick is None else tick_id(tick)


def show_instance(
    store: OperatorStore, workflow: str, instance_id: str, *, full: bool = False, clock: Clock,
) -> dict[str, Any]:
    """One instance in full. Unless ``full``, a value longer than ``CUT`` characters of JSON
    is cut to them, and ``view["cut"]`` maps each cut value's place to its whole length."""
    now = clock.wall()
    found = store.inspect(workflow, instance_id, now)
    if found is None:
        raise_unknown(store, workflow, instance_id)
    row = found.instance
    view: dict[str, Any] = {"workflow": row.workflow, "instance_id": row.instance_id,
        "status": row.status, "message": row.message, "status_message": row.status_message,
        "waiting_for": row.waiting_for, "input": _decoded(row.input),
        "output": _decoded(row.output), "created_at": row.created_at, "updated_at": row.updated_at,
        "completed_at": row.completed_at, "traceback": row.traceback}
    steps = [attrs.asdict(step) for step in found.steps]
    for step in steps:
        start, end = step["started_at"], step["completed_at"]
        step["duration"] = None if start is None or end is None else (
            datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()
        step["result"] = _decoded(step["result"])
    view["steps"] = steps
    running = row.status == "running"
    view["owner"] = _owner(row.owner, found.owner, now) if running and row.owner else None
    done = {s["key"] for s in steps if s["state"] == "completed" and s["kind"] == "step"}
    view["in_flight"] = ({"key": row.step_key, "since": row.step_started}
                         if running and row.step_key and row.step_key not in done else None)
    view["timers"] = [{"key": key, "due": _due(deadline)} for key, deadline in found.timers]
    view["awaiting_signals"] = found.awaiting
    view["parent"] = ({"workflow": row.parent_workflow, "instance_id": row.parent_id}
        if row.parent_workflow is not None else None)
    view["children"] = [
        {"workflow": w, "instance_id": i, "status": status} for w, i, status in found.children]
    view["queue"] = None if row.queue is None else {"name": row.queue, "priority": row.priority,
        "concurrency_key": row.concurrency_key,
        **(_waiting_in(row, found.queue) if found.queue is not None else {})}
    view["timeout"] = None if row.timeout is None or row.timeout_at is None else {
        "seconds": row.timeout, "duration": duration_text(row.timeout),
        "at": iso_utc(row.timeout_at)}
    view["recovered"] = None if not row.recoveries else {"times": row.recoveries,
        "step_in_flight": row.lost_step, "lost_by": row.lost_by, "executed": _executed(steps, row)}
    view["cut"] = {} if full else _cut_large(view)
    return view


def _executed(steps: list[dict[str, Any]], row: InstanceRow) -> dict[str, Any] | None:
    """The step whose execution the last recovery lost, its executions and why, or None."""
    step = next((s for s in steps if s["key"] == row.lost_step and s["kind"] == "step"), None)
    if step is None or row.lost_by is None:
        return None
    return {"key": step["key"], "times": step["attempts"],
            "why": f"engine {row.lost_by} during it"}


def _waiting_in(row: InstanceRow, look: QueueLook) -> dict[str, Any]:
    """Where a queued instance stands and why it waits, judged by what the live engines declare."""
    queue, workflow = row.queue, row.workflow
    consumers = [(owner, declared, spec) for owner in look.live
        if (declared := Declarations.from_json(owner.declares)) is not None
        for spec in declared.queues if spec.name == queue]
    runners = [(o, spec) for o, declared, spec in consumers if workflow in declared.workflows]
    running = sum(look.running.values())
    if look.paused:
        why = (f"queue paused since {look.paused_at or '-'}: nothing of it starts until it "
               "is resumed")
    elif not consumers:
        why = f"no running engine consumes the queue {queue!r}"
    elif not runners:
        why = (f"no running engine that consumes the queue {queue!r} registers the "
               f"workflow {workflow!r}")
    else:
        why = _limit_reached(look, runners, running, row.concurrency_key) or (
            "next to start: a free slot, taken at a consuming engine's next look"
            if look.position == 1 else f"behind {look.position - 1} in the queue")
    return {"position": look.position, "running": running, "waiting_because": why}


def _limit_reached(
    look: QueueLook, runners: list[tuple[OwnerRow, QueueSpec]], running: int, key: str | None,
) -> str | None:
    """The queue's limit that keeps it (with concurrency key ``key``) from starting now."""
    spec = runners[0][1]  # declare a queue the same way everywhere
    if spec.concurrency is not None and running >= spec.concurrency:
        return f"queue full: {running} of {spec.concurrency} running"
    if spec.rate is not None:
        count, period = spec.rate
        recent = [at for at in look.starts if at > look.now - period]
        if len(recent) >= count:
            return f"rate limit: {len(recent)} started in the last {period:g} s (at most {count})"
    held = look.key_running
    if spec.per_key is not None and key is not None and (held or 0) >= spec.per_key:
        return f"concurrency key {key!r} at its limit: {held} of {spec.per_key} running"
    if all(s.per_process is not None and look.running.get(o.id, 0) >= s.per_process
           for o, s in runners):
        return "every engine that runs it is at its per_process limit"
    return None


def declared_queues(store: OperatorStore, now: float) -> dict[str, tuple[QueueSpec, int]]:
    """Each queue running engines consume: its limits (first declaration found), and how many."""
    found: dict[str, tuple[QueueSpec, int]] = {}
    for declared in Declarations.all_of(owner.declares for owner in store.live_owners(now)):
        for spec in declared.queues:
            first, consumers = found.get(spec.name, (spec, 0))
            found[spec.name] = (first, consumers + 1)
    return found


def known_queues(store: OperatorStore, *, clock: Clock) -> list[str]:
    """The queues the store knows (with instances, consumed, or paused), sorted."""
    declared = declared_queues(store, clock.wall())
    return sorted(set(store.queue_names()) | set(declared) | set(store.paused_queues()))


def list_queues(store: OperatorStore, *, clock: Clock) -> list[dict[str, Any]]:
    """Every queue ``known_queues`` names, with its counts, pause, declared limits (None: no
    running engine consumes it) and consuming engines."""
    now = clock.wall()
    declared = declared_queues(store, now)
    paused = store.paused_queues()
    listed = []
    for name in sorted(set(store.queue_names()) | set(declared) | set(paused)):
        queued, running, oldest = store.queue_stats(name, now)
        spec, engines = declared.get(name, (None, 0))
        listed.append({
            "name": name, "queued": queued, "running": running, "oldest_queued_at": oldest,
            "paused": name in paused, "paused_at": paused.get(name),
            "limits": None if spec is None else {
                "concurrency": spec.concurrency, "per_process": spec.per_process,
                "rate": None if spec.rate is None else list(spec.rate),
                "per_key": spec.per_key,
            },
            "engines": engines,
        })
    return listed


def limits_text(limits: dict[str, Any] | None) -> str:
    """A queue's limits, as ``list_queues`` gives them, as text.

    >>> limits_text({"concurrency": 2, "per_process": None, "rate": [10, 60.0], "per_key": 1})
    'concurrency 2, rate 10 per 60 s, 1 per key'
    >>> limits_text({"concurrency": None, "per_process": None, "rate": None, "per_key": None})
    'no limits'
    >>> limits_text(None)
    'no running engine consumes it'
    """
    if limits is None:
        return "no running engine consumes it"
    parts = []
    if limits["concurrency"] is not None:
        parts.append(f"concurrency {limits['concurrency']}")
    if limits["per_process"] is not None:
        parts.append(f"{limits['per_process']} per process")
    if limits["rate"] is not None:
        count, period = limits["rate"]
        parts.append(f"rate {count} per {period:g} s")
    if limits["per_key"] is not None:
        parts.append(f"{limits['per_key']} per key")
    return ", ".join(parts) or "no limits"


def _due(deadline: float) -> str:
    """A timer's deadline as ISO text; one past the calendar (an older memable took any) as
    seconds.

    >>> _due(0.0)
    '1970-01-01T00:00:00+00:00'
    >>> _due(1e12)
    '1000000000000.0 s after 1970-01-01 (past the calendar)'
    """
    try:
        return iso_utc(deadline)
    except (OverflowError, ValueError, OSError):
        return f"{deadline} s after 1970-01-01 (past the calendar)"


def _owner(owner_id: str, row: OwnerRow | None, now: float) -> dict[str, Any]:
    """Who runs the instance, alive or not: by pid if visible here, else by lease at ``now``."""
    if row is None:  # its engine stopped, or another took its instances over
        return {"id": owner_id, "host": None, "pid": None, "alive": False, "judged_by": "gone"}
    lease_ends = row.heartbeat + row.lease
    if _liveness.same_pid_space(_liveness.current(), row.host, row.boot_id, row.pid_ns):
        alive, judged_by = _liveness.pid_alive(row.pid, row.proc_start), "pid"
    else:
        alive, judged_by = now < lease_ends, "lease"
    return {"id": owner_id, "host": row.host, "pid": row.pid, "alive": alive,
        "judged_by": judged_by, "heartbeat": iso_utc(row.heartbeat),
        "lease_ends": iso_utc(lease_ends)}


CUT = 2000  # characters of a value's JSON text ``show`` prints before cutting it


def _cut_large(view: dict[str, Any]) -> dict[str, int]:
    """Cut every long value of ``view`` in place; return where, with each whole length."""
    cut: dict[str, int] = {}

    def shorten(place: str, value: Any, is_json: bool) -> Any:
        if value is None:
            return None
        text = json.dumps(value, ensure_ascii=False) if is_json else str(value)
        if len(text) <= CUT:
            return value
        cut[place] = len(text)
        return text[:CUT]

    for name in ("input", "output", "message", "status_message", "traceback"):
        view[name] = shorten(name, view[name], name in ("input", "output"))
    for i, step in enumerate(view["steps"]):
        for name in ("result", "error", "status", "traceback"):
            step[name] = shorten(f"steps[{i}].{name}", step[name], name == "result")
    return cut


def raise_unknown(store: OperatorStore, workflow: str, instance_id: str) -> NoReturn:
    """Raise InstanceNotFound, or WorkflowNotFound (with a guess) if no instance has that
    workflow; ``instance_id`` ``""``: a command about the whole workflow."""
    names = store.workflows()
    if workflow in names:
        raise InstanceNotFound(workflow, instance_id)
    why = "the store has no instance of this workflow"
    if instance_id:
        why = f"no stored instance ({why} at all)"
    raise WorkflowNotFound(workflow, why, did_you_mean(workflow, names),
        instance_id=instance_id or None)


def did_you_mean(name: str, names: list[str]) -> str:
    """``"did you mean 'x'?"`` for the closest of ``names``, or ``""``.

    >>> did_you_mean("aprove", ["approve", "ship"])
    "did you mean 'approve'?"
    """
    close = difflib.get_close_matches(name, names, n=1)
    return f"did you mean {close[0]!r}?" if close else ""
