"""What the command line shows of a store: instance listings and one instance in full.

Plain reads on a store opened by ``open_existing``; nothing here writes. The
views are JSON-ready dicts (stored JSON values decoded, times as stored ISO
text) so ``--json`` prints them as they are and the tables format them.
"""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from typing import Any

from ._errors import InstanceNotFound, StorageError
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
    return store.read_rows(
        "list instances",
        "SELECT workflow, instance_id, status, message, created_at, updated_at, completed_at "
        "FROM instances WHERE (:workflow IS NULL OR workflow = :workflow) "
        "AND (:status IS NULL OR status = :status) "
        "ORDER BY created_at, workflow, instance_id",
        {"workflow": workflow, "status": status},
    )


def _seconds_between(start: str | None, end: str | None) -> float | None:
    if start is None or end is None:
        return None
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def show_instance(store: SQLiteStore, workflow: str, instance_id: str) -> dict[str, Any]:
    """One instance: its row, its steps in order, its pending timers and awaited signals."""
    where = {"workflow": workflow, "instance_id": instance_id}
    found = store.read_rows(
        "read the instance",
        "SELECT workflow, instance_id, status, message, waiting_for, input, output, "
        "created_at, updated_at, completed_at FROM instances "
        "WHERE workflow = :workflow AND instance_id = :instance_id",
        where,
    )
    if not found:
        raise InstanceNotFound(workflow, instance_id)
    view = found[0]
    view["input"] = _decoded(view["input"])
    view["output"] = _decoded(view["output"])
    steps = store.read_rows(
        "read the steps",
        "SELECT seq, key, kind, state, attempts, started_at, completed_at, status, error, "
        "result FROM steps WHERE workflow = :workflow AND instance_id = :instance_id "
        "ORDER BY seq, key",
        where,
    )
    for step in steps:
        step["duration"] = _seconds_between(step["started_at"], step["completed_at"])
        step["result"] = _decoded(step["result"])
    view["steps"] = steps
    timers = store.read_rows(
        "read the timers",
        "SELECT key, deadline FROM timers "
        "WHERE workflow = :workflow AND instance_id = :instance_id ORDER BY deadline",
        where,
    )
    view["timers"] = [
        {"key": t["key"], "due": datetime.fromtimestamp(t["deadline"], timezone.utc).isoformat()}
        for t in timers
    ]
    # A finished instance awaits nothing, whatever rows its last run left waiting.
    view["awaiting_signals"] = [
        s["key"] for s in steps
        if s["kind"] == "signal" and s["state"] == "waiting"
        and view["status"] in ("running", "suspended")
    ]
    return view
