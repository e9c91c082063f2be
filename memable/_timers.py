"""The timer thread: fires due timers and looks for what other processes wrote."""

from __future__ import annotations

import logging
import threading
from typing import Protocol

from . import _clock

log = logging.getLogger("memable")


class TimerHost(Protocol):
    """What the timer thread asks of its engine."""

    def _tick(self, *, poll: bool) -> float | None:
        """Fire due timers (and, with ``poll``, look at the store); return the next deadline."""


class TimerThread:
    """One named daemon thread per engine that sleeps until the earliest deadline.

    It wakes when that deadline passes, when ``armed()`` reports an earlier
    one, every ``poll_interval`` seconds to see what other processes wrote
    (their timers, signals), and when ``stop()`` is called. It is a daemon
    on purpose: it holds no work of its own (whatever it does is one
    committed transaction), so a program that forgets ``engine.stop()``
    still exits; ``stop()`` joins it.
    """

    def __init__(self, host: TimerHost, poll_interval: float) -> None:
        self._host = host
        self._poll_interval = poll_interval
        # _cond guards _stopping, _kicked and _deadline.
        self._cond = threading.Condition()
        self._stopping = False
        self._kicked = False  # an earlier deadline was armed since the last look
        self._deadline: float | None = None  # earliest known deadline, wall clock
        self._thread = threading.Thread(target=self._loop, name="memable-timers", daemon=True)

    def start(self) -> None:
        """Start the thread; its first look at the store happens at once."""
        self._thread.start()

    def armed(self, deadline: float) -> None:
        """A timer was armed with ``deadline``; wake the thread if it sleeps past it."""
        with self._cond:
            if self._deadline is None or deadline < self._deadline:
                self._deadline = deadline
                self._kicked = True
                self._cond.notify()

    def stop(self) -> None:
        """Stop the thread and wait for it to end; idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join()

    def _loop(self) -> None:
        next_poll = _clock.monotonic()
        while True:
            with self._cond:
                if self._stopping:
                    return
                # What was armed before now, the tick below reads from the store;
                # what is armed from now on kicks again (_deadline unknown).
                self._kicked = False
                self._deadline = None
            poll = _clock.monotonic() >= next_poll
            if poll:
                next_poll = _clock.monotonic() + self._poll_interval
            try:
                deadline = self._host._tick(poll=poll)
            except Exception:  # e.g. the store stayed locked past its busy timeout
                log.exception("timer thread: looking at the store failed; trying again")
                deadline = None
            with self._cond:
                self._deadline = _earliest(self._deadline, deadline)
                wait = max(0.0, next_poll - _clock.monotonic())
                if self._deadline is not None:
                    wait = min(wait, max(0.0, self._deadline - _clock.wall()))
                self._cond.wait_for(lambda: self._stopping or self._kicked, wait)


def _earliest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)
