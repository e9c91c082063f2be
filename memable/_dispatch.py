"""The queue thread: claims queued instances for the queues an engine consumes.

It knows nothing of the engine: it calls one function, ``claim()``, that
claims what the queues' limits let start now and hands it to the runner, and
answers how many seconds until a rate limit has room again (or None).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from ._clock import Clock
from ._log import log

#: Claim what may start now; seconds until a rate window has room again, or None.
Claim = Callable[[], "float | None"]


class Dispatcher(threading.Thread):
    """One named daemon thread per engine that consumes queues.

    It claims when kicked (an instance was queued, or a run here ended and
    freed a slot, or another engine said so), when a rate limit's window has
    room again, and every ``poll_interval`` seconds for what other processes
    queued or freed. A daemon for the same reason as the timer thread: what
    it does is one committed transaction at a time; ``stop()`` joins it.

    >>> from memable._clock import SYSTEM_CLOCK
    >>> looks = []
    >>> thread = Dispatcher(lambda: looks.append(1), 60.0, SYSTEM_CLOCK)
    >>> thread.start(); thread.stop()
    >>> looks
    [1]
    """

    def __init__(self, claim: Claim, poll_interval: float, clock: Clock) -> None:
        super().__init__(name="memable-queues", daemon=True)
        self._claim = claim
        self._poll_interval = poll_interval
        self._clock = clock
        # _cond guards _stopping and _kicked.
        self._cond = threading.Condition()
        self._stopping = False
        self._kicked = False

    def kick(self) -> None:
        """Something may be claimable: look now."""
        with self._cond:
            self._kicked = True
            self._cond.notify()

    def stop(self) -> None:
        """Stop the thread and wait for it to end; idempotent."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self.is_alive() and self is not threading.current_thread():
            self.join()

    def run(self) -> None:
        while True:
            with self._cond:
                if self._stopping:
                    return
                # What is queued before now, the claim below finds; what is
                # queued from now on kicks the thread again.
                self._kicked = False
            try:
                retry_in = self._claim()
            except Exception:  # e.g. the store stayed locked past its busy timeout
                log.exception("queue thread: claiming failed; trying again")
                retry_in = None
            wait = self._poll_interval if retry_in is None else min(retry_in, self._poll_interval)
            with self._cond:
                self._cond.wait_for(lambda: self._stopping or self._kicked, wait)
