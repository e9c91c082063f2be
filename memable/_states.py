"""The observable state of a run: what an ``Invocation`` reports."""

from __future__ import annotations

import attrs


@attrs.frozen
class WorkflowState:
    """Base class of the states a run of an instance goes through.

    The subclasses are frozen values, equal by value and usable in ``match``: ``Started()``,
    ``InProgress(message)``, ``Suspended(message)``, ``Completed()``, ``Failed(message)``,
    ``Cancelled()``.

    >>> from memable import Completed, InProgress, WorkflowState
    >>> state = InProgress("syncing records")
    >>> str(state)
    'in progress: syncing records'
    >>> isinstance(state, WorkflowState), state.is_terminal, state.message
    (True, False, 'syncing records')
    >>> match Completed():
    ...     case Completed():
    ...         print("done")
    done
    """

    @property
    def is_terminal(self) -> bool:
        """True for Completed, Failed and Cancelled.

        >>> from memable import Completed, Failed, Started
        >>> Completed().is_terminal, Failed("err").is_terminal, Started().is_terminal
        (True, True, False)
        """
        return isinstance(self, Completed | Failed | Cancelled)

    @property
    def message(self) -> str | None:
        """The message this state carries, or None for those without one.

        >>> from memable import Completed, InProgress
        >>> InProgress("loading").message, Completed().message
        ('loading', None)
        """
        return None


@attrs.frozen
class Queued(WorkflowState):
    """The instance waits for a slot of its queue; no run of it is in progress.

    >>> from memable import Queued
    >>> str(Queued()), Queued().is_terminal
    ('queued', False)
    """

    def __str__(self) -> str:
        return "queued"


@attrs.frozen
class Started(WorkflowState):
    """The run was submitted and has not reported anything yet.

    >>> from memable import Started
    >>> str(Started())
    'started'
    """

    def __str__(self) -> str:
        return "started"


@attrs.frozen
class InProgress(WorkflowState):
    """The run is executing and reported ``message`` with ``ctx.set_status``.

    >>> from memable import InProgress
    >>> str(InProgress("syncing records"))
    'in progress: syncing records'
    """

    message: str  # a field where the base has a property

    def __str__(self) -> str:
        return f"in progress: {self.message}"


@attrs.frozen
class Suspended(WorkflowState):
    """The run ended waiting for a signal or a timer; ``message`` says which.

    >>> from memable import Suspended
    >>> str(Suspended("waiting for a manager"))
    'suspended: waiting for a manager'
    """

    message: str  # a field where the base has a property

    def __str__(self) -> str:
        return f"suspended: {self.message}"


@attrs.frozen
class Completed(WorkflowState):
    """The instance returned; its output is stored.

    >>> from memable import Completed
    >>> str(Completed()), Completed() == Completed()
    ('completed', True)
    """

    def __str__(self) -> str:
        return "completed"


@attrs.frozen
class Failed(WorkflowState):
    """The run raised; ``message`` names the step and the error (``resume`` continues it).

    >>> from memable import Failed
    >>> str(Failed("boom")), Failed("boom").is_terminal
    ('failed: boom', True)
    """

    message: str  # a field where the base has a property

    def __str__(self) -> str:
        return f"failed: {self.message}"


@attrs.frozen
class Cancelled(WorkflowState):
    """The instance was cancelled and takes no more work.

    >>> from memable import Cancelled
    >>> str(Cancelled()), Cancelled().is_terminal
    ('cancelled', True)
    """

    def __str__(self) -> str:
        return "cancelled"
