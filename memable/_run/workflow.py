"""A registered workflow: its function and the types of its input and output."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import attrs

from .._store.serde import hints_of, return_hint


@attrs.frozen
class Workflow:
    """A workflow function as registered: ``fn(ctx)`` or ``fn(ctx, input)``.

    >>> def ship(ctx, order_id: int) -> str:
    ...     return "shipped"
    >>> wf = Workflow.of("ship", ship)
    >>> wf.takes_input, wf.input_hint, wf.output_hint
    (True, <class 'int'>, <class 'str'>)
    """

    name: str
    fn: Callable[..., Any]
    takes_input: bool
    input_hint: Any
    output_hint: Any
    #: The input parameter has no default: invoking without an input is an error.
    input_required: bool = False
    #: The queue it is invoked onto by default (None: it runs in the invoking engine).
    queue: str | None = None
    #: Seconds from an instance's creation after which it is cancelled, "timed out"
    #: (None: never); ``invoke(timeout=)`` overrides it.
    timeout: float | None = None

    @classmethod
    def of(
        cls, name: str, fn: Callable[..., Any], queue: str | None = None,
        timeout: float | None = None,
    ) -> Workflow:
        """Check ``fn``'s signature and read its annotations."""
        params = [
            p for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
        if not 1 <= len(params) <= 2:
            raise TypeError(
                f"workflow {name!r} must take (ctx) or (ctx, input), "
                f"not {len(params)} positional parameters"
            )
        hints = hints_of(fn)
        input_hint = hints.get(params[1].name) if len(params) == 2 else None
        required = len(params) == 2 and params[1].default is params[1].empty
        return cls(name, fn, len(params) == 2, input_hint, return_hint(fn), required, queue,
                   timeout)
