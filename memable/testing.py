"""The memable pytest plugin: a ``memable_engine`` fixture and ``advance`` for frozen clocks.

pytest loads it by itself (the ``pytest11`` entry point ``memable``); the testing guide
describes its fixtures and options. ``advance``, ``running`` and ``FrozenClock`` need
freezegun alone.

>>> from datetime import timedelta
>>> from freezegun import freeze_time
>>> from memable import Engine
>>> from memable.testing import advance, running
>>> def remind(ctx) -> str:
...     ctx.timer("cool-off:v1", timedelta(days=3))
...     return "reminded"
>>> with freeze_time("2026-01-01") as clock, running(
...     Engine.in_memory(poll_interval=60), {"remind": remind}
... ) as engine:
...     inv = engine.invoke("remind")
...     print(inv.wait(timeout=10))
...     print(advance(engine, clock, timedelta(days=2)), inv.state)
...     print(advance(engine, clock, timedelta(days=1)), inv.result(timeout=10))
suspended: timer cool-off:v1
0 suspended: timer cool-off:v1
1 reminded
"""

from __future__ import annotations

import math
import sys
import threading
from datetime import timedelta
from importlib.util import find_spec
from typing import Protocol

from . import _clock
from ._engine import access
from ._engine.engine import Engine
from ._errors import NotStarted
from ._running import running

__all__ = [
    "FrozenClock", "advance", "engine", "memable_configure", "memable_options",
    "memable_workflows", "running"]

_TimerId = tuple[str, str, str]  # (workflow, instance id, timer key)


class FrozenClock(Protocol):
    """What ``advance`` needs of a clock: the object ``freezegun.freeze_time`` yields (a
    ``FrozenDateTimeFactory``, ``TickingDateTimeFactory`` or ``StepTickTimeFactory``).

    >>> from datetime import timedelta
    >>> from freezegun import freeze_time
    >>> from memable.testing import FrozenClock
    >>> with freeze_time("2026-01-01") as frozen:
    ...     clock: FrozenClock = frozen
    ...     print(clock.tick(timedelta(hours=1)))
    2026-01-01 01:00:00
    """

    def tick(self, delta: timedelta, /) -> object:
        """Move the clock forward by ``delta``."""


def advance(engine: Engine, clock: FrozenClock, by: timedelta | float) -> int:
    """Move the frozen ``clock`` forward by ``by`` and fire the timers that fell due.

    Suspend points' deadlines, schedule ticks and workflow timeouts count as timers. ``by``
    is a ``timedelta`` or seconds, never negative (``ValueError``). Return how many timers
    fired, the timer thread's included; their runs are started, not waited for. Raise
    ``NotStarted``, without moving the clock, if ``engine`` is not started. Call it once the
    runs that arm timers have ended (see the testing guide).

    >>> from datetime import timedelta
    >>> from freezegun import freeze_time
    >>> from memable import Engine
    >>> from memable.testing import advance
    >>> def follow_up(ctx) -> str:
    ...     ctx.timer("wait:v1", timedelta(hours=1))
    ...     return "followed up"
    >>> engine = Engine.in_memory(poll_interval=60)
    >>> engine.register("follow-up", follow_up)
    >>> with freeze_time("2026-01-01 09:00") as clock, engine:
    ...     inv = engine.invoke("follow-up")
    ...     print(inv.wait(timeout=10))
    ...     print(advance(engine, clock, 59 * 60))   # seconds
    ...     print(advance(engine, clock, timedelta(minutes=1)))
    ...     print(inv.result(timeout=10))
    suspended: timer wait:v1
    0
    1
    followed up
    >>> advance(engine, clock, timedelta(seconds=-1))
    Traceback (most recent call last):
    ...
    ValueError: advance moves the clock forward only, not by -1 s
    """
    delta = _delta(by)
    if not access.started(engine):
        raise NotStarted()
    armed = _timers(engine, _live_instances(engine))
    ticks = _ticks(engine)
    _move(clock, delta)
    now = _clock.wall()
    due = {timer for timer, deadline in armed.items() if deadline <= now}
    fired = engine.fire_due_timers()
    _until_fired(engine)
    # Every timer due now is fired by now, by this call or the timer thread (firing deletes
    # its row): count those armed before. So is a tick the timer thread was firing: this
    # call's look at the schedules waited for it.
    left = _timers(engine, {(name, instance_id) for name, instance_id, _ in due})
    fired_meanwhile = len(due - set(left))
    return max(fired, fired_meanwhile + len(_ticks(engine) - ticks))


def _delta(by: timedelta | float) -> timedelta:
    """``by`` as a timedelta; refuse what is not a finite, non-negative duration."""
    if isinstance(by, timedelta):
        delta = by
    elif isinstance(by, (int, float)) and not isinstance(by, bool):
        if not math.isfinite(by):
            raise ValueError(f"advance needs a finite number of seconds, not {by!r}")
        delta = timedelta(seconds=by)
    else:
        raise TypeError(f"advance takes a timedelta or seconds, not {type(by).__name__}")
    if delta < timedelta(0):
        raise ValueError(
            f"advance moves the clock forward only, not by {delta.total_seconds():g} s")
    return delta


def _until_fired(engine: Engine, timeout: float = 10.0) -> None:
    """Wait, ``timeout`` seconds at most, until no timer is due: PostgreSQL's ``SKIP LOCKED``
    passes over those the timer thread is firing, and no commit is told of: look every 5 ms."""
    now = _clock.wall()
    store = access.store(engine)
    pause = threading.Event()
    for _ in range(int(timeout / 0.005)):
        deadline = store.next_deadline()
        if deadline is None or deadline > now:
            return
        pause.wait(0.005)


def _move(clock: FrozenClock, delta: timedelta) -> None:
    """``clock.tick(delta)``, from the time a ticking clock shows now: freezegun's
    ``TickingDateTimeFactory.tick`` moves from where it was last put; ``move_to`` does not."""
    api = sys.modules.get("freezegun.api")  # no freezegun imported: not one of its clocks
    ticking = getattr(api, "TickingDateTimeFactory", None)
    if ticking is not None and isinstance(clock, ticking):
        clock.move_to(clock() + delta)
    else:
        clock.tick(delta)


def _ticks(engine: Engine) -> set[str]:
    """The ids of the instances of the engine's schedules' ticks."""
    store = access.store(engine)
    return {row.instance_id for name in access.schedules(engine)
        for row, _ in store.list_view(None, None, schedule=name)}


def _live_instances(engine: Engine) -> set[tuple[str, str]]:
    """(workflow, id) of every instance of the engine's workflows that is not finished."""
    return {(name, instance_id) for name in access.workflows(engine)
        for instance_id, metadata in engine.list_instances(name)
        if not metadata.status.is_terminal}


def _timers(engine: Engine, instances: set[tuple[str, str]]) -> dict[_TimerId, float]:
    """The deadlines of ``instances``' timers, suspend points, retry backoffs and workflow
    timeouts (key ``_timeout``, while not ended), by (workflow, id, key)."""
    armed: dict[_TimerId, float] = {}
    store, clock = access.store(engine), access.clock(engine)
    for name, instance_id in sorted(instances):
        view = store.inspect(name, instance_id, clock.wall())
        if view is not None:  # else purged meanwhile
            armed.update({(name, instance_id, key): deadline for key, deadline in view.timers})
            row = view.instance
            if row.timeout_at is not None and row.status in ("running", "suspended", "queued"):
                armed[(name, instance_id, "_timeout")] = row.timeout_at
    return armed


if find_spec("pytest") is not None:
    # pytest finds fixtures and hooks by this module's names.
    from ._pytest_plugin import (  # noqa: F401
        engine,
        memable_configure,
        memable_engine,
        memable_options,
        memable_workflows,
        pytest_addoption,
    )
