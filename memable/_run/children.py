"""Child workflows, as a parent's run starts and follows them (``ctx.child``, ``ctx.children``).

The store's ``finish`` settles a parent's step when a child ends."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from .._clock import Clock, utc
from .._errors import WorkflowNotFound
from .._observe.base import Telemetry
from .._queues import QueueSpec
from .._store.protocol import RunStore
from .._store.rows import InstanceRow, StepWrite
from .workflow import Made, Workflow


class Submit(Protocol):
    """Submits a run of an instance here: (workflow, id, fresh input or None)."""

    def __call__(
        self, workflow: Workflow, instance_id: str, fresh_input: tuple[Any] | None, *,
        traceparent: str | None = None,
    ) -> None: ...


class ChildHost(Protocol):
    """What a run needs of its engine to start and follow children."""

    def workflow(self, name: str) -> Workflow:
        """The registered workflow ``name``; ``WorkflowNotFound`` if there is none."""

    def start(
        self, workflow: Workflow, waits: list[StepWrite],
        children: list[tuple[str, str, tuple[str, str | None], Any]], group: str | None,
        queue: str | None = None,
    ) -> None:
        """Create the children that do not exist yet and run them here (or queue them).
        ``children``: (child id, the parent's key for it, stored input, input value);
        ``waits``: the parent's steps for them, written with them."""

    def queue_of(self, workflow: Workflow, queue: str | None) -> str | None:
        """The queue a child runs through (``ValueError`` for one not declared)."""

    def resume(self, workflow: Workflow, child_id: str) -> None:
        """Run a child that ended failed again (here, unless another engine runs it)."""

    def instance(self, workflow: str, child_id: str) -> InstanceRow | None:
        """A child's stored row."""


class Children:
    """The engine's side of ``ChildHost``.

    >>> from memable._sqlite.store import SQLiteStore
    >>> store = SQLiteStore(None, "full")
    >>> from memable._clock import SYSTEM_CLOCK
    >>> host = Children({}, store, lambda workflow, instance_id, fresh: None, SYSTEM_CLOCK)
    >>> host.workflow("resize")
    Traceback (most recent call last):
    ...
    memable._errors.WorkflowNotFound: no workflow registered under this name: workflow 'resize'
    >>> store.close()
    """

    def __init__(
        self, workflows: dict[str, Workflow], store: RunStore, submit: Submit, clock: Clock,
        queues: dict[str, QueueSpec] | None = None, kick: Callable[[], None] | None = None,
        telemetry: Telemetry | None = None,
        start_made: Callable[[Callable[[], Iterable[Made]]], object] | None = None,
    ) -> None:
        self._telemetry = telemetry or Telemetry()  # a span for each child started
        # Makes children owned here and starts their runs, as one call (Claims.start_made).
        self._start_made = start_made or self._submit_made
        # The runner's registry and declared queues: fixed once the engine started.
        self._workflows = workflows
        self._queues = queues if queues is not None else {}
        self._store = store
        self._submit = submit
        self._clock = clock  # the engine's: dates the children and their waits
        self._kick = kick  # the queue thread looks now

    def workflow(self, name: str) -> Workflow:
        workflow = self._workflows.get(name)
        if workflow is None:
            raise WorkflowNotFound(name)
        return workflow

    def queue_of(self, workflow: Workflow, queue: str | None) -> str | None:
        """The queue a child runs through: ``queue``, else its workflow's default one."""
        chosen = queue if queue is not None else workflow.queue
        if chosen is not None and chosen not in self._queues:
            raise ValueError(f"queue {chosen!r} is not declared (engine.queue(name, ...))")
        return chosen

    def start(
        self, workflow: Workflow, waits: list[StepWrite],
        children: list[tuple[str, str, tuple[str, str | None], Any]], group: str | None,
        queue: str | None = None,
    ) -> None:
        parent = waits[0]
        started = utc(self._clock)
        now = started.isoformat()
        timeout_at = None if workflow.timeout is None else started.timestamp() + workflow.timeout
        rows = []
        for child_id, key, (text, tag), _ in children:
            with self._telemetry.producing(workflow.name, instance_id=child_id) as traceparent:
                rows.append(InstanceRow(workflow=workflow.name, instance_id=child_id,
                    status="running" if queue is None else "queued", message=None, input=text,
                    input_type=tag, output=None, output_type=None, created_at=now, updated_at=now,
                    completed_at=None, parent_workflow=parent.workflow,
                    parent_id=parent.instance_id, parent_key=key, parent_group=group, queue=queue,
                    priority=None if queue is None else 0,
                    queued_at=None if queue is None else now, traceparent=traceparent,
                    timeout=workflow.timeout, timeout_at=timeout_at))
        def make() -> list[Made]:
            created = set(self._store.start_children(waits, rows))
            if queue is not None:  # they wait for slots; whichever engine consumes it runs them
                if created and self._kick is not None:
                    self._kick()
                return []
            return [(workflow, child_id, (value,), row.traceparent, None)
                    for row, (child_id, _, _, value) in zip(rows, children, strict=True)
                    if child_id in created]

        self._start_made(make)

    def _submit_made(self, make: Callable[[], Iterable[Made]]) -> None:
        """Without a runner's ``start_made``: submit each run ``make`` made."""
        for workflow, child_id, fresh_input, traceparent, _ in make():
            self._submit(workflow, child_id, fresh_input, traceparent=traceparent)

    def resume(self, workflow: Workflow, child_id: str) -> None:
        self._submit(workflow, child_id, None)

    def instance(self, workflow: str, child_id: str) -> InstanceRow | None:
        return self._store.get_instance(workflow, child_id)
