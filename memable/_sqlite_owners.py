"""The SQLite store's owners: engines with leases, and what a poll finds (see ``_sqlite``).

A mixin of ``SQLiteStore``, apart only to keep each module to one job: the
owner rows (register, heartbeat, drop) and ``look_around``, which reaps dead
owners and finds what other processes left to do.
"""

from __future__ import annotations

import sqlite3
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from . import _liveness
from . import _sqlite_sql as sql
from ._store import Look


class SQLiteOwners:
    """Owner rows and the poll's look at the store, for ``SQLiteStore``."""

    owner: str
    _lease: float
    _declares: str | None

    def _using(
        self, what: str, workflow: str | None = None, instance_id: str | None = None,
        key: str | None = None,
    ) -> AbstractContextManager[sqlite3.Connection]:
        raise NotImplementedError  # SQLiteStore's


    def register_owner(self, lease: float, now: float, declares: str | None = None) -> None:
        me = _liveness.current()
        with self._using("register the engine as an owner") as conn:
            conn.execute(
                "INSERT OR REPLACE INTO owners (id, host, pid, heartbeat, lease, started_at, "
                "boot_id, pid_ns, proc_start, declares) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (self.owner, me.host, me.pid, now, lease,
                 datetime.fromtimestamp(now).astimezone().isoformat(),
                 me.boot_id, me.pid_ns, me.started, declares),
            )
        self._lease, self._declares = lease, declares

    def heartbeat(self, now: float) -> None:
        with self._using("renew the engine's lease") as conn:
            renewed = conn.execute(
                "UPDATE owners SET heartbeat = ? WHERE id = ?", (now, self.owner)
            ).rowcount
        if not renewed:  # reaped while stalled: come back (its runs are lost already)
            self.register_owner(self._lease, now, self._declares)

    def drop_owner(self) -> None:
        with self._using("remove the engine's owner row") as conn:
            conn.execute("DELETE FROM owners WHERE id = ?", (self.owner,))

    def look_around(self, workflows: list[str], now: float) -> Look:
        me = _liveness.current()
        with self._using("look at the store") as conn:
            # An owner in this PID namespace whose process is gone is dead at once.
            local = conn.execute(
                "SELECT id, pid, host, boot_id, pid_ns, proc_start FROM owners "
                "WHERE host = ? AND id != ?",
                (me.host, self.owner),
            ).fetchall()
            for owner_id in _liveness.dead_here(me, local):
                conn.execute("DELETE FROM owners WHERE id = ?", (owner_id,))
            mine = conn.execute(
                "SELECT workflow, instance_id FROM instances "
                "WHERE status = 'running' AND owner = ?",
                (self.owner,),
            ).fetchall()
            if not workflows:
                return Look(mine=[(w, i) for w, i in mine])
            marks = ", ".join(f":w{i}" for i in range(len(workflows)))
            params: dict[str, Any] = {f"w{i}": w for i, w in enumerate(workflows)}
            params.update(me=self.owner, now=now)
            ready = conn.execute(sql.LOOK_READY.format(marks=marks), params).fetchall()
            orphaned = conn.execute(
                "SELECT workflow, instance_id FROM instances WHERE status = 'running' "
                f"AND owner IS NOT :me AND {sql.OWNER_FREE} AND workflow IN ({marks})",
                params,
            ).fetchall()
            cancelled = conn.execute(
                "SELECT workflow, instance_id FROM instances "
                "WHERE status = 'cancelled' AND owner = :me",
                params,
            ).fetchall()
        return Look(
            ready=[(w, i) for w, i in ready],
            orphaned=[(w, i) for w, i in orphaned],
            cancelled=[(w, i) for w, i in cancelled],
            mine=[(w, i) for w, i in mine],
        )

