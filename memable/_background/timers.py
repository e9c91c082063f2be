"""The timer thread (due timers, heartbeat, polls, recovery): ``tick(poll)`` does the work."""

from __future__ import annotations

from collections.abc import Callable

from .._clock import Clock
from .loop import LoopThread

#: ``tick(poll)``: fire due timers (with ``poll``, also look at the store for
#: what other processes wrote); return seconds to the next deadline, or None.
Tick = Callable[[bool], "float | None"]


class BackgroundThread(LoopThread):
    """One named daemon thread per engine that sleeps until the earliest deadline.

    It wakes when that deadline passes, when ``armed()`` reports an earlier one, every
    ``poll_interval`` seconds to see what other processes wrote, and at ``stop()``.

    freezegun gives real time to a caller within five frames of an ignored module
    (``threading``): the tick reads the wall clock deeper, so this thread keeps frozen time.

    >>> from memable._clock import SYSTEM_CLOCK
    >>> polls = []
    >>> thread = BackgroundThread(lambda poll: polls.append(poll), 60.0, SYSTEM_CLOCK)
    >>> thread.start(); thread.stop()
    >>> polls
    [True]
    """

    def __init__(self, tick: Tick, poll_interval: float, clock: Clock) -> None:
        super().__init__("memable-timers", "timer thread: looking at the store", clock)
        self._tick = tick
        self._poll_interval = poll_interval
        self._poll_now = False  # under _cond: another engine wrote something, poll now
        self._poll = False  # this look polls (taken from _poll_now); this thread's alone
        self._next_poll = 0.0  # monotonic; read and written by this thread only

    def armed(self) -> None:
        """A timer was armed: wake the thread to look at the deadlines again."""
        self.kick()

    def poll_soon(self) -> None:
        """Another engine changed the store: look at it now, not at the next poll."""
        with self._cond:
            self._poll_now = True
            self._cond.notify()

    def run(self) -> None:
        self._next_poll = self._clock.monotonic()
        self._loop()

    def _taking(self) -> None:
        self._poll, self._poll_now = self._poll_now, False

    def _woken(self) -> bool:
        return self._poll_now

    def _look(self) -> float:
        started = self._clock.monotonic()
        poll = self._poll or started >= self._next_poll
        if poll:
            self._next_poll = started + self._poll_interval
        until_deadline = self._tick(poll)
        if until_deadline is not None:  # counted from the look's start, not its end
            until_deadline -= self._clock.monotonic() - started
        return self._until_next(until_deadline)

    def _after_failure(self) -> float:
        return self._until_next(None)

    def _until_next(self, until_deadline: float | None) -> float:
        """Seconds to the next poll, or to the next deadline if that comes first."""
        wait = max(0.0, self._next_poll - self._clock.monotonic())
        if until_deadline is not None:
            wait = min(wait, max(0.0, until_deadline))
        return wait
