"""The one shape of memable's background threads: look, then wait for a reason to look again.

A look that raises is logged and the loop goes on: a ``StorageError`` in one line, once for a run
of failed looks."""

from __future__ import annotations

import threading

from .._clock import Clock
from .._errors import StorageError
from .._log import log


class LoopThread(threading.Thread):
    """A named daemon thread that looks, then waits until kicked, stopped or its time is up.

    A daemon on purpose: whatever a look does is committed before it returns, so a program that
    forgets ``engine.stop()`` still exits; ``stop()`` joins it.

    >>> from memable._clock import SYSTEM_CLOCK
    >>> class Once(LoopThread):
    ...     def _look(self) -> float:
    ...         print("looked")
    ...         return 60.0
    >>> thread = Once("memable-example", "example thread: looking", SYSTEM_CLOCK)
    >>> thread.start(); thread.stop()
    looked
    """

    def __init__(self, name: str, what: str, clock: Clock) -> None:
        super().__init__(name=name, daemon=True)
        #: The thread and what a look does, for the log line of a look that failed.
        self._what = what
        self._clock = clock
        # _cond guards _stopping, _kicked and a subclass's own reasons to look.
        self._cond = threading.Condition()
        self._stopping = False
        self._kicked = False  # something to look at arrived since the last look
        self._failing = False  # the last look raised StorageError; this thread's alone

    def kick(self) -> None:
        """Look again now (a look under way finishes first)."""
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
        self._loop()

    def _loop(self) -> None:
        while not self._once():
            pass

    def _once(self) -> bool:
        """Look once, then wait until there is reason to look again; True when stopping."""
        with self._cond:
            if self._stopping:
                return True
            # What arrived before now the look below sees; what arrives later kicks it again.
            self._kicked = False
            self._taking()
        try:
            wait = self._look()
            self._failing = False
        except StorageError as exc:  # locked past its busy timeout, or unreachable
            # Once per run of failed looks; not once told to stop (the outage is logged elsewhere).
            with self._cond:
                stopping = self._stopping
            if not self._failing and not stopping:
                log.warning("%s failed; trying again (%s)", self._what, exc)
            self._failing = True
            wait = self._after_failure()
        except Exception:
            log.exception("%s failed; trying again", self._what)
            wait = self._after_failure()
        with self._cond:
            self._cond.wait_for(lambda: self._stopping or self._kicked or self._woken(), wait)
            return self._stopping

    def _look(self) -> float:
        """Do the work; return the seconds until the next look is due."""
        raise NotImplementedError

    def _after_failure(self) -> float:
        """The seconds until the next look after one that raised."""
        raise NotImplementedError

    def _taking(self) -> None:
        """Under the condition, before a look: take the thread's own reasons to look."""

    def _woken(self) -> bool:
        """Under the condition: whether a reason of the thread's own to look has arrived."""
        return False
