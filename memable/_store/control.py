"""The control-flow exceptions a store write raises to unwind a workflow function.

Each is a ``BaseException``, not an ``Exception``, so that ``except
Exception`` in user code cannot swallow it and carry the run on past a point
where it has to stop: a cancel (``RunCancelled``), or an instance another
engine has taken (``LostInstance``). The run's own (a wait, the engine
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
