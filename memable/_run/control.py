"""The control-flow exceptions the run itself raises to unwind a workflow function.

Each is a ``BaseException``, not an ``Exception``, so that ``except
Exception`` in user code cannot swallow it and carry the run on past a point
where it has to stop: a wait (``Suspension``), or a retry backoff cut short by
the engine stopping (``EngineStopping``). The two a store write raises, a
cancel (``RunCancelled``) and an instance another engine has taken
(``LostInstance``), are the store's (``memable._store.control``). The runner
catches all four and records (or, for a lost instance, does not record) how
the run ended.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._store.rows import StepWrite


class Suspension(BaseException):
    """Unwinds a workflow that must wait for a signal, a timer or a retry backoff.

    The runner records the wait (``waiting``, and for a timer its
    ``deadline``) in the transaction that ends the run Suspended.
    """

    def __init__(
        self, key: str, message: str, waiting: StepWrite, deadline: float | None = None
    ) -> None:
        super().__init__(key, message)
        self.key = key
        self.message = message
        self.waiting = waiting
        self.deadline = deadline


class EngineStopping(BaseException):
    """Unwinds a run waiting out a short retry backoff when its engine stops.

    The runner stores the rest of the backoff as a durable timer, so the next
    engine on the store makes the attempt when it is due.
    """

    def __init__(self, waiting: StepWrite, deadline: float) -> None:
        super().__init__(waiting.key)
        self.waiting = waiting
        self.deadline = deadline
