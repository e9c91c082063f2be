"""What the runner's background thread does each time it looks (see ``_runner``).

A mixin of ``Runner``, apart only to keep each module to one job: fire due
timers, renew the lease, note the steps in flight, and look at the store for
what other processes wrote (signals, cancels, dead owners).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from ._errors import NotStarted
from ._log import log, where
from ._options import Options
from ._store import Claim, Store, utcnow

if TYPE_CHECKING:
    from ._clock import Clock
    from ._run import Run
    from ._workflow import Workflow


class BackgroundTick:
    """The background thread's work, for ``Runner`` (whose fields it uses, under its lock)."""

    store: Store
    options: Options
    clock: Clock
    phase: str
    workflows: dict[str, Workflow]
    _lock: threading.Lock
    _idle: threading.Condition
    _active: dict[tuple[str, str], Run]
    _firing: int
    _turnover: int
    _claiming: int
    _next_heartbeat: float

    def check_fork(self) -> None:
        raise NotImplementedError  # Runner's

    def wake(self, name: str, instance_id: str, claim: Claim = "wake") -> None:
        raise NotImplementedError  # Runner's

    def cancelled(self, name: str, instance_id: str) -> None:
        raise NotImplementedError  # Runner's


    def fire_due(self) -> int:
        """Fire the timers due now and start the runs they resume; return how many."""
        self.check_fork()
        with self._lock:
            if self.phase != "started":
                raise NotStarted(phase=self.phase)
        fired, _ = self._fire_due()
        return fired

    def _fire_due(self) -> tuple[int, float]:
        """Fire the timers due now; return how many, and the wall-clock time used."""
        with self._lock:
            self._firing += 1
        try:
            # Read here, not higher up: see BackgroundThread on freezegun.
            now = self.clock.wall()
            fired = self.store.fire_due_timers(now, utcnow().isoformat())
            for name, instance_id, key in fired:
                log.info("timer fired: %s", key, extra=where(name, instance_id, key))
                self.wake(name, instance_id)
            return len(fired), now
        finally:
            with self._lock:
                self._firing -= 1
                if not self._firing and not self._active:
                    self._idle.notify_all()

    def _tick(self, poll: bool) -> float | None:
        """Fire due timers, and look at the store; return seconds to the next deadline."""
        _, now = self._fire_due()
        if now >= self._next_heartbeat:
            self.store.heartbeat(now)
            self._next_heartbeat = now + self.options.lease / 3
            steps = [(w, i, k, t) for w, i, k, t in self.in_flight() if k and t]
            self.store.record_in_flight(steps)
        if poll:
            self._look_around(now)
        deadline = self.store.next_deadline()
        return None if deadline is None else deadline - now

    def in_flight(self) -> list[tuple[str, str, str | None, str | None]]:
        """(workflow, id, key, since) of each active run: the step it executes (None between)."""
        found: list[tuple[str, str, str | None, str | None]] = []
        with self._lock:  # also each run's flight lock
            for run in self._active.values():
                ctx = run.ctx
                now = None if ctx is None else ctx.attempts.in_flight_now()
                key, since = (None, None) if now is None else now
                found.append((run.workflow.name, run.instance_id, key, since))
        return found

    def _look_around(self, now: float) -> None:
        with self._lock:
            turnover = self._turnover
        look = self.store.look_around(sorted(self.workflows), now)
        for name, instance_id in look.ready:
            self.wake(name, instance_id)
        if self.options.recover:
            for name, instance_id in look.orphaned:
                # Logged by the run that wins the claim: every engine sees it.
                self.wake(name, instance_id, "recover")
        for name, instance_id in look.cancelled:
            self.cancelled(name, instance_id)
        # Instances this engine owns but no longer runs (a run whose end could
        # not be recorded): run them again. Only when no run here began or
        # ended while the store was read, and no queue claim is under way: else
        # "owned, and not active now" may be a run that ended meanwhile, or one
        # claimed and not yet begun, and the next poll looks again.
        with self._lock:
            # A queue claim under way has instances ours in the store and not yet
            # active here: look again at the next poll.
            if self._turnover != turnover or self._claiming:
                return
            lost = [key for key in look.mine if key not in self._active]
        for name, instance_id in lost:
            if name in self.workflows:
                log.warning("running again an instance whose run here did not record its end",
                            extra=where(name, instance_id))
                self.wake(name, instance_id, "recover")

