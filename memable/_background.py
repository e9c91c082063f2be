"""The background thread: due timers, the heartbeat, polling the store, recovery.

It knows nothing of the engine: it calls one function, ``tick(poll)``, that
does the work and answers how many seconds remain until the next deadline.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._clock import Clock
from ._log import log

#: ``tick(poll)``: fire due timers (with ``poll``, also look at the store for
#: what other processes wrote); return seconds to the next deadline, or None.
Tick = Callable[[bool], "float | None"]


class BackgroundThread(threading.Thread):
    """One named daemon thread per engine that sleeps until the earliest deadline.

    It wakes when that deadline passes, when ``armed()`` reports an earlier
    one, every ``poll_interval`` seconds to see what other processes wrote
    (their timers, signals, cancels, dead owners), and when ``stop()`` is
    called. It is a daemon on purpose: it holds no work of its own (whatever
    it does is one committed transaction), so a program that forgets
    ``engine.stop()`` still exits; ``stop()`` joins it.

    freezegun gives real time to any caller with a frame of an ignored module
    (``threading`` among them) within five frames of the clock call. The
    tick reads the wall clock at least five frames of memable below
    ``threading`` (``run``, ``_loop``, ``_once``, the tick, and the reader), so
    a frozen test sees this thread keep frozen time.
    """

    def __init__(self, tick: Tick, poll_interval: float, clock: Clock) -> None:
        super().__init__(name="memable-timers", daemon=True)
        self._tick = tick
        self._poll_interval = poll_interval
        self._clock = clock
        # _cond guards _stopping, _kicked and _poll_now.
        self._cond = threading.Condition()
        self._stopping = False
        self._kicked = False  # a timer was armed since the last look
        self._poll_now = False  # another engine wrote something: poll without waiting
        self._next_poll = 0.0  # monotonic; read and written by this thread only

    def armed(self) -> None:
        """A timer was armed: wake the thread to look at the deadlines again."""
        with self._cond:
            self._kicked = True
            self._cond.notify()

    def poll_soon(self) -> None:
        """Another engine changed the store: look at it now, not at the next poll."""
        with self._cond:
            self._poll_now = True
            self._cond.notify()

    def stop(self) -> None:
        """Stop the thread and wait for it to end; idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self.is_alive() and self is not threading.current_thread():
            self.join()

    def run(self) -> None:
        self._loop()

    def _loop(self) -> None:
        self._next_poll = self._clock.monotonic()
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
            poll_now, self._poll_now = self._poll_now, False
        poll = poll_now or self._clock.monotonic() >= self._next_poll
        if poll:
            self._next_poll = self._clock.monotonic() + self._poll_interval
        try:
            until_deadline = self._tick(poll)
        except Exception:  # e.g. the store stayed locked past its busy timeout
            log.exception("timer thread: looking at the store failed; trying again")
            until_deadline = None
        with self._cond:
            wait = max(0.0, self._next_poll - self._clock.monotonic())
            if until_deadline is not None:
                wait = min(wait, max(0.0, until_deadline))
            self._cond.wait_for(lambda: self._stopping or self._kicked or self._poll_now, wait)
            return self._stopping
