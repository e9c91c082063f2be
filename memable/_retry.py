"""Retry policies for steps: how many attempts, and how long between them."""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from datetime import timedelta

import attrs

from ._errors import SerializationError
from ._step_error import StepError


def _seconds(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    """A delay or multiplier: a finite number >= 0 (else TypeError or ValueError)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        kind = "a number" if attribute.name == "multiplier" else "float seconds or a timedelta"
        raise TypeError(f"Retry.{attribute.name} is {kind}, not {type(value).__name__} {value!r}")
    if not 0 <= value < math.inf:
        raise ValueError(f"Retry.{attribute.name} must be a finite number >= 0, not {value!r}")


def _delay(value: float | timedelta) -> float:
    """A delay given as seconds or a timedelta, as seconds (checked by ``_seconds``)."""
    return value.total_seconds() if isinstance(value, timedelta) else value


@attrs.frozen(kw_only=True)
class Retry:
    """How a failing step is retried: exponential backoff, with optional jitter.

    >>> from memable import Engine, Retry, StepError
    >>> calls = []
    >>> def flaky() -> str:
    ...     calls.append(1)
    ...     if len(calls) < 3:
    ...         raise ConnectionError("try again")
    ...     return "ok"
    >>> def wf(ctx) -> str:
    ...     return ctx.step("call:v1").retry(Retry(max_attempts=3, initial_delay=0)).run(flaky)
    >>> engine = Engine.in_memory()
    >>> engine.register("wf", wf)
    >>> with engine:
    ...     print(engine.invoke("wf").result(timeout=10), len(calls))
    ok 3
    """

    max_attempts: int = attrs.field(default=3)
    initial_delay: float = attrs.field(default=0.1, converter=_delay, validator=_seconds)
    max_delay: float = attrs.field(default=30.0, converter=_delay, validator=_seconds)
    multiplier: float = attrs.field(default=2.0, validator=_seconds)
    jitter: bool = True

    @max_attempts.validator
    def _check_attempts(self, attribute: attrs.Attribute[int], value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"Retry.max_attempts must be an int >= 1, not {value!r}")

    def delay(self, attempt: int, draw: Callable[[float, float], float] = random.uniform) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1 for the first).

        >>> from memable import Retry
        >>> policy = Retry(initial_delay=0.5, multiplier=2, max_delay=3, jitter=False)
        >>> [policy.delay(n) for n in (1, 2, 3, 4)]
        [0.5, 1.0, 2.0, 3.0]
        """
        base = float(min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1)))
        return draw(0.0, base) if self.jitter else base

    def should_retry(self, attempt: int, error: BaseException) -> bool:
        """Whether a step that failed ``attempt`` times with ``error`` runs again.

        >>> from memable import Retry, StepError
        >>> policy = Retry(max_attempts=2)
        >>> policy.should_retry(1, TimeoutError()), policy.should_retry(2, TimeoutError())
        (True, False)
        >>> policy.should_retry(1, StepError.permanent("card declined"))
        False
        >>> from memable import SerializationError
        >>> policy.should_retry(1, SerializationError("cannot store a value of type Conn"))
        False
        """
        if isinstance(error, StepError) and not error.is_retryable:
            return False
        if isinstance(error, SerializationError):  # the same value would be refused again
            return False
        return attempt < self.max_attempts
