"""The seed's core engine tests: running, memoisation, lifecycle, status and metadata."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from memable import (
    Completed,
    Context,
    Engine,
    Failed,
    InProgress,
    MetadataStatus,
    NotStarted,
    StepError,
    WorkflowNotFound,
)

#: Upper bound for any wait in these tests; a healthy run ends in milliseconds.
TIMEOUT = 10.0


def _one(ctx: Context) -> None:
    """A workflow with one step that returns 1."""
    ctx.step("s1").run(lambda: 1)


def _flaky_once(calls: list[str], key: str, value: object, message: str) -> Callable[[], object]:
    """A step function that logs ``key`` to ``calls`` on every call.

    It raises ``StepError.retryable(message)`` on its first call only, whatever the test
    later does to ``calls``.
    """
    attempts: list[None] = []

    def fn() -> object:
        calls.append(key)
        attempts.append(None)
        if len(attempts) == 1:
            raise StepError.retryable(message)
        return value

    return fn


def test_simple_workflow_completes(engine: Engine) -> None:
    """Ports seed test simple_workflow_completes.

    A workflow of two steps runs to Completed and its steps' results reach the workflow.
    """

    def add(ctx: Context) -> int:
        a: int = ctx.step("a").run(lambda: 1)
        b: int = ctx.step("b").run(lambda: 2)
        return a + b

    engine.register("add", add)
    engine.start()

    inv = engine.invoke("add")
    assert inv.wait(TIMEOUT) == Completed()
    assert inv.result(TIMEOUT) == 3


def test_memoisation_on_resume(engine: Engine) -> None:
    """Ports seed test memoisation_on_resume.

    Resuming a failed instance returns the completed step from the store and re-runs only
    the failed one.
    """
    calls: list[str] = []

    def s1() -> str:
        calls.append("s1")
        return "hello"

    s2 = _flaky_once(calls, "s2", "world", "transient")

    def memo(ctx: Context) -> str:
        first: str = ctx.step("s1").run(s1)
        second = ctx.step("s2").run(s2)
        return f"{first} {second}"

    engine.register("memo", memo)
    engine.start()

    inv = engine.invoke("memo")
    state = inv.wait(TIMEOUT)
    assert isinstance(state, Failed)
    assert "s2" in state.message
    assert "transient" in state.message
    assert calls == ["s1", "s2"]

    calls.clear()
    resumed = engine.resume("memo", inv.instance_id)
    assert resumed.wait(TIMEOUT) == Completed()
    assert resumed.result(TIMEOUT) == "hello world"
    assert calls == ["s2"]


def test_step_error_produces_failed_state(engine: Engine) -> None:
    """Ports seed test step_error_produces_failed_state.

    A step raising a permanent StepError fails the workflow with a message naming the step
    and the error.
    """

    def boom() -> str:
        raise StepError.permanent("boom")

    def failing(ctx: Context) -> None:
        ctx.step("fail").run(boom)

    engine.register("fail", failing)
    engine.start()

    state = engine.invoke("fail").wait(TIMEOUT)
    assert isinstance(state, Failed)
    assert "'fail'" in state.message
    assert "boom" in state.message


def test_different_instances_have_separate_caches(engine: Engine) -> None:
    """Ports seed test different_instances_have_separate_caches.

    The same step key in two instances of one workflow executes once in each.
    """
    calls: list[str] = []

    def wf(ctx: Context) -> None:
        ctx.step("x").run(calls.append, ctx.instance_id)

    engine.register("wf", wf)
    engine.start()

    first = engine.invoke("wf")
    assert first.wait(TIMEOUT) == Completed()
    second = engine.invoke("wf")
    assert second.wait(TIMEOUT) == Completed()

    assert first.instance_id != second.instance_id
    assert calls == [first.instance_id, second.instance_id]


def test_invoke_before_start_fails(engine: Engine) -> None:
    """Ports seed test invoke_before_start_fails.

    Invoking on an engine that was never started raises NotStarted and stores nothing.
    """
    runs: list[str] = []
    engine.register("noop", lambda ctx: runs.append(ctx.instance_id))

    with pytest.raises(NotStarted):
        engine.invoke("noop")

    assert engine.list_instances("noop") == []
    assert runs == []


def test_invoke_unknown_workflow_fails(engine: Engine) -> None:
    """Ports seed test invoke_unknown_workflow_fails.

    Invoking a name nobody registered raises WorkflowNotFound naming it, and stores nothing.
    """
    engine.start()

    with pytest.raises(WorkflowNotFound, match="nonexistent"):
        engine.invoke("nonexistent")

    assert engine.list_instances("nonexistent") == []


def test_wait_all_waits_for_completion(engine: Engine) -> None:
    """Ports seed test wait_all_waits_for_completion.

    wait_all blocks while runs are still going and returns once every one of them has ended.
    """
    gate = threading.Event()
    calls: list[str] = []

    def step(instance_id: str) -> int:
        gate.wait(TIMEOUT)
        calls.append(instance_id)
        return 1

    def wf(ctx: Context) -> None:
        ctx.step("x").run(step, ctx.instance_id)

    engine.register("wf", wf)
    engine.start()

    ids = [engine.invoke("wf").instance_id for _ in range(3)]

    drained = threading.Event()

    def drain() -> None:
        engine.wait_all()
        drained.set()

    waiter = threading.Thread(target=drain, name="test-wait-all")
    waiter.start()
    try:
        # Every run is held at the gate, so wait_all must still be waiting.
        assert not drained.wait(0.2), "wait_all returned while runs were still active"
        assert calls == []
    finally:
        gate.set()
        waiter.join(TIMEOUT)
    assert drained.is_set()

    assert sorted(calls) == sorted(ids)
    for instance_id in ids:
        meta = engine.get_metadata("wf", instance_id)
        assert meta is not None
        assert meta.status == MetadataStatus.Completed()


def test_invoke_after_wait_all_fails(engine: Engine) -> None:
    """Ports seed test invoke_after_wait_all_fails.

    Once wait_all has drained the engine, invoke raises NotStarted and stores nothing.
    """
    runs: list[str] = []
    engine.register("noop", lambda ctx: runs.append(ctx.instance_id))
    engine.start()

    engine.wait_all()

    with pytest.raises(NotStarted):
        engine.invoke("noop")
    assert engine.list_instances("noop") == []
    assert runs == []


def test_wait_all_with_no_active_tasks(engine: Engine) -> None:
    """Ports seed test wait_all_with_no_active_tasks.

    wait_all on a started engine with nothing running returns at once and leaves no thread.
    """
    before = {t for t in threading.enumerate() if t.name.startswith("memable")}
    engine.start()

    waiter = threading.Thread(target=engine.wait_all, name="test-wait-all")
    waiter.start()
    waiter.join(TIMEOUT)

    assert not waiter.is_alive(), "wait_all did not return with no active runs"
    assert {t for t in threading.enumerate() if t.name.startswith("memable")} <= before
    assert engine.list_instances("anything") == []


def test_status_persisted_and_restored_on_resume(engine: Engine) -> None:
    """Ports seed test status_persisted_and_restored_on_resume.

    The status set before a step is stored with it, and a resume replays that step from the
    store and re-runs only the failed one.
    """
    calls: list[str] = []

    def s1() -> str:
        calls.append("s1")
        return "one"

    s2 = _flaky_once(calls, "s2", "two", "transient")

    def status_wf(ctx: Context) -> None:
        ctx.set_status("step-one")
        ctx.step("s1").run(s1)
        ctx.set_status("step-two")
        ctx.step("s2").run(s2)

    engine.register("status-wf", status_wf)
    engine.start()

    inv = engine.invoke("status-wf")
    state = inv.wait(TIMEOUT)
    assert isinstance(state, Failed)
    assert "s2" in state.message
    assert "transient" in state.message
    assert calls == ["s1", "s2"]

    steps = {record.key: record for record in engine.steps("status-wf", inv.instance_id)}
    assert steps["s1"].state == "completed"
    assert steps["s1"].status == "step-one"
    assert steps["s2"].state == "failed"

    calls.clear()
    assert engine.resume("status-wf", inv.instance_id).wait(TIMEOUT) == Completed()
    assert calls == ["s2"]

    records = engine.steps("status-wf", inv.instance_id)
    assert [(r.key, r.state, r.status) for r in records] == [
        ("s1", "completed", "step-one"),
        ("s2", "completed", "step-two"),
    ]


def test_subscribers_not_notified_during_replay(engine: Engine) -> None:
    """Ports seed test subscribers_not_notified_during_replay.

    A resumed run replays its stored steps silently: watchers see only the status current
    when replay ends, then the end state.
    """
    gate = threading.Event()
    gate.set()  # the first run goes straight through
    calls: list[str] = []
    s2 = _flaky_once(calls, "s2", 2, "fail first time")

    def silent_replay(ctx: Context) -> None:
        if not gate.wait(TIMEOUT):
            raise RuntimeError("the test never opened the gate")
        ctx.set_status("phase-1")
        ctx.step("s1").run(lambda: 1)
        ctx.set_status("phase-2")
        ctx.step("s2").run(s2)

    engine.register("silent-replay", silent_replay)
    engine.start()

    inv = engine.invoke("silent-replay")
    assert isinstance(inv.wait(TIMEOUT), Failed)

    gate.clear()  # hold the resumed run before it does anything
    resumed = engine.resume("silent-replay", inv.instance_id)
    updates = resumed.updates()  # subscribes now, before the run can publish
    gate.set()

    assert list(updates) == [InProgress("phase-2"), Completed()]
    assert calls == ["s2", "s2"]


def test_metadata_completed_on_success(engine: Engine) -> None:
    """Ports seed test metadata_completed_on_success.

    A completed instance's metadata says Completed and carries a completion time.
    """
    engine.register("wf", _one)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Completed()

    meta = engine.get_metadata("wf", inv.instance_id)
    assert meta is not None
    assert meta.status == MetadataStatus.Completed()
    assert meta.completed_at is not None
    assert meta.completed_at >= meta.created_at


def test_metadata_failed_on_error(engine: Engine) -> None:
    """Ports seed test metadata_failed_on_error.

    A failed instance's metadata says Failed with the step and error, and has a completion
    time.
    """

    def boom() -> str:
        raise StepError.permanent("boom")

    def failing(ctx: Context) -> None:
        ctx.step("fail").run(boom)

    engine.register("fail", failing)
    engine.start()

    inv = engine.invoke("fail")
    state = inv.wait(TIMEOUT)
    assert isinstance(state, Failed)

    meta = engine.get_metadata("fail", inv.instance_id)
    assert meta is not None
    assert isinstance(meta.status, MetadataStatus.Failed)
    assert meta.status.message == state.message
    assert "'fail'" in meta.status.message
    assert "boom" in meta.status.message
    assert meta.completed_at is not None


def test_metadata_updated_after_resume(engine: Engine) -> None:
    """Ports seed test metadata_updated_after_resume.

    Metadata goes from Failed to Completed when a resume finishes the instance.
    """
    calls: list[str] = []
    s1 = _flaky_once(calls, "s1", 1, "transient")

    def retry_wf(ctx: Context) -> None:
        ctx.step("s1").run(s1)

    engine.register("retry-wf", retry_wf)
    engine.start()

    inv = engine.invoke("retry-wf")
    assert isinstance(inv.wait(TIMEOUT), Failed)

    meta = engine.get_metadata("retry-wf", inv.instance_id)
    assert meta is not None
    assert isinstance(meta.status, MetadataStatus.Failed)
    assert "s1" in meta.status.message
    assert "transient" in meta.status.message

    assert engine.resume("retry-wf", inv.instance_id).wait(TIMEOUT) == Completed()

    meta = engine.get_metadata("retry-wf", inv.instance_id)
    assert meta is not None
    assert meta.status == MetadataStatus.Completed()
    assert meta.completed_at is not None
    assert calls == ["s1", "s1"]


def test_list_instances_returns_all(engine: Engine) -> None:
    """Ports seed test list_instances_returns_all.

    list_instances returns every instance of the workflow, each with its metadata.
    """
    engine.register("wf", _one)
    engine.start()

    ids = []
    for _ in range(3):
        inv = engine.invoke("wf")
        assert inv.wait(TIMEOUT) == Completed()
        ids.append(inv.instance_id)

    instances = engine.list_instances("wf")
    assert sorted(instance_id for instance_id, _ in instances) == sorted(ids)
    assert [meta.status for _, meta in instances] == [MetadataStatus.Completed()] * 3


def test_list_instances_filters_by_workflow_name(engine: Engine) -> None:
    """Ports seed test list_instances_filters_by_workflow_name.

    list_instances returns only the instances of the named workflow, none for an unknown name.
    """
    engine.register("alpha", _one)
    engine.register("beta", _one)
    engine.start()

    def run(name: str) -> str:
        inv = engine.invoke(name)
        assert inv.wait(TIMEOUT) == Completed()
        return inv.instance_id

    alpha_ids = {run("alpha"), run("alpha")}
    beta_ids = {run("beta")}

    assert {instance_id for instance_id, _ in engine.list_instances("alpha")} == alpha_ids
    assert len(engine.list_instances("alpha")) == 2
    assert [instance_id for instance_id, _ in engine.list_instances("beta")] == list(beta_ids)
    assert engine.list_instances("nonexistent") == []


def test_get_metadata_returns_none_for_unknown(engine: Engine) -> None:
    """Ports seed test get_metadata_returns_none_for_unknown.

    get_metadata of an instance that does not exist returns None rather than raising.
    """
    engine.start()

    assert engine.get_metadata("wf", "no-such-id") is None


def test_metadata_consistent_after_wait_multi_thread(
    make_engine: Callable[..., Engine],
) -> None:
    """Ports seed test metadata_consistent_after_wait_multi_thread.

    With several workers running instances at once, metadata read right after each wait
    already says Completed.
    """
    engine = make_engine(max_workers=4)
    engine.register("wf", _one)
    engine.start()

    invocations = [engine.invoke("wf") for _ in range(8)]
    for inv in invocations:
        assert inv.wait(TIMEOUT) == Completed()
        meta = engine.get_metadata("wf", inv.instance_id)
        assert meta is not None
        assert meta.status == MetadataStatus.Completed()
        assert meta.completed_at is not None


def test_metadata_correct_after_wait_all(engine: Engine) -> None:
    """Ports seed test metadata_correct_after_wait_all.

    After wait_all the store, still open for reads, holds every instance as Completed.
    """
    engine.register("wf", _one)
    engine.start()

    id1 = engine.invoke("wf").instance_id
    id2 = engine.invoke("wf").instance_id

    engine.wait_all()

    for instance_id in (id1, id2):
        meta = engine.get_metadata("wf", instance_id)
        assert meta is not None
        assert meta.status == MetadataStatus.Completed()
        assert meta.completed_at is not None


def test_list_instances_on_fresh_engine(engine: Engine) -> None:
    """Ports seed test list_instances_on_fresh_engine.

    A new engine that was never started can be read and lists no instances.
    """
    assert engine.list_instances("anything") == []


def test_step_without_status_stores_none(engine: Engine) -> None:
    """Ports seed test step_without_status_stores_none.

    A step run without any set_status is stored with no status, and a resume replays it
    without executing it.
    """
    calls: list[str] = []

    def s1() -> int:
        calls.append("s1")
        return 42

    def no_status(ctx: Context) -> int:
        value: int = ctx.step("s1").run(s1)
        return value

    engine.register("no-status", no_status)
    engine.start()

    inv = engine.invoke("no-status")
    assert inv.wait(TIMEOUT) == Completed()
    assert calls == ["s1"]

    [record] = engine.steps("no-status", inv.instance_id)
    assert record.key == "s1"
    assert record.state == "completed"
    assert record.result == 42
    assert record.status is None

    calls.clear()
    resumed = engine.resume("no-status", inv.instance_id)
    assert resumed.wait(TIMEOUT) == Completed()
    assert resumed.result(TIMEOUT) == 42
    assert calls == []
    [record] = engine.steps("no-status", inv.instance_id)
    assert record.status is None
