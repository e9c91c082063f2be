"""A parent's steps of kind ``"child"``: what ``ctx.child`` and ``ctx.children`` do in a run.

Each child is a step of the parent (its key) and an instance of its own, with
the id ``"{parent id}/{key}"``. The first run to reach the key writes the
parent's waiting step and creates the child in one transaction, so a crash in
between never makes two children; the child's end settles the step (see
``_children_sql``). Until every child it waits for has ended, the parent's
run ends Suspended and holds no thread.

A failed child step holds, in its ``result``, whether the parent has been
told (``TOLD``): the run that finds it untold raises ``ChildFailed``; a later
run finds it told and resumes the child (a Failed one) or raises again (a
Cancelled one), as it would run again any failed step the workflow caught.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from ._children_sql import TOLD
from ._control import Suspension
from ._errors import ChildFailed, ChildIdTaken, EngineError
from ._invocation import state_of
from ._serde import store_form
from ._states import Failed, WorkflowState
from ._store import InstanceRow, StepWrite, StoredStep, settled
from ._workflow import Workflow

if TYPE_CHECKING:
    from ._context import Context


def follow(
    ctx: Context, key: str, workflow: str, inputs: list[Any], *, returns: Any, group: bool,
    queue: str | None = None,
) -> list[Any]:
    """Start, wait for and return the outputs of the children of ``key``, in order.

    ``group``: ``ctx.children`` (keys ``"{key}[{i}]"``, one wait for all);
    else ``ctx.child`` (one child under ``key`` itself).
    """
    host = ctx._children
    if host is None:
        raise EngineError("child workflows need a run of an engine", workflow=ctx._workflow,
                          instance_id=ctx._instance_id, key=key)
    child_workflow = host.workflow(workflow)
    queue = host.queue_of(child_workflow, queue)
    ctx.attempts.boundary()
    keys = [f"{key}[{i}]" for i in range(len(inputs))] if group else [key]
    for k in keys:
        ctx._claim(k)
    # A lone child may have ended since the run read its steps: look again.
    rows = [ctx._arrived(k, "child", reread=not group) for k in keys]
    hint = returns if returns is not None else child_workflow.output_hint
    results: list[Any] = [None] * len(keys)
    to_start: list[int] = []
    to_resume: list[int] = []
    failures: list[tuple[int, ChildFailed, bool]] = []  # (index, error, told already)
    waiting = False
    for i, (k, row) in enumerate(zip(keys, rows, strict=True)):
        child_id = f"{ctx._instance_id}/{k}"
        if row is None:
            to_start.append(i)
        elif row.state == "completed":
            results[i] = ctx._replayed(k, row, hint)
        elif not settled(row.kind, row.state):
            waiting = True
        else:  # failed: told (run it again, unless cancelled) or not yet
            child = host.instance(workflow, child_id)
            if child is not None and not _is_child(child, ctx, k):
                # Its id was taken by another instance: try to start it again, which
                # fails the same way while that one holds the id.
                to_start.append(i)
                continue
            state = state_of(child) if child is not None else None
            error = ChildFailed(workflow, child_id, state or _gone())
            told = row.result == TOLD
            if told and child is not None and child.status != "cancelled":
                to_resume.append(i)
            else:
                failures.append((i, error, told))
    if not (to_start or to_resume or waiting):
        if failures:
            for i, error, told in failures:
                if not told:
                    _tell(ctx, keys[i], rows[i], error)
            i, error, _ = failures[0]
            ctx._note(keys[i], error, None)
            raise error
        return results
    ctx._end_replay()
    seqs = {i: row.seq for i, row in enumerate(rows) if row is not None}
    if to_start:
        seqs.update(_start(ctx, child_workflow, keys, inputs, to_start, key if group else None,
                           queue))
    for i in to_resume:
        ctx.attempts.store.save_step(_write(ctx, keys[i], seqs[i], "waiting"))
        host.resume(child_workflow, f"{ctx._instance_id}/{keys[i]}")
    if group:
        wait = attrs.evolve(_write(ctx, key, 0, "waiting"), kind="children")
        raise Suspension(key, f"children {key}", wait)
    raise Suspension(key, f"child {key}", _write(ctx, key, seqs[0], "waiting"))


def _start(
    ctx: Context, workflow: Workflow, keys: list[str], inputs: list[Any], indexes: list[int],
    group: str | None, queue: str | None,
) -> dict[int, int]:
    """Create and run the children at ``indexes``; the seq of each one's step, by index."""
    children = []
    waits = []
    seqs = {}
    for i in indexes:
        child_id = f"{ctx._instance_id}/{keys[i]}"
        value = inputs[i]
        if value is not None and not workflow.takes_input:
            raise TypeError(f"workflow {workflow.name!r} takes no input, got "
                            f"{type(value).__name__}")
        text, tag, rebuilt = store_form(workflow.name, child_id, "input", value,
                                        workflow.input_hint)
        children.append((child_id, keys[i], (text, tag), rebuilt))
        seqs[i] = ctx._take_seq()
        waits.append(_write(ctx, keys[i], seqs[i], "waiting"))
    assert ctx._children is not None
    try:
        ctx._children.start(workflow, waits, children, group, queue)
    except ChildIdTaken as taken:  # nothing of the start was written: record the step failed
        i = keys.index(taken.key)
        failed = attrs.evolve(_write(ctx, taken.key, seqs[i], "failed"),
                              error=f"{type(taken).__name__}: {taken}")
        ctx.attempts.store.save_step(failed)
        ctx._note(taken.key, taken, None)
        raise
    return seqs


def _is_child(row: InstanceRow, ctx: Context, key: str) -> bool:
    """Whether ``row`` is the child this run's instance started at ``key``."""
    return (row.parent_workflow, row.parent_id, row.parent_key) == (
        ctx._workflow, ctx._instance_id, key)


def _write(ctx: Context, key: str, seq: int, state: str) -> StepWrite:
    return attrs.evolve(ctx.attempts.write(key, seq, state, ctx._status), kind="child")


def _tell(ctx: Context, key: str, row: StoredStep | None, error: ChildFailed) -> None:
    """Record that the parent was told of its child's failure (the step stays failed)."""
    assert row is not None
    told = attrs.evolve(_write(ctx, key, row.seq, "failed"), result=TOLD,
                        error=f"{type(error).__name__}: {error}")
    ctx.attempts.store.save_step(told)


def _gone() -> WorkflowState:
    return Failed("the child instance is gone")
