"""A schedule as declared: ``engine.schedule(name, cron, workflow, ...)``, checked once (the
engine checks the workflow, queue and input against its registry)."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from .cron import Cron

CatchUp = Literal["latest", "all", "none"]
Overlap = Literal["allow", "skip"]
CATCH_UPS: tuple[CatchUp, ...] = ("latest", "all", "none")
OVERLAPS: tuple[Overlap, ...] = ("allow", "skip")
MAX_NAME = 200  # with "@YYYY-MM-DDTHH:MM:SSZ", still an instance id


def check_name(name: object) -> str:
    """A schedule name: a non-empty str of at most 200 characters, no "@", not starting "_".

    >>> check_name("nightly-report")
    'nightly-report'
    >>> check_name("a@b")
    Traceback (most recent call last):
    ...
    ValueError: name 'a@b' has an '@': a schedule's ticks are named '{name}@{tick}'
    """
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty str, not {name!r}")
    if "@" in name:
        raise ValueError(f"name {name!r} has an '@': a schedule's ticks are named "
                         "'{name}@{tick}'")
    if name.startswith("_"):
        raise ValueError(f"name {name!r} starts with '_', which is the engine's")
    if len(name) > MAX_NAME:
        raise ValueError(f"name {name[:20]!r}... is {len(name)} characters; at most {MAX_NAME}")
    return name


@attrs.frozen
class ScheduleSpec:
    """One engine's declaration of a schedule.

    >>> spec = ScheduleSpec.declare("nightly", "0 2 * * *", "report", timezone="Europe/Paris")
    >>> spec.cron.expr, spec.cron.zone, spec.catch_up, spec.overlap
    ('0 2 * * *', 'Europe/Paris', 'latest', 'allow')
    >>> ScheduleSpec.declare("nightly", "0 2 * * *", "report", catch_up="every")
    Traceback (most recent call last):
    ...
    ValueError: catch_up must be one of 'latest', 'all', 'none', not 'every'
    """

    name: str
    cron: Cron
    workflow: str
    #: Each tick's input (None: the tick itself, if the workflow takes one).
    input: Any = attrs.field(default=None, eq=False)
    queue: str | None = None
    catch_up: CatchUp = "latest"
    overlap: Overlap = "allow"

    @classmethod
    def declare(
        cls, name: object, cron: object, workflow: object, *, input: Any = None,
        timezone: object = "UTC", queue: object = None, catch_up: object = "latest",
        overlap: object = "allow",
    ) -> ScheduleSpec:
        """Check each argument; ``ValueError`` naming the one at fault."""
        name = check_name(name)
        parsed = Cron.parse(cron, timezone)
        if not isinstance(workflow, str) or not workflow:
            raise ValueError(f"workflow must be a registered workflow's name, not {workflow!r}")
        if queue is not None and (not isinstance(queue, str) or not queue):
            raise ValueError(f"queue must be a declared queue's name or None, not {queue!r}")
        if catch_up not in CATCH_UPS:
            raise ValueError(f"catch_up must be one of {', '.join(map(repr, CATCH_UPS))}, "
                             f"not {catch_up!r}")
        if overlap not in OVERLAPS:
            raise ValueError(f"overlap must be one of {', '.join(map(repr, OVERLAPS))}, "
                             f"not {overlap!r}")
        return cls(name, parsed, workflow, input, queue, catch_up, overlap)
