"""Following an instance: the shared ``Watch`` and the ``Invocation`` handle on it."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Protocol

from .. import _clock
from .._errors import WorkflowFailed
from .._states import Cancelled, Completed, Failed, Queued, Started, Suspended, WorkflowState
from .._store.rows import InstanceRow
from .._validate import seconds_of


def state_of(row: InstanceRow) -> WorkflowState:
    """The WorkflowState a stored instance row stands for."""
    if row.status in ("suspended", "failed"):
        return (Suspended if row.status == "suspended" else Failed)(row.message or "")
    return {"queued": Queued(), "running": Started(), "completed": Completed()}.get(
        row.status, Cancelled())


def _remaining(timeout: float | timedelta | None) -> Callable[[], float | None]:
    """The seconds left, when called, of a wait of ``timeout`` from now (None: no end)."""
    if timeout is None:
        return lambda: None
    deadline = _clock.monotonic() + seconds_of(timeout, "timeout")
    return lambda: max(0.0, deadline - _clock.monotonic())


class Host(Protocol):
    """What an Invocation needs of its engine."""

    @property
    def _poll_interval(self) -> float: ...

    def _stored_row(self, workflow: str, instance_id: str) -> InstanceRow: ...

    def _decode_output(
        self, workflow: str, instance_id: str, output: str | None, output_type: str | None
    ) -> Any: ...


class Watch:
    """The live state of one instance in this engine, shared by its runs and Invocations: one
    per instance while anything refers to it (a weak dictionary), so every Invocation of an
    instance sees every run of it."""

    def __init__(self, workflow: str, instance_id: str) -> None:
        self.workflow = workflow
        self.instance_id = instance_id
        # cond guards every field below; runs notify it on each transition.
        self.cond = threading.Condition()
        self.active = False  # a run of the instance is in progress in this engine
        self.begun = 0  # number of runs that have begun
        # The active run's last state; None while its claim is in flight (the store's holds).
        self.live: WorkflowState | None = Started()
        self.last_end: WorkflowState | None = None  # state the latest run ended in
        self.ended = 0  # number of runs that have ended
        # The output a run here stored with a Completed end it recorded (text, type tag).
        self.output: tuple[str, str | None] | None = None
        self.subscribers: list[deque[tuple[WorkflowState, bool]]] = []
        # Times the row was said to change (a cancel, here or elsewhere): store waits reread now.
        self.stored = 0

    def changed(self) -> None:
        """The stored row changed: whatever waits on the store looks again."""
        with self.cond:
            self.stored += 1
            self.cond.notify_all()

    def begin(self, claimed: bool) -> None:
        """A run starts, its claim made (``claimed``) or to come (Started at ``claimed()``)."""
        with self.cond:
            self.active = True
            self.begun += 1
            self.live = Started() if claimed else None
            self.cond.notify_all()

    def claimed(self) -> None:
        """The active run's claim committed: the instance is Started here."""
        with self.cond:
            if self.live is None:
                self.live = Started()

    def publish(self, state: WorkflowState) -> None:
        """The active run reports ``state``."""
        with self.cond:
            self.live = state
            for queue in self.subscribers:
                queue.append((state, False))
            self.cond.notify_all()

    def finish(
        self, state: WorkflowState | None, output: tuple[str, str | None] | None = None
    ) -> None:
        """The active run ended in ``state`` (stored), with ``output`` if Completed; None: it
        stopped unrecorded (the store failed), and watchers follow the store."""
        with self.cond:
            if state is not None:
                self.live = state
            self.last_end = state
            self.output = output if isinstance(state, Completed) else None
            self.ended += 1
            # A run that goes on after this one (a signal or timer came while it ran) begins
            # before this one finishes: the instance stays active.
            self.active = self.begun > self.ended
            for queue in self.subscribers:
                queue.append((state or self.live or Started(), True))
            # Each subscription follows one run; this one is over for all of them.
            self.subscribers = []
            self.cond.notify_all()


class Invocation:
    """A handle that follows one instance through all of its runs.

    Returned by ``invoke``, ``resume``, ``signal`` and ``engine.invocation``.

    >>> from memable import Completed, Engine
    >>> engine = Engine.in_memory()
    >>> engine.register("greet", lambda ctx: "hi")
    >>> with engine:
    ...     inv = engine.invoke("greet", instance_id="greet-1")
    ...     print(inv.instance_id, inv.wait(), inv.result())
    greet-1 completed hi
    """

    def __init__(self, host: Host, watch: Watch) -> None:
        self._host = host
        self._watch = watch

    def __repr__(self) -> str:
        return (f"<Invocation workflow={self._watch.workflow!r} "
                f"instance_id={self._watch.instance_id!r} state={self.state}>")

    @property
    def workflow_name(self) -> str:
        """The workflow the instance belongs to.

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", lambda ctx: None)
        >>> with engine:
        ...     engine.invoke("wf").workflow_name
        'wf'
        """
        return self._watch.workflow

    @property
    def instance_id(self) -> str:
        """The instance's id.

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", lambda ctx: None)
        >>> with engine:
        ...     engine.invoke("wf", instance_id="job-7").instance_id
        'job-7'
        """
        return self._watch.instance_id

    @property
    def state(self) -> WorkflowState:
        """The current state: the live one while a run is active, else the stored one.

        >>> from memable import Completed, Engine
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", lambda ctx: None)
        >>> with engine:
        ...     inv = engine.invoke("wf")
        ...     _ = inv.wait()
        ...     inv.state == Completed()
        True
        """
        with self._watch.cond:
            if self._watch.active and self._watch.live is not None:
                return self._watch.live
        return state_of(self._row())

    def wait(self, timeout: float | timedelta | None = None) -> WorkflowState:
        """Wait for the current run to end; return the state it ended in.

        That is Completed, Failed, Cancelled, or Suspended for a run that waits on a timer or
        signal; never Started. With no run active, return the stored state at once, unless
        another engine is running the instance: then wait for that run to end. Raise
        ``TimeoutError`` if the run has not ended in ``timeout`` seconds.

        >>> from memable import Engine, Failed
        >>> def wf(ctx):
        ...     ctx.step("boom").run(lambda: 1 / 0)
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", wf)
        >>> with engine:
        ...     engine.invoke("wf").wait()
        Failed(message="step 'boom' failed: ZeroDivisionError: division by zero")
        """
        watch = self._watch
        remaining = _remaining(timeout)
        while True:
            left = remaining()
            with watch.cond:
                stored = watch.stored  # before the read: a change after it ends the wait
                if watch.active:
                    ended = watch.ended
                    if not watch.cond.wait_for(
                        lambda seen=ended: watch.ended != seen,  # type: ignore[misc]
                        left,
                    ):
                        break
                    if watch.begun > watch.ended:
                        continue  # another run of it began before this one ended: its end
                    if watch.last_end is not None:
                        return watch.last_end
                    continue  # the run here stopped unrecorded: follow the store
            row = self._row()
            if row.status not in ("running", "queued"):
                return state_of(row)
            # Running elsewhere (or a run here is about to begin), or queued: look again when
            # a run here begins or ends, when the row is said to have changed, or after a poll.
            if left == 0.0:
                break
            poll = self._host._poll_interval
            with watch.cond:
                watch.cond.wait_for(
                    lambda seen=watch.ended, told=stored: (  # type: ignore[misc]
                        watch.ended != seen or watch.active or watch.stored != told),
                    poll if left is None else min(left, poll))
        raise TimeoutError(f"run of workflow {watch.workflow!r}, instance "
            f"{watch.instance_id!r} did not end within {timeout} s")

    def result(self, timeout: float | timedelta | None = None) -> Any:
        """Wait until the instance is terminal and return its output.

        Follows the instance through suspensions and the runs timers and signals start; the
        output is rebuilt as the workflow's return annotation says. Raise ``WorkflowFailed``
        if it ended Failed or Cancelled, ``TimeoutError`` if not terminal in time.

        >>> from memable import Engine
        >>> def add(ctx, numbers: list[int]) -> int:
        ...     return ctx.step("sum:v1").run(sum, numbers)
        >>> engine = Engine.in_memory()
        >>> engine.register("add", add)
        >>> with engine:
        ...     engine.invoke("add", [1, 2, 3]).result(timeout=10)
        6
        """
        watch = self._watch
        remaining = _remaining(timeout)
        while True:
            with watch.cond:
                if not watch.cond.wait_for(lambda: not watch.active, remaining()):
                    break
                # ``stored`` before the read: a change after it ends the wait below.
                ended, output, stored = watch.ended, watch.output, watch.stored
            if output is not None:  # a run here stored it: a terminal state, for good
                return self._host._decode_output(watch.workflow, watch.instance_id, *output)
            row = self._row()
            state = state_of(row)
            if state.is_terminal:
                if isinstance(state, Completed):
                    return self._host._decode_output(
                        row.workflow, row.instance_id, row.output, row.output_type)
                raise WorkflowFailed(watch.workflow, watch.instance_id, state)
            left = remaining()
            if left == 0.0:
                break
            # Wake when a run here ends or the row changed, or poll for other processes' writes.
            poll = self._host._poll_interval
            with watch.cond:
                watch.cond.wait_for(
                    lambda seen=ended, told=stored: (  # type: ignore[misc]
                        watch.ended != seen or watch.stored != told),
                    poll if left is None else min(left, poll))
        raise TimeoutError(f"workflow {watch.workflow!r}, instance {watch.instance_id!r} "
            f"is not terminal after {timeout} s")

    def updates(self) -> Iterator[WorkflowState]:
        """Yield each live transition of the current run; the last is the state it ended in.

        On a run that already ended, yield the stored state once.

        >>> from memable import Engine
        >>> def wf(ctx):
        ...     ctx.set_status("one")
        ...     ctx.step("s1").run(lambda: 1)
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", wf)
        >>> with engine:
        ...     inv = engine.invoke("wf")
        ...     _ = inv.wait()
        ...     [str(state) for state in inv.updates()]
        ['completed']
        """
        watch = self._watch
        queue: deque[tuple[WorkflowState, bool]] = deque()
        # Subscribe now, not at the first next(): transitions from this call on count.
        with watch.cond:
            following = watch.active
            if following:
                watch.subscribers.append(queue)
        if not following:
            return iter([self.state])
        return self._follow(queue)

    def _follow(self, queue: deque[tuple[WorkflowState, bool]]) -> Iterator[WorkflowState]:
        watch = self._watch
        try:
            while True:
                with watch.cond:
                    watch.cond.wait_for(lambda: bool(queue))
                    items = list(queue)
                    queue.clear()
                for state, last in items:
                    yield state
                    if last:
                        return
        finally:
            with watch.cond:
                # By identity: deques compare by content, and empty ones are all equal.
                watch.subscribers = [q for q in watch.subscribers if q is not queue]

    def _row(self) -> InstanceRow:
        return self._host._stored_row(self._watch.workflow, self._watch.instance_id)

