"""What an engine's Invocations read of its store: an instance's row, its typed output."""

from __future__ import annotations

from typing import Any

from .._errors import InstanceNotFound
from .._run.workflow import Workflow
from .._store.protocol import RunStore
from .._store.rows import InstanceRow
from .._store.serde import decode_for


def stored_row(store: RunStore, workflow: str, instance_id: str) -> InstanceRow:
    """The instance's row; raise InstanceNotFound if there is none.

    >>> from memable._sqlite.store import SQLiteStore
    >>> store = SQLiteStore(None, "full")
    >>> stored_row(store, "wf", "nope")
    Traceback (most recent call last):
    ...
    memable._errors.InstanceNotFound: no stored instance: workflow 'wf', instance 'nope'
    >>> store.close()
    """
    row = store.get_instance(workflow, instance_id)
    if row is None:
        raise InstanceNotFound(workflow, instance_id)
    return row


def decode_output(workflows: dict[str, Workflow], workflow: str, instance_id: str,
                  output: str | None, output_type: str | None) -> Any:
    """The stored output of a Completed instance, rebuilt as its workflow returns it.

    >>> decode_output({}, "wf", "i-1", '{"n": 1}', None)
    {'n': 1}
    """
    registered = workflows.get(workflow)
    hint = registered.output_hint if registered is not None else None
    return decode_for(workflow, instance_id, "output", output or "null", output_type, hint)
