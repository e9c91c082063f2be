"""The control-flow exceptions a run raises to unwind a workflow function: ``BaseException``s,
so user code's ``except Exception`` cannot carry the run past a wait or a stop (those a
store write raises are ``memable._store.control``'s)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._store.rows import StepWrite


class Suspension(BaseException):
    """Unwinds a workflow that must wait for a signal, a timer or a retry backoff; the runner
    records ``waiting`` (and ``deadline``) as it ends the run Suspended."""

    def __init__(self, key: str, message: str, waiting: StepWrite,
                 deadline: float | None = None) -> None:
        super().__init__(key, message)
        self.key = key
        self.message = message
        self.waiting = waiting
        self.deadline = deadline


class EngineStopping(BaseException):
    """Unwinds a run waiting out a short retry backoff when its engine stops; the runner
    stores the rest of the backoff as a durable timer for any engine to fire."""

    def __init__(self, waiting: StepWrite, deadline: float) -> None:
        super().__init__(waiting.key)
        self.waiting = waiting
        self.deadline = deadline
