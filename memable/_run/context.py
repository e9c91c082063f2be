"""What a workflow function sees of its run: ``Context`` (its steps, waits and children)."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any, ParamSpec, TypeVar

import attrs

from .._errors import ChildFailed, ChildIdTaken, DuplicateStepKey, EngineError, SignalTimeout
from .._observe.base import RunTrace, Telemetry
from .._records import StepKind
from .._retry import Retry
from .._states import Failed, InProgress, WorkflowState
from .._store.protocol import RunStore
from .._store.rows import SETTLED, UNREACHED, InstanceRow, StepWrite, StoredStep, settled
from .._store.serde import decode_for, return_hint, store_form
from .._store.sql.children import TOLD
from .._validate import check_deadline, check_key, seconds_of
from .attempts import Attempts, NoRun, RunControl
from .children import ChildHost
from .control import Suspension
from .fan_out import check_concurrency, first_to_raise, run_items
from .invocation import state_of
from .options import Options
from .step import Step
from .workflow import Workflow, async_refusal, is_async

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


class Context:
    """The handle a workflow function gets for its run of one instance.

    A workflow is ``fn(ctx)`` or ``fn(ctx, input)``. The first run of a step key executes its
    function and stores the result; every later run of the instance returns the stored result.

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

    # Owned by the workflow function's thread, so unlocked; a map's threads share ``Attempts``.

    def __init__(
        self, *, workflow: str, instance_id: str, input: Any, store: RunStore,
        memo: dict[str, StoredStep], publish: Callable[[WorkflowState], None],
        run: RunControl | None = None, options: Options | None = None,
        flight_lock: threading.Lock | None = None, children: ChildHost | None = None,
        stored_status: str | None = None, trace: RunTrace | None = None,
        telemetry: Telemetry | None = None,
    ) -> None:
        options = options or Options()
        #: Stored steps this run returned without executing them (not signals, timers, children).
        self.replayed = 0
        self._children = children
        self._workflow = workflow
        self._instance_id = instance_id
        self._input = input
        self._store = store
        self._memo = memo
        self._publish = publish
        self._retry: Retry | None = options.retry
        self._clock = options.clock
        #: Runs the attempts of each executed step and stores their outcomes.
        self.attempts = Attempts(workflow=workflow, instance_id=instance_id, store=store,
            run=run or NoRun(), clock=options.clock, sleep=options.sleep, flight_lock=flight_lock,
            trace=trace, telemetry=telemetry)
        self._seen: set[str] = set()
        self._next_seq = max((s.seq for s in memo.values() if s.seq != UNREACHED), default=-1) + 1
        self._replaying = bool(memo)
        self._status: str | None = None
        self._stored_status = stored_status  # what the instance's row holds
        # The key, exception and attempts of the step that failed last, for Failed.
        self._failure: tuple[str, BaseException, int | None] | None = None

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

        While the run replays stored steps the status is set silently; the current one is
        published once when replay ends.

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
            self._store_status()
            self._publish(InProgress(message))

    def _store_status(self) -> None:
        """Store the status now, so an operator sees it while the next step runs (once)."""
        if self._status is not None and self._status != self._stored_status:
            self._store.set_status(self._workflow, self._instance_id, self._status)
            self._stored_status = self._status

    def step(self, key: str) -> Step:
        """Start building the step stored under ``key``; finish with ``.run(fn)``.

        Keys are non-empty ``str`` unique within the instance; keys starting with ``_`` are
        reserved. Version keys (``"charge:v2"``) when a step's meaning changes, so old stored
        results are not reused for it.

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

    def suspend(
        self, key: str, status: str | None = None, returns: Any = None,
        timeout: float | timedelta | None = None,
    ) -> Any:
        """Return the payload signalled to ``key``; until there is one, suspend the instance.

        Suspending ends the run ``Suspended(status or key)``, freeing its thread;
        ``engine.signal(name, id, key, payload)`` runs the instance again, and this call returns
        the payload, rebuilt as ``returns`` if given. A signal sent early is kept for the key.

        With ``timeout`` (seconds or a timedelta) the first run to reach the key stores a
        deadline; if no signal came by then, the key is recorded ``"timed_out"`` and this call
        raises ``SignalTimeout`` (in this run and every replay), which the workflow may catch.
        A signal that arrives first wins; one that comes after is rejected.

        >>> from memable import Engine, Suspended
        >>> def approval(ctx) -> str:
        ...     approved = ctx.suspend("approval:v1", status="waiting for a manager")
        ...     return "shipped" if approved else "cancelled"
        >>> engine = Engine.in_memory()
        >>> engine.register("approval", approval)
        >>> with engine:
        ...     inv = engine.invoke("approval")
        ...     print(inv.wait())
        ...     print(engine.signal("approval", inv.instance_id, "approval:v1", True).result())
        suspended: waiting for a manager
        shipped
        """
        key = check_key(key, self._workflow, self._instance_id)
        deadline = None if timeout is None else self._deadline(key, "suspend timeout", timeout)[1]
        self.attempts.boundary()
        self._claim(key)
        stored = self._arrived(key, "signal")
        if stored is not None and stored.state == "completed":
            if stored.seq == UNREACHED:  # signalled before the run got here: this is its place
                self._store.place_signal(self._workflow, self._instance_id, key, self._take_seq())
            return self._replayed(key, stored, returns)
        if stored is not None and stored.state == "timed_out":
            exc = SignalTimeout(self._workflow, self._instance_id, key)
            self._failure = (key, exc, None)
            raise exc
        # A signal (or deadline) arriving after this look is found by the transaction that
        # records the suspension, which then runs the instance again.
        self._end_replay()
        message = key if status is None else status
        raise Suspension(key, message, self._waiting(key, "signal", stored), deadline)

    def timer(self, key: str, duration: float | timedelta) -> None:
        """Wait ``duration`` (seconds or a timedelta) durably: return once the timer has fired.

        The first time the instance reaches ``key`` the deadline (now + duration, wall clock) is
        stored and the run ends ``Suspended("timer <key>")``, freeing its worker thread; the
        instance runs again when it is due. Later runs do not move the deadline.

        >>> from datetime import timedelta
        >>> from memable import Engine
        >>> def reminder(ctx) -> str:
        ...     ctx.timer("cool-off:v1", timedelta(hours=1))
        ...     return "reminded"
        >>> engine = Engine.in_memory()
        >>> engine.register("reminder", reminder)
        >>> with engine:
        ...     inv = engine.invoke("reminder")
        ...     print(inv.wait())
        ...     print(engine.get_metadata("reminder", inv.instance_id).status)
        suspended: timer cool-off:v1
        MetadataStatus.Suspended(message='timer cool-off:v1')
        """
        key = check_key(key, self._workflow, self._instance_id)
        seconds, deadline = self._deadline(key, "timer duration", duration)
        self.attempts.boundary()
        self._claim(key)
        # A due timer needs no second look: recording it fires it at once.
        stored = self._arrived(key, "timer", reread=seconds > 0)
        if stored is not None and stored.state == "completed":
            self._replayed(key, stored, None)
            return
        self._end_replay()
        raise Suspension(key, f"timer {key}", self._waiting(key, "timer", stored), deadline)

    def child(
        self, key: str, workflow: str, input: Any = None, *, returns: Any = None,
        queue: str | None = None,
    ) -> Any:
        """Run ``workflow`` as a child instance and return its output.

        The child's id is ``"{this instance's id}/{key}"``: the first run to reach ``key``
        creates it in the transaction that records this step (kind ``"child"``), so a crash
        never makes two. Until the child ends, this run ends ``Suspended("child <key>")`` and
        holds no thread; the child's end stores its output as this step's result (rebuilt as
        ``returns``, else the child workflow's return annotation) and runs this instance again.
        A child that ends Failed or Cancelled raises ``ChildFailed`` here (the workflow may
        catch it); a later run resumes a Failed child and waits again. The workflow must be
        registered in this engine (else ``WorkflowNotFound``).

        >>> from memable import Context, Engine
        >>> def resize(ctx: Context, name: str) -> str:
        ...     return ctx.step("resize:v1").run(lambda: f"thumbs/{name}")
        >>> def upload(ctx: Context, name: str) -> str:
        ...     thumb = ctx.child("thumb:v1", "resize", name)
        ...     return f"uploaded {thumb}"
        >>> engine = Engine.in_memory()
        >>> engine.register("resize", resize)
        >>> engine.register("upload", upload)
        >>> with engine:
        ...     print(engine.invoke("upload", "a.png", instance_id="u-1").result())
        ...     print(engine.get_metadata("resize", "u-1/thumb:v1").parent)
        uploaded thumbs/a.png
        ('upload', 'u-1')
        """
        key = check_key(key, self._workflow, self._instance_id)
        return self._follow_children(key, workflow, [input], returns=returns, group=False,
                      queue=queue)[0]

    def children(
        self, key: str, workflow: str, inputs: Iterable[Any], *, returns: Any = None,
        queue: str | None = None,
    ) -> list[Any]:
        """Run ``workflow`` once per input as child instances; their outputs, in input order.

        Child ``i`` is the step ``"{key}[{i}]"`` and the instance
        ``"{this instance's id}/{key}[{i}]"``; they run side by side. This run ends
        ``Suspended("children <key>")`` until all have ended; then the first by index that ended
        Failed or Cancelled raises ``ChildFailed``. Otherwise as ``child``.

        >>> from memable import Context, Engine
        >>> def square(ctx: Context, n: int) -> int:
        ...     return n * n
        >>> def total(ctx: Context, n: int) -> int:
        ...     return sum(ctx.children("squares:v1", "square", range(n)))
        >>> engine = Engine.in_memory()
        >>> engine.register("square", square)
        >>> engine.register("total", total)
        >>> with engine:
        ...     inv = engine.invoke("total", 4)
        ...     print(inv.result())
        ...     print([r.key for r in engine.steps("total", inv.instance_id)])
        14
        ['squares:v1[0]', 'squares:v1[1]', 'squares:v1[2]', 'squares:v1[3]']
        """
        key = check_key(key, self._workflow, self._instance_id)
        return self._follow_children(key, workflow, list(inputs), returns=returns, group=True,
                      queue=queue)

    # A failed child step's ``result`` says whether the parent was told (``TOLD``): the run
    # that finds it untold raises ``ChildFailed``; a later run resumes a Failed child or
    # raises again for a Cancelled one, as it would rerun any failed step the workflow caught.

    def _follow_children(
        self, key: str, workflow: str, inputs: list[Any], *, returns: Any, group: bool,
        queue: str | None = None,
    ) -> list[Any]:
        """The outputs of the children of ``key`` (``group``: ``ctx.children``), in order."""
        host = self._children
        if host is None:
            raise EngineError("child workflows need a run of an engine",
                              workflow=self._workflow, instance_id=self._instance_id, key=key)
        child_workflow = host.workflow(workflow)
        queue = host.queue_of(child_workflow, queue)
        self.attempts.boundary()
        keys = [f"{key}[{i}]" for i in range(len(inputs))] if group else [key]
        for k in keys:
            self._claim(k)
        # A lone child may have ended since the run read its steps: look again.
        rows = [self._arrived(k, "child", reread=not group) for k in keys]
        hint = returns if returns is not None else child_workflow.output_hint
        results: list[Any] = [None] * len(keys)
        to_start: list[int] = []
        to_resume: list[int] = []
        failures: list[tuple[int, ChildFailed, bool]] = []  # (index, error, told already)
        waiting = False
        for i, (k, row) in enumerate(zip(keys, rows, strict=True)):
            child_id = f"{self._instance_id}/{k}"
            if row is None:
                to_start.append(i)
            elif row.state == "completed":
                results[i] = self._replayed(k, row, hint)
            elif not settled(row.kind, row.state):
                waiting = True
            else:  # failed: told (run it again, unless cancelled) or not yet
                child = host.instance(workflow, child_id)
                if child is not None and not self._is_child(child, k):
                    # Another instance took its id: starting it fails while that one holds it.
                    to_start.append(i)
                    continue
                gone = Failed("the child instance is gone")
                error = ChildFailed(workflow, child_id, state_of(child) if child else gone)
                told = row.result == TOLD
                if told and child is not None and child.status != "cancelled":
                    to_resume.append(i)
                else:
                    failures.append((i, error, told))
        if not (to_start or to_resume or waiting):
            if failures:
                for i, error, told in failures:
                    if not told:
                        self._tell_parent(keys[i], rows[i], error)
                i, error, _ = failures[0]
                self._note(keys[i], error, None)
                raise error
            return results
        self._end_replay()
        seqs = {i: row.seq for i, row in enumerate(rows) if row is not None}
        if to_start:
            seqs.update(self._start_children(child_workflow, keys, inputs, to_start,
                                             key if group else None, queue))
        for i in to_resume:
            self.attempts.store.save_step(self._child_write(keys[i], seqs[i], "waiting"))
            host.resume(child_workflow, f"{self._instance_id}/{keys[i]}")
        if group:
            wait = attrs.evolve(self._child_write(key, 0, "waiting"), kind="children")
            raise Suspension(key, f"children {key}", wait)
        raise Suspension(key, f"child {key}", self._child_write(key, seqs[0], "waiting"))

    def _start_children(
        self, workflow: Workflow, keys: list[str], inputs: list[Any], indexes: list[int],
        group: str | None, queue: str | None,
    ) -> dict[int, int]:
        """Create and run the children at ``indexes``; the seq of each one's step, by index."""
        children = []
        waits = []
        seqs = {}
        for i in indexes:
            child_id = f"{self._instance_id}/{keys[i]}"
            value = inputs[i]
            if value is not None and not workflow.takes_input:
                raise workflow.no_input(value)
            text, tag, rebuilt = store_form(workflow.name, child_id, "input", value,
                                            workflow.input_hint)
            children.append((child_id, keys[i], (text, tag), rebuilt))
            seqs[i] = self._take_seq()
            waits.append(self._child_write(keys[i], seqs[i], "waiting"))
        assert self._children is not None
        try:
            self._children.start(workflow, waits, children, group, queue)
        except ChildIdTaken as taken:  # nothing of the start was written: record the step failed
            i = keys.index(taken.key)
            failed = attrs.evolve(self._child_write(taken.key, seqs[i], "failed"),
                                  error=f"{type(taken).__name__}: {taken}")
            self.attempts.store.save_step(failed)
            self._note(taken.key, taken, None)
            raise
        return seqs

    def _is_child(self, row: InstanceRow, key: str) -> bool:
        """Whether ``row`` is the child this run's instance started at ``key``."""
        return (row.parent_workflow, row.parent_id, row.parent_key) == (
            self._workflow, self._instance_id, key)

    def _child_write(self, key: str, seq: int, state: str) -> StepWrite:
        return attrs.evolve(self.attempts.write(key, seq, state, self._status), kind="child")

    def _tell_parent(self, key: str, row: StoredStep | None, error: ChildFailed) -> None:
        """Record that the parent was told of its child's failure."""
        assert row is not None
        told = attrs.evolve(self._child_write(key, row.seq, "failed"), result=TOLD,
                            error=f"{type(error).__name__}: {error}")
        self.attempts.store.save_step(told)

    def _deadline(self, key: str, what: str, duration: object) -> tuple[float, float]:
        """``duration`` in seconds and the wall-clock deadline; a bad one fails the step."""
        what = f"{what} of {key!r}"
        try:
            seconds = seconds_of(duration, what)
            return seconds, check_deadline(self._clock.wall() + seconds, what, duration)
        except (TypeError, ValueError) as exc:
            self._note(key, exc, None)
            raise

    def _end_replay(self) -> None:
        """Leave replay: store and publish the current status; later ones are live."""
        if self._replaying:
            self._replaying = False
            if self._status is not None:
                self._store_status()
                self._publish(InProgress(self._status))

    def _failure_message(self, exc: BaseException) -> str:
        """The Failed message for ``exc`` escaping the workflow."""
        error = f"{type(exc).__name__}: {exc}"
        if self._failure is not None and self._failure[1] is exc:
            key, _, attempts = self._failure
            plural = "" if attempts == 1 else "s"
            after = "" if attempts is None else f" after {attempts} attempt{plural}"
            return f"step {key!r} failed{after}: {error}"
        return f"workflow raised {error}"

    def _claim(self, key: str) -> None:
        if key in self._seen:
            exc = DuplicateStepKey(self._workflow, self._instance_id, key)
            self._failure = (key, exc, None)
            raise exc
        self._seen.add(key)

    def _note(self, key: str, exc: BaseException, attempts: int | None) -> None:
        """Note the step whose error may end the run (for its Failed message)."""
        self._failure = (key, exc, attempts)

    def _stored_step(self, key: str) -> StoredStep | None:
        """The memo of a step's key; a row of another kind fails it."""
        stored = self._memo.get(key)
        if stored is not None and stored.kind != "step":
            self.attempts.refuse_kind(key, stored.kind, "step", self._note)
        return stored

    def _refuse_async(self, key: str, fn: object) -> None:
        """Refuse an async step function: it would return a coroutine, not a value."""
        if is_async(fn):
            exc = async_refusal(
                f"the function of step {key!r} (workflow {self._workflow!r}, instance "
                f"{self._instance_id!r})", fn)
            self._note(key, exc, None)
            raise exc

    def _run_step(
        self, step: Step, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        key = step.key
        self._refuse_async(key, fn)
        self.attempts.boundary()
        self._claim(key)
        stored = self._stored_step(key)
        hint = step.result_type if step.result_type is not None else return_hint(fn)
        if stored is not None and stored.state == "completed":
            return self._replayed(key, stored, hint)
        self._end_replay()
        seq = stored.seq if stored is not None else self._take_seq()
        return self.attempts.execute(key, seq, stored, hint=hint, policy=self._policy(step),
            timeout=step.timeout_seconds, call=functools.partial(fn, *args, **kwargs),
            status=self._status, note=self._note)

    def _map_step(
        self, step: Step, fn: Callable[[T], Any], items: Iterable[T], max_concurrency: int
    ) -> list[Any]:
        """``ctx.step(key).map``: each item a step ``"{key}[{i}]"``, run side by side."""
        check_concurrency(max_concurrency)
        self._refuse_async(step.key, fn)
        items = list(items)
        self.attempts.boundary()
        keys = [f"{step.key}[{i}]" for i in range(len(items))]
        for key in keys:
            self._claim(key)
        stored = [self._stored_step(key) for key in keys]
        hint = step.result_type if step.result_type is not None else return_hint(fn)
        results: list[Any] = [None] * len(items)
        pending: list[int] = []
        for i, (key, row) in enumerate(zip(keys, stored, strict=True)):
            if row is not None and row.state == "completed":
                results[i] = self._replayed(key, row, hint)
            else:
                pending.append(i)
        if not pending:
            return results
        self._end_replay()
        # Seqs in item order, whichever item ends first.
        seqs = {i: stored[i].seq if stored[i] is not None else self._take_seq()  # type: ignore[union-attr]
                for i in pending}
        notes: dict[int, tuple[str, BaseException, int | None]] = {}
        policy, status = self._policy(step), self._status

        def item(i: int) -> Callable[[], Any]:
            def note(key: str, exc: BaseException, attempts: int | None) -> None:
                notes[i] = (key, exc, attempts)  # this item's thread alone writes notes[i]

            return lambda: self.attempts.execute(keys[i], seqs[i], stored[i], hint=hint,
                policy=policy, timeout=step.timeout_seconds, call=functools.partial(fn, items[i]),
                status=status, note=note)

        name = f"memable-map {self._workflow}/{self._instance_id}/{step.key}"
        outcomes = run_items([item(i) for i in pending], max_concurrency, name)
        errors = [exc for _, exc in outcomes]
        chosen = first_to_raise(errors)
        if chosen is not None:
            exc = errors[chosen]
            assert exc is not None
            noted = notes.get(pending[chosen])
            if noted is not None and noted[1] is exc:
                self._failure = noted
            raise exc
        for i, (value, _) in zip(pending, outcomes, strict=True):
            results[i] = value
        return results

    def _policy(self, step: Step) -> Retry | None:
        return step.retry_policy if step.retry_policy is not None else self._retry

    def _arrived(self, key: str, kind: StepKind, reread: bool = True) -> StoredStep | None:
        """The stored row of a wait, read again (``reread``) if unsettled, as a read is cheaper
        than suspending; a row of another kind fails the run."""
        stored = self._memo.get(key)
        if reread and (stored is None or stored.state not in SETTLED):
            stored = self._store.read_step(self._workflow, self._instance_id, key) or stored
        if stored is not None and stored.kind != kind:
            self.attempts.refuse_kind(key, stored.kind, kind, self._note)
        return stored

    def _replayed(self, key: str, stored: StoredStep, hint: Any) -> Any:
        if stored.kind == "step":  # a stored step's result, not a signal's or timer's
            self.replayed += 1
        if stored.status is not None:
            self._status = stored.status  # restored silently, like the replayed set_status
        try:
            return decode_for(self._workflow, self._instance_id, key, stored.result or "null",
                stored.result_type, hint)
        except EngineError as exc:
            self._failure = (key, exc, None)
            raise

    def _waiting(self, key: str, kind: StepKind, stored: StoredStep | None) -> StepWrite:
        seq = stored.seq if stored is not None else self._take_seq()
        return attrs.evolve(self.attempts.write(key, seq, "waiting", self._status), kind=kind)

    def _take_seq(self) -> int:
        seq = self._next_seq
        self._next_seq += 1
        return seq
