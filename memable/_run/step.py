"""The step builder: ``ctx.step(key)[.returns(T)][.timeout(d)][.retry(p)].run(fn)``."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, ParamSpec, Protocol, TypeVar

import attrs

from .._retry import Retry
from .._validate import positive_seconds

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class StepRunner(Protocol):
    """What runs a built step: the run's ``Context`` (the builder only describes it)."""

    def _run_step(self, step: Step, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any: ...

    def _map_step(self, step: Step, fn: Callable[[T], Any], items: Iterable[T],
                  max_concurrency: int) -> list[Any]: ...


@attrs.frozen
class Step:
    """A step under construction: ``ctx.step(key)``, then ``.run(fn, ...)`` or ``.map(fn, items)``.

    >>> from memable import Engine
    >>> def wf(ctx):
    ...     step = ctx.step("sum:v1")
    ...     return step.run(sum, [1, 2, 3])
    >>> engine = Engine.in_memory()
    >>> engine.register("wf", wf)
    >>> with engine:
    ...     engine.invoke("wf").result()
    6
    """

    _ctx: StepRunner = attrs.field(repr=False)
    key: str
    result_type: Any = None
    timeout_seconds: float | None = None
    retry_policy: Retry | None = None

    def returns(self, result_type: Any) -> Step:
        """Rebuild the stored result as ``result_type`` (over the function's annotation).

        >>> from datetime import date
        >>> from memable import Engine
        >>> def wf(ctx):
        ...     return ctx.step("today:v1").returns(date).run(lambda: date(2026, 12, 2))
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", wf)
        >>> with engine:
        ...     engine.invoke("wf").result()
        datetime.date(2026, 12, 2)
        """
        return attrs.evolve(self, result_type=result_type)

    def timeout(self, duration: float | timedelta) -> Step:
        """Fail the step with ``StepTimeout`` if ``fn`` runs longer than the given duration.

        >>> import threading
        >>> from memable import Engine
        >>> release = threading.Event()
        >>> def wf(ctx):
        ...     ctx.step("slow:v1").timeout(0.05).run(release.wait)
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", wf)
        >>> with engine:
        ...     print(engine.invoke("wf").wait())  # doctest: +ELLIPSIS
        failed: step 'slow:v1' failed: StepTimeout: timed out after 0.05 s: ...
        >>> release.set()
        """
        return attrs.evolve(self, timeout_seconds=positive_seconds(duration, "step timeout"))

    def retry(self, policy: Retry) -> Step:
        """Retry the step by ``policy`` when it fails (over the engine's ``retry`` option).

        >>> from memable import Engine, Retry, StepError
        >>> def wf(ctx):
        ...     ctx.step("charge:v1").retry(Retry(max_attempts=4, initial_delay=0)).run(
        ...         lambda: 1 / 0)
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", wf)
        >>> with engine:
        ...     print(engine.invoke("wf").wait())
        failed: step 'charge:v1' failed after 4 attempts: ZeroDivisionError: division by zero
        """
        if not isinstance(policy, Retry):
            raise TypeError(f"retry takes a Retry, not {type(policy).__name__}")
        return attrs.evolve(self, retry_policy=policy)

    def run(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Return the stored result of this key, or run ``fn(*args, **kwargs)`` and store it.

        If ``fn`` raises, the step is recorded failed and the error propagates.

        >>> from memable import Engine
        >>> calls = []
        >>> def fetch(n: int) -> int:
        ...     calls.append(n)
        ...     return n * 10
        >>> def wf(ctx):
        ...     return ctx.step("fetch:v1").run(fetch, 4)
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", wf)
        >>> with engine:
        ...     inv = engine.invoke("wf")
        ...     first = inv.result()
        ...     again = engine.resume("wf", inv.instance_id).result()
        >>> first, again, calls
        (40, 40, [4])
        """
        result: R = self._ctx._run_step(self, fn, args, kwargs)
        return result

    def map(self, fn: Callable[[T], R], items: Iterable[T], *, max_concurrency: int = 8
            ) -> list[R]:
        """Run ``fn(item)`` for each item as a step of its own, side by side; their results.

        >>> from memable import Engine
        >>> calls = []
        >>> def resize(n: int) -> str:
        ...     calls.append(n)
        ...     if n == 3 and calls.count(3) == 1:
        ...         raise OSError("disk full")
        ...     return f"image-{n}.png"
        >>> def thumbnails(ctx, count: int) -> list[str]:
        ...     return ctx.step("resize:v1").map(resize, range(count), max_concurrency=4)
        >>> engine = Engine.in_memory()
        >>> engine.register("thumbnails", thumbnails)
        >>> with engine:
        ...     inv = engine.invoke("thumbnails", 5)
        ...     print(inv.wait())
        ...     print(engine.resume("thumbnails", inv.instance_id).result())
        failed: step 'resize:v1[3]' failed: OSError: disk full
        ['image-0.png', 'image-1.png', 'image-2.png', 'image-3.png', 'image-4.png']
        >>> sorted(calls)
        [0, 1, 2, 3, 3, 4]
        """
        result: list[R] = self._ctx._map_step(self, fn, items, max_concurrency)
        return result
