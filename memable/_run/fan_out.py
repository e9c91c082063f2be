"""Fan-out inside a run: the items of ``ctx.step(key).map(fn, items)`` side by side.

Each item is a step (``"{key}[{i}]"``) run by ``Attempts`` on a pool joined before the call
returns; what the run does next is decided from all outcomes (``first_to_raise``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .._store.control import LostInstance, RunCancelled
from .control import EngineStopping, Suspension


def check_concurrency(value: object) -> int:
    """``max_concurrency`` must be a positive int.

    >>> check_concurrency(0)
    Traceback (most recent call last):
    ...
    ValueError: max_concurrency is a positive int, not 0
    """
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"max_concurrency is a positive int, not {type(value).__name__}")
    if value < 1:
        raise ValueError(f"max_concurrency is a positive int, not {value!r}")
    return value


def run_items(
    jobs: Sequence[Callable[[], Any]], max_concurrency: int, name: str
) -> list[tuple[Any, BaseException | None]]:
    """Run every job, at most ``max_concurrency`` at once, on threads named ``name``; each
    one's (value, exception): an exception, ``BaseException`` included, is not raised here.

    >>> run_items([lambda: 1, lambda: 1 / 0], 2, "memable-map doc")
    ... # doctest: +ELLIPSIS
    [(1, None), (None, ZeroDivisionError(...))]
    """
    with ThreadPoolExecutor(
        max_workers=min(max_concurrency, len(jobs)), thread_name_prefix=name
    ) as pool:
        futures = [pool.submit(job) for job in jobs]
    outcomes: list[tuple[Any, BaseException | None]] = []
    for future in futures:
        exc = future.exception()
        outcomes.append((None, exc) if exc is not None else (future.result(), None))
    return outcomes


def first_to_raise(errors: Sequence[BaseException | None]) -> int | None:
    """The index of the item whose exception the run raises, or None if none failed.

    An item whose instance was lost, then one cancelled, stop the run; then a wait (a retry
    backoff that ends the run, or the engine stopping in one), the earliest deadline first;
    then the first failed item by index, as a failing step would raise it.

    >>> from memable._store.control import RunCancelled
    >>> first_to_raise([None, ValueError("a"), RunCancelled()]), first_to_raise([None])
    (2, None)
    """
    for kind in (LostInstance, RunCancelled):
        for i, exc in enumerate(errors):
            if isinstance(exc, kind):
                return i
    waits = [(exc.deadline, i) for i, exc in enumerate(errors)
        if isinstance(exc, (Suspension, EngineStopping)) and exc.deadline is not None]
    if waits:
        return min(waits)[1]
    return next((i for i, exc in enumerate(errors) if exc is not None), None)
