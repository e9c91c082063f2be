"""What a workflow function sees of its run: ``Context`` and the step builder."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

import attrs

from ._errors import DuplicateStepKey, EngineError, InvalidKey
from ._serde import decode_for, return_hint, store_form
from ._states import InProgress, WorkflowState
from ._store import StepWrite, Store, StoredStep, utcnow

P = ParamSpec("P")
R = TypeVar("R")


def check_key(key: object, workflow: str, instance_id: str) -> str:
    """Return ``key`` if it is a usable step key, else raise InvalidKey."""
    if not isinstance(key, str) or not key:
        raise InvalidKey(key, "keys are non-empty str", workflow=workflow, instance_id=instance_id)
    if key.startswith("_"):
        raise InvalidKey(
            key, "keys starting with '_' are reserved for the engine",
            workflow=workflow, instance_id=instance_id,
        )
    return key


def seconds_of(duration: float | timedelta) -> float:
    """A duration given as float seconds or a timedelta, in seconds."""
    return duration.total_seconds() if isinstance(duration, timedelta) else float(duration)


class Context:
    """The handle a workflow function gets for its run of one instance.

    A workflow is ``fn(ctx)`` or ``fn(ctx, input)``. Its steps go through
    ``ctx.step(key)``: the first run of a key executes the function and
    stores the result; every later run of the instance returns the stored
    result without calling it.

    >>> from memable import Context, Engine
    >>> def greet(ctx: Context, name: str) -> str:
    ...     ctx.set_status("greeting")
    ...     return ctx.step("greeting:v1").run(lambda: f"hello {name}")
    >>> engine = Engine.in_memory()
    >>> engine.register("greet", greet)
    >>> with engine:
    ...     engine.invoke("greet", "world").result()
    'hello world'
    """

    # A Context belongs to the one thread that runs its workflow function;
    # nothing in it is shared, so nothing in it is locked.

    def __init__(
        self,
        *,
        workflow: str,
        instance_id: str,
        input: Any,
        store: Store,
        memo: dict[str, StoredStep],
        publish: Callable[[WorkflowState], None],
    ) -> None:
        self._workflow = workflow
        self._instance_id = instance_id
        self._input = input
        self._store = store
        self._memo = memo
        self._publish = publish
        self._seen: set[str] = set()
        self._next_seq = max((s.seq for s in memo.values()), default=-1) + 1
        # Replaying while the run reaches stored keys; live from the start if none.
        self._replaying = bool(memo)
        self._status: str | None = None
        # The key and exception of the step that failed last, to name it in Failed.
        self._failure: tuple[str, BaseException] | None = None

    def __repr__(self) -> str:
        return f"<Context workflow={self._workflow!r} instance_id={self._instance_id!r}>"

    @property
    def workflow_name(self) -> str:
        """The name the workflow was registered under.

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.register("named", lambda ctx: ctx.workflow_name)
        >>> with engine:
        ...     engine.invoke("named").result()
        'named'
        """
        return self._workflow

    @property
    def instance_id(self) -> str:
        """The id of the instance this run belongs to.

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", lambda ctx: ctx.instance_id)
        >>> with engine:
        ...     engine.invoke("wf", instance_id="order-1").result()
        'order-1'
        """
        return self._instance_id

    @property
    def input(self) -> Any:
        """The instance's stored input (None when it was invoked without one).

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> def double(ctx, n: int) -> int:
        ...     return ctx.input * 2
        >>> engine.register("double", double)
        >>> with engine:
        ...     engine.invoke("double", 21).result()
        42
        """
        return self._input

    def set_status(self, message: str) -> None:
        """Publish ``InProgress(message)`` and store it with the next completed step.

        While the run replays stored steps the status is set silently; the
        current status is published once when replay ends.

        >>> from memable import Engine, InProgress
        >>> def wf(ctx):
        ...     ctx.set_status("loading")
        ...     ctx.step("load:v1").run(lambda: 1)
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", wf)
        >>> with engine:
        ...     inv = engine.invoke("wf")
        ...     _ = inv.wait()
        ...     engine.steps("wf", inv.instance_id)[0].status
        'loading'
        """
        if not isinstance(message, str):
            raise TypeError(f"set_status takes a str, not {type(message).__name__}")
        self._status = message
        if not self._replaying:
            self._publish(InProgress(message))

    def step(self, key: str) -> Step:
        """Start building the step stored under ``key``; finish with ``.run(fn)``.

        Keys are non-empty ``str`` unique within the instance; keys starting
        with ``_`` are reserved. Version keys (``"charge:v2"``) when a step's
        meaning changes, so old stored results are not reused for it.

        >>> from memable import Engine
        >>> def wf(ctx) -> int:
        ...     return ctx.step("answer:v1").returns(int).run(lambda: 42)
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", wf)
        >>> with engine:
        ...     engine.invoke("wf").result()
        42
        """
        return Step(self, check_key(key, self._workflow, self._instance_id))

    # ------------------------------------------------------------------ engine side

    def _end_replay(self) -> None:
        """Leave replay: from now on statuses are live; publish the current one once."""
        if self._replaying:
            self._replaying = False
            if self._status is not None:
                self._publish(InProgress(self._status))

    def _failure_message(self, exc: BaseException) -> str:
        """The Failed message for ``exc`` escaping the workflow: step key and error."""
        error = f"{type(exc).__name__}: {exc}"
        if self._failure is not None and self._failure[1] is exc:
            return f"step {self._failure[0]!r} failed: {error}"
        return f"workflow raised {error}"

    def _claim(self, key: str) -> None:
        if key in self._seen:
            exc = DuplicateStepKey(self._workflow, self._instance_id, key)
            self._failure = (key, exc)
            raise exc
        self._seen.add(key)

    def _run_step(
        self, step: Step, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        key = step.key
        self._claim(key)
        stored = self._memo.get(key)
        hint = step.result_type if step.result_type is not None else return_hint(fn)
        if stored is not None and stored.state == "completed":
            if stored.status is not None:
                self._status = stored.status  # restored silently, like the replayed set_status
            try:
                return decode_for(
                    self._workflow, self._instance_id, key, stored.result or "null",
                    stored.result_type, hint,
                )
            except EngineError as exc:
                self._failure = (key, exc)
                raise
        self._end_replay()
        seq = stored.seq if stored is not None else self._take_seq()
        try:
            text, tag, value = store_form(
                self._workflow, self._instance_id, key, fn(*args, **kwargs), hint
            )
        except Exception as exc:
            self._failure = (key, exc)
            self._store.save_step(self._write(key, seq, "failed", error=exc))
            raise
        self._store.save_step(self._write(key, seq, "completed", result=(text, tag)))
        return value

    def _take_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq

    def _write(
        self,
        key: str,
        seq: int,
        state: str,
        *,
        result: tuple[str, str | None] | None = None,
        error: BaseException | None = None,
    ) -> StepWrite:
        text, tag = result if result is not None else (None, None)
        return StepWrite(
            workflow=self._workflow,
            instance_id=self._instance_id,
            key=key,
            seq=seq,
            kind="step",
            state=state,  # type: ignore[arg-type]
            result=text,
            result_type=tag,
            status=self._status,
            error=None if error is None else f"{type(error).__name__}: {error}",
            at=utcnow().isoformat(),
        )


@attrs.frozen
class Step:
    """A step under construction: ``ctx.step(key)[.returns(T)].run(fn, *args, **kwargs)``.

    Each method returns a new ``Step``; nothing happens until ``run``.

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

    _ctx: Context = attrs.field(repr=False)
    key: str
    result_type: Any = None

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

    def run(self, fn: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R:
        """Return the stored result of this key, or run ``fn(*args, **kwargs)`` and store it.

        The result is stored, in its own transaction, before ``run`` returns,
        and ``run`` returns it as the store rebuilds it: the first run sees
        what every replay will see. The type it is rebuilt as comes from
        ``.returns(T)``, else ``fn``'s return annotation, else the class the
        value had.
        If ``fn`` raises, or returns a value that cannot be stored
        (``SerializationError``), the step is recorded as failed, nothing is
        stored as completed, and the error propagates; a later run of the
        instance executes it again.

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
