"""Retention: the thread that purges finished instances older than the engine keeps them.

A thread of its own, so a long purge never delays the timer thread (the lease's heartbeat);
one transaction per batch (``admin.purge_batches``), so a run's write waits one batch at most.
"""

from __future__ import annotations

from .._clock import Clock, iso_utc
from .._log import log
from .._store.admin import purge_batches
from .._store.operator import OperatorStore
from .loop import LoopThread

#: Longest time between looks (s): a minute's lag is nothing against a retention of hours.
EVERY = 60.0


def interval(retention: float, poll_interval: float) -> float:
    """Seconds between looks: a minute, or half the retention if shorter (an instance
    outlives it by at most half), but no more often than the engine polls.

    >>> interval(30 * 86400, 1.0), interval(10.0, 1.0), interval(0.1, 1.0)
    (60.0, 5.0, 1.0)
    """
    return min(EVERY, max(poll_interval, retention / 2))


def cutoff(now: float, retention: float) -> float | None:
    """Epoch seconds before which a finished instance goes; None before the calendar's start.

    >>> cutoff(1767225600.0, 86400.0)  # 2025-12-31T00:00:00+00:00
    1767139200.0
    >>> cutoff(0.0, 1e11) is None
    True
    """
    before = now - retention
    try:
        iso_utc(before)  # as the store compares it with ``completed_at``
    except (OverflowError, OSError, ValueError):
        return None
    return before


class Purger(LoopThread):
    """One named daemon thread per engine with a ``retention``: purges when started, then
    every ``interval(retention, poll_interval)`` seconds, or at once when kicked.

    >>> from memable._clock import SYSTEM_CLOCK
    >>> from memable._sqlite.store import SQLiteStore
    >>> store = SQLiteStore(None, "full")
    >>> thread = Purger(store, 86400.0, 1.0, SYSTEM_CLOCK)
    >>> thread.start(); thread.stop()
    >>> thread.purged
    0
    >>> store.close()
    """

    def __init__(self, store: OperatorStore, retention: float, poll_interval: float,
                 clock: Clock) -> None:
        super().__init__("memable-retention", "retention thread: purging", clock)
        self._store = store
        self._retention = retention
        self._interval = interval(retention, poll_interval)
        #: Instances this thread purged so far (read by tests; written by it alone).
        self.purged = 0

    def _look(self) -> float:
        self._purge()
        return self._interval

    def _after_failure(self) -> float:
        return self._interval

    def _purge(self) -> None:
        """Purge in batches while they come back full; log the round's count."""
        # Read here, five frames of memable below ``threading`` (see BackgroundThread).
        now = self._clock.wall()
        before = cutoff(now, self._retention)
        if before is None:
            return
        purged = 0
        try:
            for deleted in purge_batches(self._store, before, now, self._stop_asked):
                purged += deleted
        finally:
            self.purged += purged
            if purged:
                log.info("retention: purged %d finished instance%s completed before %s",
                         purged, "" if purged == 1 else "s", before)

    def _stop_asked(self) -> bool:
        with self._cond:
            return self._stopping
