"""What a poll of the store finds, written once for both stores (``:name`` parameters).

An engine's poll reaps the owners on this host whose process is gone, and
finds what is left to do: the suspended instances of its workflows that are
ready, the running ones whose owner is dead, and its own that were cancelled
or that it runs (or ran: the runner recovers those it no longer runs).
"""

from __future__ import annotations

from typing import Any

from .. import liveness
from ..rows import Look
from .execute import Execute
from .instances import LOOK_READY

LOCAL_OWNERS = (
    "SELECT id, pid, host, boot_id, pid_ns, proc_start FROM owners "
    "WHERE host = :host AND id <> :me"
)
DROP_OWNER = "DELETE FROM owners WHERE id = :me"
RUNNING_MINE = (
    "SELECT workflow, instance_id FROM instances WHERE status = 'running' AND owner = :me"
)
CANCELLED_MINE = (
    "SELECT workflow, instance_id FROM instances WHERE status = 'cancelled' AND owner = :me"
)
#: Running instances of the workflows ``{marks}`` names whose owner is not this
#: engine and is free to claim by ``{owner_free}`` (its lease ran out).
ORPHANED = """
SELECT workflow, instance_id FROM instances WHERE status = 'running'
AND (owner IS NULL OR owner <> :me) AND {owner_free} AND workflow IN ({marks})
"""


def look_around(
    execute: Execute, owner: str, workflows: list[str], *, marks: str, owner_free: str,
    params: dict[str, Any],
) -> Look:
    """Reap this host's dead owners and find what other processes left to do.

    ``marks`` names the workflows in SQL (bound by ``params``, with ``:me``
    and what ``owner_free`` needs), as each store binds a list.
    """
    me = liveness.current()
    # An owner in this PID namespace whose process is gone is dead at once.
    local = execute(LOCAL_OWNERS, {"host": me.host, "me": owner}).fetchall()
    for dead in liveness.dead_here(me, local):
        execute(DROP_OWNER, {"me": dead})
    mine = _pairs(execute(RUNNING_MINE, {"me": owner}))
    if not workflows:
        return Look(mine=mine)
    return Look(
        ready=_pairs(execute(LOOK_READY.format(marks=marks), params)),
        orphaned=_pairs(execute(ORPHANED.format(owner_free=owner_free, marks=marks), params)),
        cancelled=_pairs(execute(CANCELLED_MINE, {"me": owner})),
        mine=mine,
    )


def _pairs(cursor: Any) -> list[tuple[str, str]]:
    return [(workflow, instance_id) for workflow, instance_id in cursor.fetchall()]
