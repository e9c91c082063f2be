"""The timer thread: fires due timers and looks for what other processes wrote."""

from __future__ import annotations

import threading
from typing import Protocol

from . import _clock
from ._log import log


class TimerHost(Protocol):
    """What the timer thread asks of its engine."""

    def _tick(self, *, poll: bool) -> float | None:
        """Fire due timers (with ``poll``, look at the store); seconds to the next deadline."""


class TimerThread(threading.Thread):
    """One named daemon thread per engine that sleeps until the earliest deadline.

    It wakes when that deadline passes, when ``armed()`` reports an earlier
    one, every ``poll_interval`` seconds to see what other processes wrote
    (their timers, signals), and when ``stop()`` is called. It is a daemon
    on purpose: it holds no work of its own (whatever it does is one
    committed transaction), so a program that forgets ``engine.stop()``
    still exits; ``stop()`` joins it.

    freezegun gives real time to any caller with a frame of an ignored module
    (``threading`` among them) within five frames of the clock call. So the
    clock is read only deep in the host's ``_tick`` (five frames of memable
    above ``threading``: ``run``, ``_loop``, ``_once``, ``_tick``, and the
    reader), and the wait is computed from that same reading: a frozen test
    sees this thread keep frozen time.
    """

    def __init__(self, host: TimerHost, poll_interval: float) -> None:
        super().__init__(name="memable-timers", daemon=True)
        self._host = host
        self._poll_interval = poll_interval
        # _cond guards _stopping and _kicked.
        self._cond = threading.Condition()
        self._stopping = False
        self._kicked = False  # a timer was armed since the last look
        self._next_poll = 0.0  # monotonic; read and written by this thread only

    def armed(self, deadline: float) -> None:
        """A timer was armed with wall-clock ``deadline``; wake the thread to look again."""
        with self._cond:
            self._kicked = True
            self._cond.notify()

    def stop(self) -> None:
        """Stop the thread and wait for it to end; idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self.is_alive():
            self.join()

    def run(self) -> None:
        self._loop()

    def _loop(self) -> None:
        self._next_poll = _clock.monotonic()
        while not self._once():
            pass

    def _once(self) -> bool:
        """Look once, then sleep until there is reason to look again; True when stopping."""
        with self._cond:
            if self._stopping:
                return True
            # What was armed before now, the tick below reads from the store;
            # what is armed from now on kicks the thread again.
            self._kicked = False
        poll = _clock.monotonic() >= self._next_poll
        if poll:
            self._next_poll = _clock.monotonic() + self._poll_interval
        try:
            until_deadline = self._host._tick(poll=poll)
        except Exception:  # e.g. the store stayed locked past its busy timeout
            log.exception("timer thread: looking at the store failed; trying again")
            until_deadline = None
        with self._cond:
            wait = max(0.0, self._next_poll - _clock.monotonic())
            if until_deadline is not None:
                wait = min(wait, max(0.0, until_deadline))
            self._cond.wait_for(lambda: self._stopping or self._kicked, wait)
            return self._stopping
