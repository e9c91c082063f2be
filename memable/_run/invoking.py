"""What ``invoke`` stores: a new instance's row, from its workflow and the caller's input."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .._clock import Clock, utc
from .._queues import QueueSpec, check_priority
from .._store.rows import InstanceRow
from .._store.serde import store_form
from .._validate import check_deadline, check_key, positive_seconds
from .run import new_instance_id
from .workflow import Workflow


class _NoInput:
    """The default of ``invoke``'s input: none given (``None`` is a value)."""

    def __repr__(self) -> str:
        return "<no input>"


NO_INPUT: Any = _NoInput()


def new_instance(
    workflow: Workflow, input: Any, instance_id: str | None, queue: str | None, priority: int,
    queues: dict[str, QueueSpec], *, timeout: float | timedelta | None = None,
    concurrency_key: str | None = None, clock: Clock,
) -> tuple[InstanceRow, Any]:
    """The row of a new instance (running here, or queued) and its input as runs see it.

    Its times are ``clock``'s; ``timeout`` (None: the workflow's) arms a deadline from now. Raise
    what ``Engine.invoke`` says, and ``InvalidKey`` for a bad id.

    >>> from memable._clock import SYSTEM_CLOCK
    >>> wf = Workflow.of("double", lambda ctx, n: n * 2)
    >>> row, value = new_instance(wf, 21, "d-1", None, 0, {}, clock=SYSTEM_CLOCK)
    >>> row.status, row.input, value
    ('running', '21', 21)
    >>> new_instance(wf, 21, "d-2", "q", 0, {}, clock=SYSTEM_CLOCK)
    Traceback (most recent call last):
    ...
    ValueError: queue 'q' is not declared (engine.queue(name, ...))
    >>> from datetime import datetime
    >>> row, _ = new_instance(wf, 21, "d-3", None, 0, {}, timeout=30, clock=SYSTEM_CLOCK)
    >>> row.timeout, row.timeout_at - datetime.fromisoformat(row.created_at).timestamp()
    (30.0, 30.0)
    >>> new_instance(wf, 21, "d-4", None, 0, {}, concurrency_key="tenant-1",
    ...              clock=SYSTEM_CLOCK)
    Traceback (most recent call last):
    ...
    ValueError: concurrency_key 'tenant-1' of workflow 'double' instance 'd-4' needs a queue ...
    """
    name = workflow.name
    queue = queue if queue is not None else workflow.queue
    if queue is not None and queue not in queues:
        raise ValueError(f"queue {queue!r} is not declared (engine.queue(name, ...))")
    priority = check_priority(priority)
    if instance_id is None:
        instance_id = new_instance_id(clock)
    else:
        check_key(instance_id, name, instance_id)
    if input is NO_INPUT:
        if workflow.input_required:
            raise TypeError(f"workflow {name!r} takes an input and was invoked without one "
                "(give its parameter a default to make it optional)")
        input = None
    if input is not None and not workflow.takes_input:
        raise workflow.no_input(input)
    _check_concurrency_key(concurrency_key, queue, queues, name, instance_id)
    seconds = (workflow.timeout if timeout is None
               else positive_seconds(timeout, f"timeout of workflow {name!r}"))
    text, tag, value = store_form(name, instance_id, "input", input, workflow.input_hint)
    created = utc(clock)
    now = created.isoformat()
    deadline = None if seconds is None else check_deadline(
        created.timestamp() + seconds, "timeout", timeout)
    row = InstanceRow(
        workflow=name, instance_id=instance_id, status="running" if queue is None else "queued",
        message=None, input=text, input_type=tag, output=None, output_type=None, created_at=now,
        updated_at=now, completed_at=None, queue=queue,
        priority=None if queue is None else priority, queued_at=None if queue is None else now,
        timeout=seconds, timeout_at=deadline, concurrency_key=concurrency_key)
    return row, value


def _check_concurrency_key(
    key: object, queue: str | None, queues: dict[str, QueueSpec], workflow: str, instance_id: str,
) -> None:
    """A concurrency key is a non-empty str, for a queue declared with ``per_key``."""
    if key is None:
        return
    where = f"of workflow {workflow!r} instance {instance_id!r}"
    if not isinstance(key, str) or not key:
        raise TypeError(f"concurrency_key {where} is a non-empty str, not {key!r}")
    if queue is None or queues[queue].per_key is None:
        has = "it has no queue" if queue is None else f"queue {queue!r} has no per_key"
        raise ValueError(f"concurrency_key {key!r} {where} needs a queue declared with per_key "
            f"(engine.queue(name, per_key=n)); {has}")
