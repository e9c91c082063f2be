"""The two clocks memable reads.

``wall()`` dates timers and records: it is ``time.time()``, so freezegun moves
it in tests. ``monotonic()`` measures how long a caller has waited: it reads
the OS clock directly where it can, so a frozen test still times out.
"""

from __future__ import annotations

import time

_CLOCK_MONOTONIC = getattr(time, "CLOCK_MONOTONIC", None)


def wall() -> float:
    """Seconds since the epoch, as ``time.time()`` says (frozen under freezegun)."""
    return time.time()


def monotonic() -> float:
    """Seconds on a clock that only moves forward and that freezegun does not freeze."""
    if _CLOCK_MONOTONIC is not None:
        return time.clock_gettime(_CLOCK_MONOTONIC)
    return time.monotonic()  # pragma: no cover - platforms without clock_gettime
