"""The memable pytest plugin: a ``memable_engine`` fixture and ``advance`` for frozen clocks.

pytest loads this module by itself once memable is installed (the ``pytest11``
entry point ``memable``). It gives every test suite three fixtures:

- ``memable_workflows``: the workflows the ``memable_engine`` fixture registers, by
  name; ``{}`` unless a conftest overrides it.
- ``memable_options``: the keyword options of ``Engine.in_memory``; ``{}``
  unless overridden (e.g. ``{"poll_interval": 60}``).
- ``memable_engine``: an in-memory ``Engine`` with those workflows, started. At
  teardown it is drained (``wait_all``) and closed, and a thread named
  ``memable...`` that the test started and that outlived it fails the test.

and two functions: ``advance(engine, clock, by)`` moves a freezegun clock and
fires the timers that fell due, and ``running(engine, workflows)`` does for an
engine of your own (a file-backed one, say) what the ``memable_engine`` fixture
does. The fixture's old name, ``engine``, works for one more release and warns.
The ini option ``memable_thread_timeout`` (seconds, 10 by default) bounds how
long teardown waits for the threads of timed-out steps to end. ``advance``,
``running`` and ``FrozenClock`` need freezegun alone: without pytest this
module imports, without the fixtures (``running`` then fails a leak with
``AssertionError``).

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
    "FrozenClock",
    "advance",
    "engine",
    "memable_configure",
    "memable_options",
    "memable_workflows",
    "running",
]

_TimerId = tuple[str, str, str]  # (workflow, instance id, timer key)


class FrozenClock(Protocol):
    """What ``advance`` needs of a clock: the object ``freezegun.freeze_time`` yields.

    That is a ``FrozenDateTimeFactory`` (the default, ``tick=False``), a
    ``TickingDateTimeFactory`` (``tick=True``) or a ``StepTickTimeFactory``
    (``auto_tick_seconds``); each has ``tick(delta)``.

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


# ---------------------------------------------------------------------- helpers


def advance(engine: Engine, clock: FrozenClock, by: timedelta | float) -> int:
    """Move the frozen ``clock`` forward by ``by`` and fire the timers that fell due.

    Suspend points' deadlines (``ctx.suspend(key, timeout=...)``) count as timers,
    and so do each tick of a schedule that runs (``engine.schedule``) and each
    instance a workflow timeout cancels (``invoke(..., timeout=...)``).

    ``clock`` is what ``freezegun.freeze_time(...)`` yields (with
    ``tick=True``, it moves from the time the clock shows now); ``by`` is a
    ``timedelta`` or seconds, never negative (``ValueError``). Return how many
    timers fired. The runs they resume are started, not waited for: follow
    them with ``inv.result(timeout=...)`` or ``inv.wait(timeout=...)``. Raise
    ``NotStarted``, without moving the clock, if ``engine`` is not started.

    The engine's timer thread may fire a due timer itself the moment the
    clock moves (it looks at the store every ``poll_interval``, and when a
    timer is armed). Those count too, if they belong to this engine's
    workflows and were armed when ``advance`` was called: the number does
    not depend on which thread won. Call ``advance`` once the runs that arm
    timers have ended (``inv.wait()``): a run still going may arm one from
    the clock before or after the move.

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
    # Every timer due now is fired by now: by this call, or by the timer thread
    # (firing deletes its row). Count those that were armed before. A tick the
    # timer thread was firing has been too: this call's look at the schedules
    # waited for it.
    left = _timers(engine, {(name, instance_id) for name, instance_id, _ in due})
    fired_meanwhile = len(due - set(left))
    return max(fired, fired_meanwhile + len(_ticks(engine) - ticks))


# ---------------------------------------------------------------------- private


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
            f"advance moves the clock forward only, not by {delta.total_seconds():g} s"
        )
    return delta


def _until_fired(engine: Engine, timeout: float = 10.0) -> None:
    """Wait until no timer is due any more: another thread's firing has committed.

    A store that claims due timers with ``SKIP LOCKED`` (PostgreSQL) skips
    the ones the timer thread is firing instead of waiting for them. The
    store offers no event for another connection's commit, so this looks
    again every few milliseconds, for ``timeout`` seconds at most.
    """
    now = _clock.wall()
    store = access.store(engine)
    pause = threading.Event()
    for _ in range(int(timeout / 0.005)):
        deadline = store.next_deadline()
        if deadline is None or deadline > now:
            return
        pause.wait(0.005)


def _move(clock: FrozenClock, delta: timedelta) -> None:
    """``clock.tick(delta)``; for a ticking freezegun clock, from the time it shows now.

    freezegun's ``TickingDateTimeFactory.tick`` moves from where the clock was
    last put, dropping the time that ran since; ``move_to`` keeps it.
    """
    api = sys.modules.get("freezegun.api")  # no freezegun imported: not one of its clocks
    ticking = getattr(api, "TickingDateTimeFactory", None)
    if ticking is not None and isinstance(clock, ticking):
        clock.move_to(clock() + delta)
    else:
        clock.tick(delta)


def _ticks(engine: Engine) -> set[str]:
    """The ids of the instances of the engine's schedules' ticks."""
    store = access.store(engine)
    return {
        row.instance_id
        for name in access.schedules(engine)
        for row, _ in store.list_view(None, None, schedule=name)
    }


def _live_instances(engine: Engine) -> set[tuple[str, str]]:
    """(workflow, id) of every instance of the engine's workflows that is not finished."""
    return {
        (name, instance_id)
        for name in access.workflows(engine)
        for instance_id, metadata in engine.list_instances(name)
        if not metadata.status.is_terminal
    }


def _timers(engine: Engine, instances: set[tuple[str, str]]) -> dict[_TimerId, float]:
    """The deadline of every armed timer of ``instances`` (a timer, a suspend point's
    deadline, a retry backoff, and a workflow timeout as the key ``_timeout``, armed until
    the instance ends), by (workflow, id, key)."""
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


# The fixtures and the ini option, for pytest (which loads this module through its
# ``pytest11`` entry point). Without pytest, ``advance``, ``running`` and ``FrozenClock``
# work with freezegun alone.
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
