"""The exception a step function raises to say whether retrying can help."""

from __future__ import annotations


class StepError(Exception):
    """An error a step function raises, marked retryable or permanent.

    >>> from memable import Engine, StepError
    >>> def charge() -> int:
    ...     raise StepError.permanent("card declined")
    >>> def wf(ctx):
    ...     ctx.step("charge:v1").run(charge)
    >>> engine = Engine.in_memory()
    >>> engine.register("wf", wf)
    >>> with engine:
    ...     print(engine.invoke("wf").wait())
    failed: step 'charge:v1' failed: StepError: card declined
    """

    def __init__(self, message: str, *, is_retryable: bool = True) -> None:
        super().__init__(message)
        self.is_retryable = is_retryable

    def __repr__(self) -> str:
        kind = "retryable" if self.is_retryable else "permanent"
        return f"StepError.{kind}({self.args[0]!r})"

    @classmethod
    def retryable(cls, message: str) -> StepError:
        """An error worth another attempt (a timeout, a dropped connection).

        >>> from memable import StepError
        >>> err = StepError.retryable("connection reset")
        >>> err.is_retryable, str(err)
        (True, 'connection reset')
        """
        return cls(message, is_retryable=True)

    @classmethod
    def permanent(cls, message: str) -> StepError:
        """An error no retry can fix (bad input, a refusal).

        >>> from memable import StepError
        >>> StepError.permanent("card declined")
        StepError.permanent('card declined')
        """
        return cls(message, is_retryable=False)
