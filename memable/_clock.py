"""The clocks memable reads, as one object an engine is given (``Clock``).

``wall()`` dates timers, leases and records. Every stored time comes from it as epoch seconds
(the store protocol's one type of a time), ISO 8601 in UTC in a text column (``iso_utc``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime, timezone

import attrs

_CLOCK_MONOTONIC = getattr(time, "CLOCK_MONOTONIC", None)


def wall() -> float:
    """Seconds since the epoch, as ``time.time()`` says (frozen under freezegun)."""
    return time.time()


def monotonic() -> float:
    """Seconds on a clock that only moves forward, which freezegun does not freeze (timeouts)."""
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


#: The system's clocks: an engine's default, and what operator paths with no engine name.
SYSTEM_CLOCK = Clock()


def utc(clock: Clock) -> datetime:
    """``clock``'s wall time as an aware UTC datetime: how memable dates what it stores.

    >>> utc(Clock(wall=lambda: 0.5)).isoformat()
    '1970-01-01T00:00:00.500000+00:00'
    """
    return datetime.fromtimestamp(clock.wall(), timezone.utc)


def iso_utc(seconds: float) -> str:
    """Epoch ``seconds`` as stored: ISO 8601 in UTC, with ``+00:00`` (never local time).

    >>> iso_utc(1767225600.0)
    '2026-01-01T00:00:00+00:00'
    """
    return datetime.fromtimestamp(seconds, timezone.utc).isoformat()


def epoch_seconds(text: str) -> float:
    """An ISO 8601 time with its offset as epoch seconds; ``iso_utc`` gives the text back.

    >>> epoch_seconds("2026-01-01T01:00:00+01:00")
    1767225600.0
    >>> iso_utc(epoch_seconds("2026-12-05T10:00:00.123456+00:00"))
    '2026-12-05T10:00:00.123456+00:00'
    """
    return datetime.fromisoformat(text).timestamp()


def utc_text(clock: Clock) -> str:
    """``clock``'s wall time as stored: ISO 8601 in UTC, with ``+00:00``.

    >>> utc_text(Clock(wall=lambda: 1767225600.0))
    '2026-01-01T00:00:00+00:00'
    """
    return utc(clock).isoformat()


#: Seconds an engine's wall clock may differ from its database's before it says so.
SKEW_TOLERANCE = 1.0


@attrs.define
class Skew:
    """How far an engine's wall clock is from its database server's, and when to say so.

    Leases are judged by the server's clock; timers, timeouts, delayed starts and schedule
    ticks by the engine's (so freezegun moves them on every store). ``judge`` warns when the
    two differ by more than ``SKEW_TOLERANCE`` s, then again only when the difference moved
    by more than that. Used by the heartbeating thread (and ``start`` before it) alone.

    >>> skew = Skew()
    >>> print(skew.judge(4600.0, 1000.0, 4600.2))  # doctest: +ELLIPSIS
    this engine's wall clock is +3600.0 s from the database server's (ahead): timers, ...
    >>> skew.judge(4610.0, 1010.3, 4610.1) is None   # the same, within a second
    True
    >>> print(skew.judge(4620.0, 1018.0, 4620.1))  # doctest: +ELLIPSIS
    this engine's wall clock is +3602.0 s ...
    >>> skew.judge(10.0, 10.05, 10.1) is None          # in step again: nothing to say
    True
    """

    #: The difference last said (engine minus server, seconds); None while in step.
    said: float | None = None

    def judge(self, before: float, server: float, after: float) -> str | None:
        """The WARNING, if any, for the server's clock read between ``before`` and ``after``."""
        # The server read its clock between the two: only what lies outside them differs.
        if server < before:
            difference = before - server  # the engine is ahead
        elif server > after:
            difference = after - server  # the engine is behind
        else:
            difference = 0.0
        if abs(difference) <= SKEW_TOLERANCE:
            self.said = None
            return None
        if self.said is not None and abs(difference - self.said) <= SKEW_TOLERANCE:
            return None
        self.said = difference
        return skew_message(difference)


def skew_message(difference: float) -> str:
    """What the WARNING about a wall clock ``difference`` seconds from the server's says.

    >>> print(skew_message(-90.0))  # doctest: +ELLIPSIS
    this engine's wall clock is -90.0 s from the database server's (behind): ...fire 90.0 s late...
    """
    ahead = difference > 0
    return (f"this engine's wall clock is {difference:+.1f} s from the database server's "
            f"({'ahead' if ahead else 'behind'}): timers, workflow timeouts, delayed starts "
            f"and schedule ticks are judged by this engine's clock, so they fire "
            f"{abs(difference):.1f} s {'early' if ahead else 'late'} here, while leases use "
            "the server's; keep the hosts' clocks in sync (NTP)")
