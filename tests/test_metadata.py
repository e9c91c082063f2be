"""Instance metadata and listing: ``get_metadata`` and ``list_instances`` give each
instance's status and completion time, per workflow, as soon as a wait has returned."""

from __future__ import annotations

from collections.abc import Callable

from helpers import flaky_once

from memable import (
    Completed,
    Context,
    Engine,
    Failed,
    MetadataStatus,
    StepError,
)

#: Upper bound for any wait in these tests; a healthy run ends in milliseconds.
TIMEOUT = 10.0


def _one(ctx: Context) -> None:
    """A workflow with one step that returns 1."""
    ctx.step("s1").run(lambda: 1)


def test_metadata_completed_on_success(engine: Engine) -> None:
    """A completed instance's metadata says Completed and carries a completion time."""
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
    """A failed instance's metadata says Failed with the step and error, and has a completion
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
    """Metadata goes from Failed to Completed when a resume finishes the instance."""
    calls: list[str] = []
    s1 = flaky_once(calls, "s1", 1, "transient")

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


def test_get_metadata_returns_none_for_unknown(engine: Engine) -> None:
    """get_metadata of an instance that does not exist returns None rather than raising."""
    engine.start()

    assert engine.get_metadata("wf", "no-such-id") is None


def test_metadata_consistent_after_wait_multi_thread(
    make_engine: Callable[..., Engine],
) -> None:
    """With several workers running instances at once, metadata read right after each wait
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
    """After wait_all the store, still open for reads, holds every instance as Completed."""
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


def test_list_instances_returns_all(engine: Engine) -> None:
    """list_instances returns every instance of the workflow, each with its metadata."""
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
    """list_instances returns only the instances of the named workflow, none for an unknown name.
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


def test_list_instances_on_fresh_engine(engine: Engine) -> None:
    """A new engine that was never started can be read and lists no instances."""
    assert engine.list_instances("anything") == []
