"""The control-flow exceptions a store write raises to unwind a workflow function.

Each is a ``BaseException``, not an ``Exception``, so that ``except
Exception`` in user code cannot swallow it and carry the run on past a point
where it has to stop: a cancel (``RunCancelled``), an instance another
engine has taken (``LostInstance``), or a lease run out while the store was
unreachable (``LeaseLost``). The run's own (a wait, the engine
stopping) are in ``memable._run.control``.
"""

from __future__ import annotations


class RunCancelled(BaseException):
    """Unwinds a workflow whose instance was cancelled, at its next step boundary."""


class LostInstance(BaseException):
    """The run's engine no longer owns its instance: stop without writing.

    Raised by a store write that finds another owner (the lease expired and
    another engine took the instance over).
    """


class LeaseLost(BaseException):
    """The store stayed unreachable until this engine's lease ran out: stop without writing.

    Raised by a run's store operation that met a lost connection and retried it
    until the lease was known lost (no heartbeat committed for ``lease``
    seconds): another engine may own the instance by now. The instance is left
    as it is stored; it runs again once the store answers, in this engine (its
    look finds its own instance with no run here) or in the one that took it.
    """
