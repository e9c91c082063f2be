"""Child workflows, as a parent's run starts and follows them (``ctx.child``, ``ctx.children``).

``ChildHost`` is what a Context asks of its engine: the registered workflow
of a child, creating children (in one transaction with the parent's steps
that wait for them) and starting their runs here, and resuming one. The
engine side is ``Children``, given the runner's registry, store and a way to
submit runs; the store's ``finish`` is what settles a parent's step when a
child ends (see ``_children_sql``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from ._errors import WorkflowNotFound
from ._store import InstanceRow, StepWrite, Store, utcnow
from ._workflow import Workflow

#: Submits a run of an instance here: (workflow, id, fresh input or None).
Submit = Callable[[Workflow, str, "tuple[Any] | None"], None]


class ChildHost(Protocol):
    """What a run needs of its engine to start and follow children."""

    def workflow(self, name: str) -> Workflow:
        """The registered workflow ``name``; ``WorkflowNotFound`` if there is none."""

    def start(
        self, workflow: Workflow, waits: list[StepWrite],
        children: list[tuple[str, str, tuple[str, str | None], Any]], group: str | None,
    ) -> None:
        """Create the children that do not exist yet and run them here.

        ``children``: (child id, the parent's key for it, stored input, input
        value); ``waits``: the parent's steps for them, written with them.
        """

    def resume(self, workflow: Workflow, child_id: str) -> None:
        """Run a child that ended failed again (here, unless another engine runs it)."""

    def instance(self, workflow: str, child_id: str) -> InstanceRow | None:
        """A child's stored row."""


class Children:
    """The engine's side of ``ChildHost``.

    >>> from memable._sqlite import SQLiteStore
    >>> store = SQLiteStore(None, "full")
    >>> host = Children({}, store, lambda workflow, instance_id, fresh: None)
    >>> host.workflow("resize")
    Traceback (most recent call last):
    ...
    memable._errors.WorkflowNotFound: no workflow registered under this name: workflow 'resize'
    >>> store.close()
    """

    def __init__(self, workflows: dict[str, Workflow], store: Store, submit: Submit) -> None:
        self._workflows = workflows  # the runner's registry: fixed once the engine started
        self._store = store
        self._submit = submit

    def workflow(self, name: str) -> Workflow:
        workflow = self._workflows.get(name)
        if workflow is None:
            raise WorkflowNotFound(name)
        return workflow

    def start(
        self, workflow: Workflow, waits: list[StepWrite],
        children: list[tuple[str, str, tuple[str, str | None], Any]], group: str | None,
    ) -> None:
        parent = waits[0]
        now = utcnow().isoformat()
        rows = [
            InstanceRow(
                workflow=workflow.name, instance_id=child_id, status="running",
                message=None, input=text, input_type=tag, output=None, output_type=None,
                created_at=now, updated_at=now, completed_at=None,
                parent_workflow=parent.workflow, parent_id=parent.instance_id,
                parent_key=key, parent_group=group,
            )
            for child_id, key, (text, tag), _ in children
        ]
        created = set(self._store.start_children(waits, rows))
        for child_id, _, _, value in children:
            if child_id in created:
                self._submit(workflow, child_id, (value,))

    def resume(self, workflow: Workflow, child_id: str) -> None:
        self._submit(workflow, child_id, None)

    def instance(self, workflow: str, child_id: str) -> InstanceRow | None:
        return self._store.get_instance(workflow, child_id)
