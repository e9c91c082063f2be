"""Owners and leases, and what a poll of the store finds, written once for both stores.

Each engine is an owner: a row in ``owners`` with a heartbeat and a lease, both judged by the
store's clock (``{now_epoch}``: the engine's on SQLite, the server's on PostgreSQL, so hosts whose
clocks differ agree)."""

from __future__ import annotations

from typing import Any

from ..._clock import iso_utc
from .. import liveness
from ..rows import Look
from ..transaction import Cursor, Transaction
from .instances import LOOK_READY, OWNER_FREE

#: Record the owner ``:me`` alive for ``:lease`` seconds from the store's clock (a row it
#: had is renewed: its lease, what it declares); the clock it was written at.
REGISTER = """
INSERT INTO memable_owners (id, host, pid, heartbeat, lease, started_at, boot_id, pid_ns,
                            proc_start, declares)
VALUES (:me, :host, :pid, {now_epoch}, :lease, :started_at, :boot_id, :pid_ns, :proc_start,
        :declares)
ON CONFLICT (id) DO UPDATE SET heartbeat = excluded.heartbeat, lease = excluded.lease,
    declares = excluded.declares
RETURNING heartbeat
"""
#: Renew the lease of ``:me``; the clock it was renewed at, no row if its row was reaped.
HEARTBEAT = "UPDATE memable_owners SET heartbeat = {now_epoch} WHERE id = :me RETURNING heartbeat"
LOCAL_OWNERS = (
    "SELECT id, pid, host, boot_id, pid_ns, proc_start FROM memable_owners "
    "WHERE host = :host AND id <> :me")
DROP_OWNER = "DELETE FROM memable_owners WHERE id = :me"
RUNNING_MINE = (
    "SELECT workflow, instance_id FROM memable_instances WHERE status = 'running' AND owner = :me")
CANCELLED_MINE = ("SELECT workflow, instance_id FROM memable_instances "
                  "WHERE status = 'cancelled' AND owner = :me")
#: Running instances of the workflows ``{marks}`` names whose owner is not this
#: engine and is free to claim (its lease ran out by the store's clock).
_OWNER_FREE = OWNER_FREE.replace(":now", "{now_epoch}")
ORPHANED = f"""
SELECT workflow, instance_id FROM memable_instances WHERE status = 'running'
AND (owner IS NULL OR owner <> :me) AND {_OWNER_FREE} AND workflow IN ({{marks}})
"""


def register(tx: Transaction, lease: float, now: float, declares: str | None) -> float:
    """Record this engine (``tx.owner``, this process) as an owner alive for ``lease`` seconds from
    the store's clock, started at ``now``, declaring ``declares``; return the store's clock as it
    wrote the row (SQLite: ``now``)."""
    me = liveness.current()
    # Every row read: on SQLite a statement ends (and its autocommit commits) once read.
    [(heartbeat,)] = tx.execute(REGISTER, {
        "me": tx.owner, "host": me.host, "pid": me.pid, "lease": lease,
        "started_at": iso_utc(now), "boot_id": me.boot_id, "pid_ns": me.pid_ns,
        "proc_start": me.started, "declares": declares, "now": now}).fetchall()
    return float(heartbeat)


def heartbeat(tx: Transaction, now: float) -> float | None:
    """Renew this engine's lease; the store's clock as it did (``now`` on SQLite), or None if its
    row is gone (reaped while it stalled: its runs are lost already, and it registers again)."""
    rows = tx.execute(HEARTBEAT, {"me": tx.owner, "now": now}).fetchall()
    return float(rows[0][0]) if rows else None


def drop(tx: Transaction) -> None:
    """Remove this engine's owner row (at stop: it runs nothing any more)."""
    tx.execute(DROP_OWNER, {"me": tx.owner})


def look_around(tx: Transaction, workflows: list[str], now: float) -> Look:
    """Reap this host's dead owners and find what is left to do for ``workflows``: their ready
    suspended instances, their running ones whose owner is dead, and this engine's own cancelled
    and running ones (the runner recovers those it no longer runs); leases judged by the store's
    clock (``now`` on SQLite)."""
    me = liveness.current()
    # An owner in this PID namespace whose process is gone is dead at once.
    local = tx.execute(LOCAL_OWNERS, {"host": me.host, "me": tx.owner}).fetchall()
    for dead in liveness.dead_here(me, local):
        tx.execute(DROP_OWNER, {"me": dead})
    mine = _pairs(tx.execute(RUNNING_MINE, {"me": tx.owner}))
    if not workflows:
        return Look(mine=mine)
    marks = ", ".join(f":w{i}" for i in range(len(workflows)))
    params: dict[str, Any] = {f"w{i}": w for i, w in enumerate(workflows)}
    params.update(me=tx.owner, now=now)
    return Look(ready=_pairs(tx.execute(LOOK_READY.replace("{marks}", marks), params)),
        orphaned=_pairs(tx.execute(ORPHANED.replace("{marks}", marks), params)),
        cancelled=_pairs(tx.execute(CANCELLED_MINE, {"me": tx.owner})), mine=mine)


def _pairs(cursor: Cursor) -> list[tuple[str, str]]:
    return [(workflow, instance_id) for workflow, instance_id in cursor.fetchall()]
