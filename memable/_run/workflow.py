"""A registered workflow: its function and the types of its input and output."""

from __future__ import annotations

import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

import attrs

from .._observe.base import RunReason
from .._store.serde import hints_of, return_hint

#: The code flags of a function whose call makes a coroutine or an async generator.
_ASYNC_FLAGS = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR


def is_async(fn: object) -> bool:
    """Whether calling ``fn`` (through ``partial`` and ``__call__``) makes a coroutine or an
    async generator; read from the code's flags, faster than ``inspect``, for every step run.

    >>> import functools, inspect
    >>> async def fetch(url: str) -> str: ...
    >>> class Client:
    ...     async def __call__(self) -> None: ...
    >>> is_async(fetch), is_async(functools.partial(fetch, "x")), is_async(Client())
    (True, True, True)
    >>> is_async(len), is_async(lambda: None), is_async(dict), is_async(Client().__call__)
    (False, False, False, True)
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None)  # a function, or a method of one
    if code is None and not isinstance(fn, (type, types.BuiltinFunctionType)):
        call = getattr(type(fn), "__call__", None)  # noqa: B004  # an object: its class's
        code = getattr(call, "__code__", None)
    return code is not None and bool(code.co_flags & _ASYNC_FLAGS)


def async_refusal(what: str, fn: object) -> TypeError:
    """The TypeError for an async function given where memable calls plain functions.

    >>> async def fetch() -> None: ...
    >>> print(async_refusal("workflow 'w'", functools.partial(fetch)))
    workflow 'w' is an async function (fetch), and memable runs plain synchronous \
functions: make it a def, or call the async code inside one with asyncio.run()
    """
    while isinstance(fn, functools.partial):
        fn = fn.func
    named = (getattr(fn, "__qualname__", None) if inspect.isroutine(fn)
             else f"{type(fn).__qualname__}.__call__")
    return TypeError(
        f"{what} is an async function ({named}), and memable runs plain synchronous "
        "functions: make it a def, or call the async code inside one with asyncio.run()"
    )


def _holds(hint: Any, context: type) -> bool:
    """Whether a parameter annotated ``hint`` can take a ``context`` (an unknown: yes)."""
    origin = typing.get_origin(hint)
    if origin is typing.Union or origin is types.UnionType:  # Context | None: any member
        return any(_holds(member, context) for member in typing.get_args(hint))
    hint = origin or hint  # dict[str, int]: dict
    if hint is Any or not isinstance(hint, type):  # Any is a class from Python 3.11 on
        return True  # Any, a union, a string never resolved: no refusal on a guess
    try:
        return issubclass(context, hint)
    except TypeError:  # a protocol that is not runtime-checkable, say
        return True


def _named(hint: Any) -> str:
    """A type annotation as written: ``int``, ``dict[str, int]``."""
    # dict[str, int] passes isinstance(..., type) on Python 3.10: its origin tells.
    plain = isinstance(hint, type) and typing.get_origin(hint) is None
    return hint.__qualname__ if plain else repr(hint)


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
    #: Seconds from creation to cancel an instance "timed out" (None: never); invoke may override.
    timeout: float | None = None
    #: The name of the parameter that receives the Context.
    ctx_name: str = "ctx"

    @classmethod
    def of(cls, name: str, fn: Callable[..., Any], queue: str | None = None,
           timeout: float | None = None, *, context: type | None = None) -> Workflow:
        """Check ``fn``'s signature and read its annotations; ``TypeError`` for an async ``fn``,
        or a first parameter annotated with a class that cannot hold a ``context``.

        >>> def ship(order_id: int) -> str:
        ...     return "shipped"
        >>> Workflow.of("ship", ship, context=dict)
        Traceback (most recent call last):
        ...
        TypeError: workflow 'ship' must take the Context as its first positional parameter, ...
        """
        if is_async(fn):
            raise async_refusal(f"workflow {name!r}", fn)
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if not 1 <= len(params) <= 2:
            raise TypeError(f"workflow {name!r} must take (ctx) or (ctx, input), "
                            f"not {len(params)} positional parameters: the Context comes first, "
                            "then the input if it takes one")
        hints = hints_of(fn)
        first = hints.get(params[0].name)
        if context is not None and first is not None and not _holds(first, context):
            todo = (f"write def {getattr(fn, '__name__', 'fn')}(ctx, {params[0].name})"
                    if len(params) == 1 else "put the Context first, then the input")
            raise TypeError(
                f"workflow {name!r} must take the Context as its first positional "
                f"parameter, but {params[0].name!r} is annotated {_named(first)}: {todo}"
            )
        input_hint = hints.get(params[1].name) if len(params) == 2 else None
        required = len(params) == 2 and params[1].default is params[1].empty
        return cls(name, fn, len(params) == 2, input_hint, return_hint(fn), required, queue,
                   timeout, params[0].name)

    def no_input(self, value: object) -> TypeError:
        """The TypeError for an input given to a workflow that takes none.

        >>> print(Workflow.of("tick", lambda n: None).no_input(5))
        workflow 'tick' takes no input, got int (its one parameter, 'n', receives the Context; \
to take an input, make it fn(ctx, n))
        """
        return TypeError(
            f"workflow {self.name!r} takes no input, got {type(value).__name__} (its one "
            f"parameter, {self.ctx_name!r}, receives the Context; to take an input, make it "
            f"fn(ctx, {'value' if self.ctx_name == 'ctx' else self.ctx_name}))"
        )


#: A run to start of an instance just made here (``Claims.start_made``): workflow, id, input
#: (in a tuple; None: read it), trace context, and why it starts (None: judged from it).
Made = tuple[Workflow, str, "tuple[Any] | None", "str | None", "RunReason | None"]
