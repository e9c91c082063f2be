"""The control-flow exceptions a store write raises to unwind a workflow function.

Each is a ``BaseException``, so ``except Exception`` in user code cannot swallow it and
carry the run on past a point where it has to stop. The run's own (a wait, the engine
stopping) are in ``memable._run.control``."""

from __future__ import annotations


class RunCancelled(BaseException):
    """Unwinds a workflow whose instance was cancelled, at its next step boundary."""


class LostInstance(BaseException):
    """The run's engine no longer owns its instance (another took it over): stop, write nothing."""


class LeaseLost(BaseException):
    """The store stayed unreachable until this engine's lease ran out: stop without writing.

    Raised by an operation that retried a lost connection until no heartbeat committed for
    ``lease`` seconds: another engine may own the instance. It runs again once the store
    answers, here (the look finds it ours, with no run) or there."""
