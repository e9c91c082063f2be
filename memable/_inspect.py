"""What the command line shows of a store: instance listings and one instance in full.

Plain reads on a store opened by ``open_existing``; nothing here writes. The
views are JSON-ready dicts (stored JSON values decoded, times as stored ISO
text) so ``--json`` prints them as they are and the tables format them.
"""

from __future__ import annotations

import difflib
import json
import os
import time
from datetime import datetime, timezone
from typing import Any, NoReturn

from . import _liveness
from ._errors import InstanceNotFound, StorageError, WorkflowNotFound
from ._sqlite import SQLiteStore

#: What ``memable list --status`` accepts: every status an instance can have.
STATUSES = ("running", "suspended", "completed", "failed", "cancelled")


def open_existing(path: str) -> SQLiteStore:
    """Open the store at ``path``, which must exist (a tool never creates one)."""
    if not os.path.exists(path):
        raise StorageError(f"no such file: {path}")
    if not os.path.isfile(path):
        raise StorageError(f"not a file: {path}")
    # Engine.open makes a store of an empty database; a tool must not.
    return SQLiteStore(path, "full", create=False)


def _decoded(text: str | None) -> Any:
    return None if text is None else json.loads(text)


def list_instances(
    store: SQLiteStore, workflow: str | None = None, status: str | None = None
) -> list[dict[str, Any]]:
    """Instances, oldest first, optionally of one workflow and in one status."""
    rows = store.read_rows(
        "list instances",
        "SELECT i.workflow, i.instance_id, i.status, i.message, i.created_at, i.updated_at, "
        "i.completed_at, o.host AS owner_host, o.pid AS owner_pid FROM instances AS i "
        "LEFT JOIN owners AS o ON o.id = i.owner AND i.status = 'running' "
        "WHERE (:workflow IS NULL OR i.workflow = :workflow) "
        "AND (:status IS NULL OR i.status = :status) "
        "ORDER BY i.created_at, i.workflow, i.instance_id",
        {"workflow": workflow, "status": status},
    )
    now = datetime.now(timezone.utc)
    for row in rows:
        host, pid = row.pop("owner_host"), row.pop("owner_pid")
        row["owner"] = None if host is None else {"host": host, "pid": pid}
        age = now - datetime.fromisoformat(row["created_at"])
        row["age_seconds"] = round(age.total_seconds(), 3)
    return rows


def _seconds_between(start: str | None, end: str | None) -> float | None:
    if start is None or end is None:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def show_instance(
    store: SQLiteStore, workflow: str, instance_id: str, *, full: bool = False
) -> dict[str, Any]:
    """One instance: its row, owner, step in flight, steps, pending timers and awaited signals.

    Values longer than ``CUT`` characters of JSON are cut unless ``full``:
    the view holds the first ``CUT`` characters of their JSON text instead,
    and ``view["cut"]`` maps each one's place to its whole length.
    """
    where = {"workflow": workflow, "instance_id": instance_id}
    found = store.read_rows(
        "read the instance",
        "SELECT workflow, instance_id, status, message, status_message, waiting_for, input, "
        "output, created_at, updated_at, completed_at, owner, step_key, step_started, "
        "traceback FROM instances WHERE workflow = :workflow AND instance_id = :instance_id",
        where,
    )
    if not found:
        raise_unknown(store, workflow, instance_id)
    view = found[0]
    view["input"] = _decoded(view["input"])
    view["output"] = _decoded(view["output"])
    steps = store.read_rows(
        "read the steps",
        "SELECT seq, key, kind, state, attempts, started_at, completed_at, status, error, "
        "result, traceback FROM steps WHERE workflow = :workflow "
        "AND instance_id = :instance_id ORDER BY seq, key",
        where,
    )
    for step in steps:
        step["duration"] = _seconds_between(step["started_at"], step["completed_at"])
        step["result"] = _decoded(step["result"])
    view["steps"] = steps
    owner_id, step_key, since = view.pop("owner"), view.pop("step_key"), view.pop("step_started")
    running = view["status"] == "running"
    view["owner"] = _owner(store, owner_id) if running and owner_id else None
    done = {s["key"] for s in steps if s["state"] == "completed" and s["kind"] == "step"}
    view["in_flight"] = (
        {"key": step_key, "since": since} if running and step_key and step_key not in done
        else None
    )
    timers = store.read_rows(
        "read the timers",
        "SELECT key, deadline FROM timers "
        "WHERE workflow = :workflow AND instance_id = :instance_id ORDER BY deadline",
        where,
    )
    view["timers"] = [{"key": t["key"], "due": _due(t["deadline"])} for t in timers]
    view["awaiting_signals"] = awaited_signals(store, workflow, instance_id)
    view["cut"] = {} if full else _cut_large(view)
    return view


def _due(deadline: float) -> str:
    """A timer's deadline as ISO text; one past the calendar (stored by an older memable,
    which took any number) as the seconds it holds.

    >>> _due(0.0)
    '1970-01-01T00:00:00+00:00'
    >>> _due(1e12)
    '1000000000000.0 s after 1970-01-01 (past the calendar)'
    """
    try:
        return datetime.fromtimestamp(deadline, timezone.utc).isoformat()
    except (OverflowError, ValueError, OSError):
        return f"{deadline} s after 1970-01-01 (past the calendar)"


def _owner(store: SQLiteStore, owner_id: str) -> dict[str, Any]:
    """Who runs the instance, and whether it lives: judged by pid where this process can
    see it (same host, boot and PID namespace), else by its lease."""
    rows = store.read_rows(
        "read the owner",
        "SELECT host, pid, heartbeat, lease, boot_id, pid_ns, proc_start FROM owners "
        "WHERE id = :id",
        {"id": owner_id},
    )
    if not rows:  # its engine stopped, or another took its instances over
        return {"id": owner_id, "host": None, "pid": None, "alive": False, "judged_by": "gone"}
    row = rows[0]
    lease_ends = row["heartbeat"] + row["lease"]
    if _liveness.same_pid_space(_liveness.current(), row["host"], row["boot_id"], row["pid_ns"]):
        alive, judged_by = _liveness.pid_alive(row["pid"], row["proc_start"]), "pid"
    else:
        alive, judged_by = time.time() < lease_ends, "lease"
    return {
        "id": owner_id, "host": row["host"], "pid": row["pid"], "alive": alive,
        "judged_by": judged_by,
        "heartbeat": datetime.fromtimestamp(row["heartbeat"], timezone.utc).isoformat(),
        "lease_ends": datetime.fromtimestamp(lease_ends, timezone.utc).isoformat(),
    }


#: Characters of a value's JSON text that ``show`` prints before cutting it.
CUT = 2000


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


def awaited_signals(store: SQLiteStore, workflow: str, instance_id: str) -> list[str]:
    """The keys of the suspend points the instance waits on now.

    A finished instance awaits nothing, whatever rows its last run left waiting.
    """
    rows = store.read_rows(
        "read the awaited signals",
        "SELECT s.key FROM steps AS s JOIN instances AS i USING (workflow, instance_id) "
        "WHERE s.workflow = :workflow AND s.instance_id = :instance_id AND s.kind = 'signal' "
        "AND s.state = 'waiting' AND i.status IN ('running', 'suspended') ORDER BY s.seq",
        {"workflow": workflow, "instance_id": instance_id},
    )
    return [row["key"] for row in rows]


def raise_unknown(store: SQLiteStore, workflow: str, instance_id: str) -> NoReturn:
    """Raise InstanceNotFound, or WorkflowNotFound (with a guess) if no instance has that
    workflow."""
    names = stored_workflows(store)
    if workflow in names:
        raise InstanceNotFound(workflow, instance_id)
    raise WorkflowNotFound(
        workflow, "the store has no instance of this workflow", did_you_mean(workflow, names)
    )


def stored_workflows(store: SQLiteStore) -> list[str]:
    """The workflow names the store has instances of."""
    rows = store.read_rows(
        "list the workflows", "SELECT DISTINCT workflow FROM instances ORDER BY workflow", {}
    )
    return [row["workflow"] for row in rows]


def did_you_mean(name: str, names: list[str]) -> str:
    """``"did you mean 'x'?"`` for the closest of ``names``, or ``""``.

    >>> did_you_mean("aprove", ["approve", "ship"])
    "did you mean 'approve'?"
    """
    close = difflib.get_close_matches(name, names, n=1)
    return f"did you mean {close[0]!r}?" if close else ""
