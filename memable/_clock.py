"""The clocks memable reads, as one object an engine is given.

``wall()`` dates timers, leases and records: it is ``time.time()``, so
freezegun moves it in tests. ``monotonic()`` measures how long a caller has
waited: it reads the OS clock directly where it can, so a frozen test still
times out. An engine reads both through its ``Clock``; a test may give it
another one (``Options.clock``) instead of patching call stacks.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import attrs

_CLOCK_MONOTONIC = getattr(time, "CLOCK_MONOTONIC", None)


def wall() -> float:
    """Seconds since the epoch, as ``time.time()`` says (frozen under freezegun)."""
    return time.time()


def monotonic() -> float:
    """Seconds on a clock that only moves forward and that freezegun does not freeze."""
    if _CLOCK_MONOTONIC is not None:
        return time.clock_gettime(_CLOCK_MONOTONIC)
    return time.monotonic()  # pragma: no cover - platforms without clock_gettime


@attrs.frozen
class Clock:
    """Where an engine reads the time: the system's clocks unless a test gives others.

    >>> clock = Clock()
    >>> clock.wall() > 1.7e9, clock.monotonic() >= 0
    (True, True)
    """

    wall: Callable[[], float] = wall
    monotonic: Callable[[], float] = monotonic


SYSTEM_CLOCK = Clock()
