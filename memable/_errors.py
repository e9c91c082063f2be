"""Everything memable raises on purpose; each constructor builds its message from the facts."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._states import WorkflowState


def _where(workflow: str | None, instance_id: str | None, key: str | None,
           part: str | None) -> str:
    named = (("workflow", workflow), ("instance", instance_id), ("step", key))
    parts = [f"{what} {value!r}" for what, value in named if value is not None]
    return ", ".join(parts if part is None else [*parts, part])


class EngineError(Exception):
    """Base class of every error memable raises on purpose.

    ``workflow``, ``instance_id`` and ``key`` hold the facts the message names (None where
    they do not apply); ``key`` is ``"input"`` or ``"output"`` for an instance's input or output.

    >>> from memable import EngineError, InstanceNotFound
    >>> err = InstanceNotFound("ship", "order-1")
    >>> isinstance(err, EngineError), err.instance_id
    (True, 'order-1')
    >>> str(err)
    "no stored instance: workflow 'ship', instance 'order-1'"
    """

    def __init__(self, message: str, *, workflow: str | None = None,
                 instance_id: str | None = None, key: str | None = None,
                 part: str | None = None) -> None:
        where = _where(workflow, instance_id, key, part)
        super().__init__(f"{message}: {where}" if where else message)
        self.workflow = workflow
        self.instance_id = instance_id
        self.key = key if part is None else part


class NotStarted(EngineError):
    """The engine is not running: ``start()`` was not called, or it stopped.

    >>> from memable import Engine, NotStarted
    >>> engine = Engine.in_memory()
    >>> engine.register("noop", lambda ctx: None)
    >>> try:
    ...     engine.invoke("noop")
    ... except NotStarted as err:
    ...     print(err)
    the engine is not running (call start() first): workflow 'noop'
    >>> engine.close()
    """

    def __init__(self, workflow: str | None = None, phase: str = "new") -> None:
        why = {
            "stopped": "the engine is stopped (make a new engine to run more)",
            "closed": "the engine is closed (make a new engine to run more)",
            "started": "the engine is stopping (wait_all() or stop() was called)",
        }.get(phase, "the engine is not running (call start() first)")
        super().__init__(why, workflow=workflow)


class AlreadyStarted(EngineError):
    """``start()`` was called twice, or ``register`` after ``start()``.

    >>> from memable import AlreadyStarted, Engine
    >>> with Engine.in_memory() as engine:
    ...     try:
    ...         engine.register("late", lambda ctx: None)
    ...     except AlreadyStarted as err:
    ...         print(err)
    the engine has already been started: workflow 'late'
    """

    def __init__(self, workflow: str | None = None, phase: str = "started") -> None:
        why = {
            "stopped": "the engine was stopped and cannot start again (make a new engine)",
            "closed": "the engine is closed and cannot start again (make a new engine)",
        }.get(phase, "the engine has already been started")
        super().__init__(why, workflow=workflow)


class WorkflowNotFound(EngineError):
    """No workflow is registered under that name.

    >>> from memable import Engine, WorkflowNotFound
    >>> with Engine.in_memory() as engine:
    ...     try:
    ...         engine.invoke("nonexistent")
    ...     except WorkflowNotFound as err:
    ...         print(err)
    no workflow registered under this name: workflow 'nonexistent'
    """

    def __init__(self, workflow: str, why: str = "no workflow registered under this name",
                 hint: str = "", instance_id: str | None = None) -> None:
        super().__init__(why, workflow=workflow, instance_id=instance_id)
        if hint:  # e.g. "did you mean 'approve'?"
            self.args = (f"{self.args[0]}; {hint}",)


class InstanceNotFound(EngineError):
    """No instance with that id is stored for that workflow.

    >>> from memable import Engine, InstanceNotFound
    >>> engine = Engine.in_memory()
    >>> engine.register("wf", lambda ctx: None)
    >>> with engine:
    ...     try:
    ...         engine.resume("wf", "no-such-id")
    ...     except InstanceNotFound as err:
    ...         print(err)
    no stored instance: workflow 'wf', instance 'no-such-id'
    """

    def __init__(self, workflow: str, instance_id: str) -> None:
        super().__init__("no stored instance", workflow=workflow, instance_id=instance_id)


class StepNotFound(EngineError, ValueError):
    """The instance never reached that key (a fork's unknown key: also a ``ValueError``).

    >>> from memable._errors import StepNotFound
    >>> print(StepNotFound("ship", "order-1", "lable", ["charge", "label"]))
    ... # doctest: +NORMALIZE_WHITESPACE
    no stored step (its keys: 'charge', 'label'): workflow 'ship', instance 'order-1',
    step 'lable'
    """

    def __init__(self, workflow: str, instance_id: str, key: str, keys: list[str]) -> None:
        have = ", ".join(repr(k) for k in keys[:50]) + (", ..." if len(keys) > 50 else "")
        super().__init__(f"no stored step (its keys: {have or 'none'})", workflow=workflow,
                         instance_id=instance_id, key=key)
        #: The keys the instance has, in the order first reached.
        self.keys = keys


class InstanceFinished(EngineError):
    """The instance has ended: a Failed one takes ``resume``, not signals; a Cancelled neither.

    >>> from memable import InstanceFinished
    >>> print(InstanceFinished("ship", "order-1", "it is cancelled"))
    instance has finished (it is cancelled): workflow 'ship', instance 'order-1'
    """

    def __init__(self, workflow: str, instance_id: str, why: str) -> None:
        super().__init__(f"instance has finished ({why})", workflow=workflow,
                         instance_id=instance_id)


def instance_finished(workflow: str, instance_id: str, status: str) -> InstanceFinished:
    """The error of a signal to an instance that ended ``status``.

    >>> print(instance_finished("ship", "order-1", "failed"))
    ... # doctest: +NORMALIZE_WHITESPACE
    instance has finished (it is failed; resume it instead): workflow 'ship',
    instance 'order-1'
    """
    why = f"it is {status}" + ("; resume it instead" if status == "failed" else "")
    return InstanceFinished(workflow, instance_id, why)


class SignalRejected(EngineError):
    """A signal cannot be delivered, e.g. its key already holds a value.

    >>> from memable import SignalRejected
    >>> print(SignalRejected("ship", "order-1", "approval:v1", "the key holds a value"))
    ... # doctest: +NORMALIZE_WHITESPACE
    signal rejected (the key holds a value): workflow 'ship', instance 'order-1',
    step 'approval:v1'
    """

    def __init__(self, workflow: str, instance_id: str, key: str, why: str) -> None:
        super().__init__(f"signal rejected ({why})", workflow=workflow,
                         instance_id=instance_id, key=key)


class InvalidKey(EngineError):
    """A step key (or instance id) is empty, not a ``str``, or reserved (starts with ``_``).

    >>> from memable import Engine, InvalidKey
    >>> print(InvalidKey(42, "keys must be non-empty str", workflow="wf", instance_id="i-1"))
    invalid key 42 (keys must be non-empty str): workflow 'wf', instance 'i-1'
    """

    def __init__(self, key: object, why: str, *, workflow: str | None = None,
                 instance_id: str | None = None) -> None:
        super().__init__(f"invalid key {key!r} ({why})", workflow=workflow,
                         instance_id=instance_id)
        self.key = key if isinstance(key, str) else None


def key_taken(workflow: str, instance_id: str, key: str, stored: str, used: str) -> InvalidKey:
    """The error of a run that reaches a key stored as another kind (e.g. an early signal).

    >>> print(key_taken("ship", "order-1", "label:v1", "signal", "step"))
    ... # doctest: +NORMALIZE_WHITESPACE
    invalid key 'label:v1' (it holds a signal, and the workflow uses it as a step):
    workflow 'ship', instance 'order-1'
    """
    return InvalidKey(key, f"it holds a {stored}, and the workflow uses it as a {used}",
                      workflow=workflow, instance_id=instance_id)


class DuplicateStepKey(EngineError):
    """A step key was used twice in one run of an instance.

    >>> from memable import DuplicateStepKey, Engine, Failed
    >>> def twice(ctx):
    ...     ctx.step("a").run(lambda: 1)
    ...     ctx.step("a").run(lambda: 2)
    >>> engine = Engine.in_memory()
    >>> engine.register("twice", twice)
    >>> with engine:
    ...     print(engine.invoke("twice").wait().message)  # doctest: +ELLIPSIS
    step 'a' failed: DuplicateStepKey: step key used twice in one run: ...
    """

    def __init__(self, workflow: str, instance_id: str, key: str) -> None:
        super().__init__("step key used twice in one run", workflow=workflow,
                         instance_id=instance_id, key=key)


class StorageError(EngineError):
    """The store cannot be opened, read or written.

    >>> import os, tempfile
    >>> from memable import Engine, StorageError
    >>> path = os.path.join(tempfile.mkdtemp(), "notes.txt")
    >>> with open(path, "w") as f:
    ...     _ = f.write("not a database")
    >>> try:
    ...     Engine.open(path)
    ... except StorageError as err:
    ...     print("refused")
    refused
    """


class SerializationError(EngineError):
    """A value cannot be stored, or a stored value no longer fits its type.

    >>> from memable import Engine, SerializationError
    >>> engine = Engine.in_memory()
    >>> engine.register("wf", lambda ctx, numbers: None)
    >>> with engine:
    ...     try:
    ...         engine.invoke("wf", {1: "one"}, instance_id="i-1")
    ...     except SerializationError as err:
    ...         print(err.key, "|", err)  # doctest: +ELLIPSIS
    input | a dict would not come back equal (...): workflow 'wf', instance 'i-1', input
    """


class StepTimeout(EngineError):
    """A step ran past its timeout.

    >>> from memable import StepTimeout
    >>> print(StepTimeout("wf", "i-1", "slow", 0.5))
    timed out after 0.5 s: workflow 'wf', instance 'i-1', step 'slow'
    """

    def __init__(self, workflow: str, instance_id: str, key: str, seconds: float) -> None:
        super().__init__(f"timed out after {seconds:g} s", workflow=workflow,
                         instance_id=instance_id, key=key)


class SignalTimeout(EngineError):
    """No signal reached a suspend point by its deadline (``ctx.suspend(..., timeout=)``).

    >>> from memable import SignalTimeout
    >>> print(SignalTimeout("ship", "order-1", "approval:v1"))
    ... # doctest: +NORMALIZE_WHITESPACE
    no signal arrived before the deadline: workflow 'ship', instance 'order-1',
    step 'approval:v1'
    """

    def __init__(self, workflow: str, instance_id: str, key: str) -> None:
        super().__init__("no signal arrived before the deadline", workflow=workflow,
                         instance_id=instance_id, key=key)


class WorkflowFailed(EngineError):
    """``Invocation.result()`` found the instance Failed or Cancelled (``state``: the final one).

    >>> from memable import Engine, Failed, WorkflowFailed
    >>> def boom(ctx):
    ...     raise RuntimeError("boom")
    >>> engine = Engine.in_memory()
    >>> engine.register("boom", boom)
    >>> with engine:
    ...     try:
    ...         engine.invoke("boom").result()
    ...     except WorkflowFailed as err:
    ...         print(type(err.state).__name__, "boom" in str(err))
    Failed True
    """

    def __init__(self, workflow: str, instance_id: str, state: WorkflowState) -> None:
        super().__init__(f"instance ended {state}", workflow=workflow, instance_id=instance_id)
        self.state = state


class ChildFailed(WorkflowFailed):
    """A child workflow (``ctx.child``, ``ctx.children``) ended Failed or Cancelled.

    >>> from memable import ChildFailed, Failed
    >>> err = ChildFailed("resize", "order-1/thumb", Failed("boom"))
    >>> print(err)
    child ended failed: boom: workflow 'resize', instance 'order-1/thumb'
    >>> isinstance(err.state, Failed)
    True
    """

    def __init__(self, workflow: str, instance_id: str, state: WorkflowState) -> None:
        EngineError.__init__(self, f"child ended {state}", workflow=workflow,
                             instance_id=instance_id)
        self.state = state


class ChildIdTaken(EngineError):
    """A child's id ``"{parent id}/{key}"`` belongs to an instance that is not this child.

    Ids may hold ``/`` (``p`` with the key ``x/y`` and ``p/x`` with ``y`` both name ``p/x/y``),
    and a user may ``invoke`` any id: such an instance is never adopted; the step fails.

    >>> from memable._errors import ChildIdTaken
    >>> err = ChildIdTaken("upload", "p", "x/y", "resize", ("upload", "p/x", "y"))
    >>> for part in str(err).replace(" by ", " by; ").split("; "):
    ...     print(part)
    child id 'p/x/y' of workflow 'resize' is taken by
    the child of workflow 'upload', instance 'p/x' at key 'y'
    it is not adopted: workflow 'upload', instance 'p', step 'x/y'
    >>> print(ChildIdTaken("upload", "p", "x", "resize", None).args[0].split(";")[0])
    child id 'p/x' of workflow 'resize' is taken by an instance invoked on its own
    """

    def __init__(self, workflow: str, instance_id: str, key: str, child_workflow: str,
                 holder: tuple[str, str, str | None] | None) -> None:
        if holder is None:
            by = "an instance invoked on its own"
        else:
            by = (f"the child of workflow {holder[0]!r}, instance {holder[1]!r} "
                  f"at key {holder[2]!r}")
        super().__init__(
            f"child id {instance_id + '/' + key!r} of workflow {child_workflow!r} is taken by "
            f"{by}; it is not adopted", workflow=workflow, instance_id=instance_id, key=key,
        )
        self.key: str = key
        self.child_workflow = child_workflow
        #: (workflow, instance id, key) of the instance's own parent; None if it has none.
        self.holder = holder
