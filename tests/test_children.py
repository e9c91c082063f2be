"""Child workflows: ``ctx.child``, ``ctx.children``, ``ChildFailed``, the parent link, cancel
cascading to children; on every store, and across a SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import PROCS, build, runner_of, until

from memable import (
    Cancelled,
    ChildFailed,
    Completed,
    Context,
    Engine,
    EngineError,
    Failed,
    Suspended,
    WorkflowFailed,
    WorkflowNotFound,
)

TIMEOUT = 10.0


def _rows(engine: Engine, name: str, instance_id: str) -> list[tuple[str, str, str, Any]]:
    return [(r.key, r.kind, r.state, r.result) for r in engine.steps(name, instance_id)]


def _approval(ctx: Context, amount: int) -> int:
    """A child that waits for a signal before it returns."""
    return int(ctx.suspend("ok")) * amount


def test_a_child_runs_as_its_own_instance_and_its_output_completes_the_parent_step(
    make_engine: Callable[..., Engine],
) -> None:
    """A child runs as its own instance ``parent/key`` linked to its parent, which waits at
    a ``child`` step until the child completes; the child's output becomes that step's
    result, and a replay of the parent starts no second child."""
    engine = make_engine(poll_interval=60, lease=600)
    engine.register("approval", _approval)
    engine.register("order", lambda ctx: ctx.child("approve:v1", "approval", 5) + 1)
    with engine:
        inv = engine.invoke("order", instance_id="o")
        assert inv.wait(TIMEOUT) == Suspended("child approve:v1")
        assert _rows(engine, "order", "o") == [("approve:v1", "child", "waiting", None)]
        child = engine.invocation("approval", "o/approve:v1")
        assert child.wait(TIMEOUT) == Suspended("ok")
        meta = engine.get_metadata("approval", "o/approve:v1")
        assert meta is not None
        assert meta.parent == ("order", "o")
        order_meta = engine.get_metadata("order", "o")
        assert order_meta is not None
        assert order_meta.parent is None
        engine.signal("approval", "o/approve:v1", "ok", 2)
        assert inv.result(TIMEOUT) == 11
        assert _rows(engine, "order", "o") == [("approve:v1", "child", "completed", 10)]
        # A replay of the parent starts nothing: the child's output is its step's result.
        assert engine.resume("order", "o").result(TIMEOUT) == 11
        assert [i for i, _ in engine.list_instances("approval")] == ["o/approve:v1"]


def test_a_child_that_ends_while_the_parent_still_runs_is_not_lost(
    make_engine: Callable[..., Engine],
) -> None:
    """The child completes after the transaction that created it and before the parent
    records its suspension: that transaction finds the step completed and the parent
    goes on, with no poll to help (a minute away)."""
    engine = make_engine(poll_interval=60, lease=600)
    engine.register("double", lambda ctx, n: n * 2)
    engine.register("parent", lambda ctx: ctx.child("kid", "double", 21))
    host = runner_of(engine).children
    start = host.start

    def start_then_let_the_child_end(*args: Any) -> None:
        start(*args)  # created, and its run submitted
        assert engine.invocation("double", "p/kid").result(TIMEOUT) == 42

    host.start = start_then_let_the_child_end  # type: ignore[method-assign]
    with engine:
        assert engine.invoke("parent", instance_id="p").result(TIMEOUT) == 42


def test_a_failed_child_raises_child_failed_and_a_resume_runs_it_again(
    make_engine: Callable[..., Engine],
) -> None:
    """A child whose step raises fails, and the parent sees ``ChildFailed`` naming the child
    and carrying its failure; resuming the parent resumes the failed child, which succeeds
    on its second attempt."""
    engine = make_engine()
    attempts: Counter[str] = Counter()

    def flaky(ctx: Context) -> str:
        def call() -> str:
            attempts["call"] += 1
            if attempts["call"] == 1:
                raise ConnectionError("gateway down")
            return "charged"

        return ctx.step("call").run(call)

    caught: list[ChildFailed] = []

    def parent(ctx: Context) -> str:
        try:
            return str(ctx.child("charge:v1", "flaky"))
        except ChildFailed as exc:
            caught.append(exc)
            raise

    engine.register("flaky", flaky)
    engine.register("parent", parent)
    with engine:
        with pytest.raises(WorkflowFailed) as failed:
            engine.invoke("parent", instance_id="p").result(TIMEOUT)
        state = failed.value.state
        assert isinstance(state, Failed)
        assert state.message is not None
        assert state.message.startswith("step 'charge:v1' failed: ChildFailed: child ended failed")
        [error] = caught
        assert (error.workflow, error.instance_id) == ("flaky", "p/charge:v1")
        assert isinstance(error.state, Failed)
        assert error.state.message is not None
        assert "gateway down" in error.state.message
        assert [r[:3] for r in _rows(engine, "parent", "p")] == [
            ("charge:v1", "child", "failed")
        ]
        # Resuming the parent resumes the child, which now succeeds.
        assert engine.resume("parent", "p").result(TIMEOUT) == "charged"
        assert engine.invocation("flaky", "p/charge:v1").state == Completed()
    assert attempts["call"] == 2


def test_a_cancelled_child_raises_child_failed_again_on_every_run(
    make_engine: Callable[..., Engine],
) -> None:
    """A child cancelled while it waits raises ``ChildFailed`` in the parent, and raises it
    again when the parent is resumed: the child stays cancelled and is not restarted."""
    engine = make_engine()
    seen: list[str] = []

    def parent(ctx: Context) -> str:
        try:
            return str(ctx.child("kid", "approval", 1))
        except ChildFailed as exc:
            seen.append(str(exc.state))
            return "without approval"

    engine.register("approval", _approval)
    engine.register("parent", parent)
    with engine:
        inv = engine.invoke("parent", instance_id="p")
        assert inv.wait(TIMEOUT) == Suspended("child kid")
        assert engine.invocation("approval", "p/kid").wait(TIMEOUT) == Suspended("ok")
        engine.cancel("approval", "p/kid")
        assert inv.result(TIMEOUT) == "without approval"
        assert engine.resume("parent", "p").result(TIMEOUT) == "without approval"
        assert engine.invocation("approval", "p/kid").state == Cancelled()
    assert seen == ["cancelled", "cancelled"]


def test_cancelling_a_parent_cancels_its_children_and_theirs(
    make_engine: Callable[..., Engine],
) -> None:
    """Cancelling a parent cascades down the line: its suspended child and that child's own
    suspended child are cancelled too."""
    engine = make_engine()
    engine.register("approval", _approval)
    engine.register("middle", lambda ctx: ctx.child("grand", "approval", 1))
    engine.register("top", lambda ctx: ctx.child("mid", "middle"))
    with engine:
        top = engine.invoke("top", instance_id="t")
        # Each run ends once it created its child: follow them down the line.
        assert top.wait(TIMEOUT) == Suspended("child mid")
        assert engine.invocation("middle", "t/mid").wait(TIMEOUT) == Suspended("child grand")
        grandchild = engine.invocation("approval", "t/mid/grand")
        assert grandchild.wait(TIMEOUT) == Suspended("ok")
        engine.cancel("top", "t")
        assert top.state == Cancelled()
        assert engine.invocation("middle", "t/mid").state == Cancelled()
        assert grandchild.state == Cancelled()


def test_children_run_side_by_side_and_return_outputs_in_input_order(
    make_engine: Callable[..., Engine],
) -> None:
    """Three children meet at a barrier (so they run at once); the parent waits for the
    group, suspended with no thread, and gets the outputs in order."""
    engine = make_engine()
    barrier = threading.Barrier(3, timeout=TIMEOUT)

    def square(ctx: Context, n: int) -> int:
        barrier.wait()
        return n * n

    engine.register("square", square)
    engine.register("parent", lambda ctx: ctx.children("sq", "square", [3, 1, 2]))
    with engine:
        inv = engine.invoke("parent", instance_id="p")
        assert inv.result(TIMEOUT) == [9, 1, 4]
        assert _rows(engine, "parent", "p") == [
            ("sq[0]", "child", "completed", 9),
            ("sq[1]", "child", "completed", 1),
            ("sq[2]", "child", "completed", 4),
        ]
        assert sorted(i for i, _ in engine.list_instances("square")) == [
            "p/sq[0]", "p/sq[1]", "p/sq[2]"
        ]


def test_the_parent_of_a_group_waits_until_the_last_child_ends(
    make_engine: Callable[..., Engine],
) -> None:
    """``ctx.children`` keeps the parent suspended while any child of the group still waits,
    whatever order the children end in, then returns their outputs in index order."""
    engine = make_engine(poll_interval=60, lease=600)
    engine.register("approval", _approval)
    engine.register("parent", lambda ctx: ctx.children("ok", "approval", [1, 2, 3]))
    with engine:
        inv = engine.invoke("parent", instance_id="p")
        assert inv.wait(TIMEOUT) == Suspended("children ok")
        for i in range(3):
            assert engine.invocation("approval", f"p/ok[{i}]").wait(TIMEOUT) == Suspended("ok")
        engine.signal("approval", "p/ok[2]", "ok", 10)
        engine.signal("approval", "p/ok[0]", "ok", 10)
        assert engine.invocation("approval", "p/ok[0]").result(TIMEOUT) == 10
        assert engine.invocation("approval", "p/ok[2]").result(TIMEOUT) == 30
        assert inv.state == Suspended("children ok")
        engine.signal("approval", "p/ok[1]", "ok", 10)
        assert inv.result(TIMEOUT) == [10, 20, 30]


def test_the_first_failed_child_by_index_raises_once_all_have_ended(
    make_engine: Callable[..., Engine],
) -> None:
    """With two children of a group failing, the parent's ``ChildFailed`` is raised only
    after every child has ended (the first child is held until the third completes) and
    names the failed child with the lowest index."""
    engine = make_engine()
    release = threading.Event()

    def kid(ctx: Context, n: int) -> int:
        if n == 0:
            assert release.wait(TIMEOUT)  # ends last, and completes
        if n in (1, 3):
            raise ValueError(f"kid {n}")
        if n == 2:
            release.set()
        return n

    caught: list[str] = []

    def parent(ctx: Context) -> str:
        try:
            ctx.children("k", "kid", range(4))
        except ChildFailed as exc:
            caught.append(exc.instance_id or "")
        return "done"

    engine.register("kid", kid)
    engine.register("parent", parent)
    with engine:
        assert engine.invoke("parent", instance_id="p").result(TIMEOUT) == "done"
        assert [r[:3] for r in _rows(engine, "parent", "p")] == [
            ("k[0]", "child", "completed"), ("k[1]", "child", "failed"),
            ("k[2]", "child", "completed"), ("k[3]", "child", "failed"),
        ]
    assert caught == ["p/k[1]"]


def test_a_child_of_an_unregistered_workflow_fails_the_parent_at_its_key(
    engine: Engine,
) -> None:
    """A child of a workflow no engine registered fails the parent with ``WorkflowNotFound``
    naming that workflow, and stores no step for it."""
    engine.register("parent", lambda ctx: ctx.child("kid", "nowhere"))
    with engine:
        state = engine.invoke("parent", instance_id="p").wait(TIMEOUT)
        assert engine.steps("parent", "p") == []
    assert isinstance(state, Failed)
    assert state.message is not None
    assert WorkflowNotFound.__name__ in state.message
    assert "'nowhere'" in state.message


def test_wait_all_waits_for_the_children_and_the_parent(
    make_engine: Callable[..., Engine],
) -> None:
    """``engine.wait_all`` returns only once the parent, which waits on a group of children,
    has completed."""
    engine = make_engine()
    engine.register("double", lambda ctx, n: n * 2)
    engine.register("parent", lambda ctx: sum(ctx.children("d", "double", range(5))))
    engine.start()
    inv = engine.invoke("parent", instance_id="p")
    engine.wait_all()
    assert inv.state == Completed()


def test_a_parent_killed_after_starting_its_child_gets_one_child_on_recovery(
    tmp_path: Path,
) -> None:
    """SIGKILL right after the transaction that created the child (the child's run not
    past its start): the engine that recovers them runs one child, its step once."""
    sys.path.insert(0, str(Path(PROCS).parent))
    from _procs import family

    db, log = tmp_path / "db", tmp_path / "log"
    proc = subprocess.Popen([sys.executable, PROCS, "family", str(db), str(log)],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "children started\n"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        if proc.stdout is not None:
            proc.stdout.close()
    engine = Engine.open(db, poll_interval=0.05)
    family(engine, str(log), hold=None)
    with engine:
        assert engine.invocation("parent", "p").result(TIMEOUT) == 41
        assert [i for i, _ in engine.list_instances("child")] == ["p/kid"]
    assert log.read_text() == "work 4\n"


@pytest.mark.parametrize("bad", [object(), {1: "one"}])
def test_an_input_a_child_cannot_store_fails_the_parent_and_starts_nothing(
    engine: Engine, bad: object
) -> None:
    """A child input the store cannot serialise (a bare object, a dict with int keys) fails
    the parent with ``SerializationError``, starts no child instance and stores no step."""
    engine.register("kid", lambda ctx, value: value)
    engine.register("parent", lambda ctx: ctx.child("kid", "kid", bad))
    with engine:
        state = engine.invoke("parent", instance_id="p").wait(TIMEOUT)
        assert engine.list_instances("kid") == []
        assert engine.steps("parent", "p") == []
    assert isinstance(state, Failed)
    assert state.message is not None
    assert "SerializationError" in state.message


def test_a_child_ending_while_its_parent_records_its_wait_is_counted(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: the child's end has settled the parent's step and not committed when
    the parent records its wait for the group. Either the parent's count sees the end,
    or the end sees the parent suspended and counts itself down: here the parent's
    transaction waits for the child's (it locks the parent's row first), and the parent
    goes on with no poll to help."""
    import psycopg
    from conftest import POSTGRES_URL

    from memable._store.sql import children as children_sql

    settle = children_sql.settle_parent
    settled, go = threading.Event(), threading.Event()

    def settle_and_hold(*args: Any, **kwargs: Any) -> Any:
        wake = settle(*args, **kwargs)
        settled.set()
        assert go.wait(TIMEOUT)  # the child's transaction stays open meanwhile
        return wake

    monkeypatch.setattr(children_sql, "settle_parent", settle_and_hold)
    engine, store = build(POSTGRES_URL, schema=pg_schema, poll_interval=60, lease=600)
    engine.register("double", lambda ctx, n: n * 2)
    engine.register("parent", lambda ctx: ctx.children("d", "double", [21]))
    suspend = store.suspend

    def suspend_once_the_child_settled(*args: Any) -> Any:
        assert settled.wait(TIMEOUT)
        return suspend(*args)

    store.suspend = suspend_once_the_child_settled  # type: ignore[method-assign]

    def parent_recorded_or_waiting() -> bool:
        with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
            # (The parent's statements run prepared: its text names the instance.)
            blocked = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE %s", ("%EXECUTE memable_%('parent', 'p'%",),
            ).fetchone()
            suspended = conn.execute(
                f'SELECT count(*) FROM "{pg_schema}".memable_instances WHERE instance_id = %s '
                "AND status = 'suspended'", ("p",),
            ).fetchone()
        return bool(blocked and blocked[0]) or bool(suspended and suspended[0])

    with engine:
        inv = engine.invoke("parent", instance_id="p")
        assert settled.wait(TIMEOUT)
        until(parent_recorded_or_waiting)
        go.set()
        assert inv.result(TIMEOUT) == [42]


def test_memable_show_lists_a_parent_and_its_children(tmp_path: Path) -> None:
    """``memable show`` lists a parent's children with their state, shows a child's parent,
    and ``--json`` gives the same links."""
    import json

    from helpers import cli

    db = tmp_path / "db"
    engine = Engine.open(db)
    engine.register("approval", _approval)
    engine.register("order", lambda ctx: ctx.child("approve:v1", "approval", 5))
    with engine:
        assert engine.invoke("order", instance_id="o").wait(TIMEOUT) == Suspended(
            "child approve:v1")
        assert engine.invocation("approval", "o/approve:v1").wait(TIMEOUT) == Suspended("ok")
    parent = cli("show", db, "order", "o")
    assert parent.exit_code == 0
    assert "children:" in parent.stdout
    assert "approval  o/approve:v1  suspended" in parent.stdout
    child = cli("show", db, "approval", "o/approve:v1")
    assert "parent     order/o" in child.stdout
    view = json.loads(cli("show", db, "approval", "o/approve:v1", "--json").stdout)
    assert view["parent"] == {"workflow": "order", "instance_id": "o"}
    assert view["children"] == []


# ---------------------------------------------------------------------- ids taken by others


def _taken_message(state: Any) -> str:
    assert isinstance(state, Failed), state
    return state.message


def test_a_child_id_taken_by_another_parents_child_is_never_adopted(
    make_engine: Callable[..., Engine],
) -> None:
    """Parent 'p' with key 'x/y' and parent 'p/x' with key 'y' both name the child 'p/x/y':
    the second parent's ctx.child raises EngineError naming both, its step is recorded
    failed, it waits on nothing; the first parent's child is untouched and still settles
    the first parent."""
    engine = make_engine(poll_interval=60, lease=600)
    engine.register("approval", _approval)
    engine.register("by_key", lambda ctx: ctx.child("x/y", "approval", 1))
    engine.register("by_id", lambda ctx: ctx.child("y", "approval", 2))
    with engine:
        first = engine.invoke("by_key", instance_id="p")
        assert first.wait(TIMEOUT) == Suspended("child x/y")
        second = engine.invoke("by_id", instance_id="p/x")
        message = _taken_message(second.wait(TIMEOUT))
        assert message.startswith("step 'y' failed: ChildIdTaken: child id 'p/x/y'")
        assert "the child of workflow 'by_key', instance 'p' at key 'x/y'" in message
        assert "workflow 'by_id', instance 'p/x', step 'y'" in message
        [record] = engine.steps("by_id", "p/x")
        assert (record.key, record.kind, record.state) == ("y", "child", "failed")
        assert record.error is not None
        assert record.error.startswith("ChildIdTaken: ")
        # The child is the first parent's, with its input, and ends into that parent only.
        meta = engine.get_metadata("approval", "p/x/y")
        assert meta is not None
        assert meta.parent == ("by_key", "p")
        engine.signal("approval", "p/x/y", "ok", 7)
        assert first.result(TIMEOUT) == 7
        assert engine.steps("by_id", "p/x")[0].state == "failed"
        # A resume of the second parent tries again and is refused again: never adopted.
        again = engine.resume("by_id", "p/x")
        assert _taken_message(again.wait(TIMEOUT)).startswith("step 'y' failed: ChildIdTaken")
        assert engine.steps("by_id", "p/x")[0].state == "failed"


def test_a_child_id_a_user_invoked_is_never_adopted(
    make_engine: Callable[..., Engine],
) -> None:
    """An instance invoked on its own under the id 'o/approve' is not the child of 'o' at
    'approve': ctx.child raises, its step is failed, the user's instance is left as it was."""
    engine = make_engine(poll_interval=60, lease=600)
    engine.register("approval", _approval)
    engine.register("order", lambda ctx: ctx.child("approve", "approval", 5))
    with engine:
        own = engine.invoke("approval", 3, instance_id="o/approve")
        assert own.wait(TIMEOUT) == Suspended("ok")
        message = _taken_message(engine.invoke("order", instance_id="o").wait(TIMEOUT))
        assert "ChildIdTaken: child id 'o/approve'" in message
        assert "an instance invoked on its own" in message
        assert engine.steps("order", "o")[0].state == "failed"
        meta = engine.get_metadata("approval", "o/approve")
        assert meta is not None
        assert meta.parent is None
        engine.signal("approval", "o/approve", "ok", 2)
        assert own.result(TIMEOUT) == 6
        order = engine.get_metadata("order", "o")
        assert order is not None
        assert order.status.name == "failed"


def test_a_group_with_one_taken_id_starts_none_of_its_children(
    make_engine: Callable[..., Engine],
) -> None:
    """ctx.children where child [1]'s id is taken: the transaction that would have started
    the group writes nothing but the failed step of [1]; the workflow may catch the error."""
    engine = make_engine(poll_interval=60, lease=600)
    engine.register("approval", _approval)
    caught: list[str] = []

    def group(ctx: Context) -> str:
        try:
            ctx.children("n", "approval", [1, 2, 3])
        except EngineError as err:
            caught.append(str(err))
        return "went on"

    engine.register("group", group)
    with engine:
        engine.invoke("approval", 9, instance_id="g/n[1]").wait(TIMEOUT)
        assert engine.invoke("group", instance_id="g").result(TIMEOUT) == "went on"
        assert len(caught) == 1
        assert "child id 'g/n[1]'" in caught[0]
        assert [(r.key, r.state) for r in engine.steps("group", "g")] == [("n[1]", "failed")]
        assert sorted(i for i, _ in engine.list_instances("approval")) == ["g/n[1]"]
