"""The store operations an operator's tools make (the dashboard, the command line), on
every store: a page of instances newest first, counts, the failed ones of a filter,
queue names, and forking an instance from a step."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from helpers import store_of

from memable import (
    Context,
    Engine,
    InstanceNotFound,
    InvalidKey,
    WorkflowFailed,
)
from memable._clock import SYSTEM_CLOCK, epoch_seconds
from memable._errors import StepNotFound
from memable._store import admin
from memable._store.protocol import Store

TIMEOUT = 10


def _two_steps(ctx: Context, n: int) -> int:
    ctx.step("one").run(lambda: n)
    return ctx.step("two").run(lambda: 1 // 0 if n < 0 else n + 1)


@pytest.fixture
def engine(make_engine: Callable[..., Engine]) -> Iterator[Engine]:
    engine = make_engine(poll_interval=0.05)
    engine.register("two", _two_steps)
    engine.register("other", lambda ctx: None)
    engine.queue("mail", concurrency=1)
    engine.register("mailed", lambda ctx: None, queue="mail")
    with engine:
        yield engine


def _store(engine: Engine) -> Store:
    return store_of(engine)


def test_a_page_is_newest_first_with_offset_and_limit(engine: Engine) -> None:
    """The store's page of instances is newest first, cut by offset and limit (empty past the
    end), and filters by workflow, status and a case-sensitive id prefix."""
    for i in range(7):
        engine.invoke("two", i, instance_id=f"t-{i}").result(TIMEOUT)
    store = _store(engine)
    ids = [r.instance_id for r in store.instance_page("two", None, None, 0, 3)]
    assert ids == ["t-6", "t-5", "t-4"]
    assert [r.instance_id for r in store.instance_page("two", None, None, 6, 3)] == ["t-0"]
    assert store.instance_page("two", None, None, 7, 3) == []
    assert [r.instance_id for r in store.instance_page(None, "completed", "t-1", 0, 9)] == [
        "t-1"]
    assert store.instance_page(None, None, "T-", 0, 9) == []  # case and all


def test_counts_failed_ones_and_queue_names(engine: Engine) -> None:
    """The store counts instances by workflow and status, names the declared queues, and lists
    failed instances oldest first with the time each failed, filtered by workflow, id prefix,
    limit, and a failure time until or since."""
    for i in (1, 2):
        engine.invoke("two", i, instance_id=f"ok-{i}").result(TIMEOUT)
    for i in (1, 2, 3):
        engine.invoke("two", -i, instance_id=f"bad-{i}").wait(TIMEOUT)
    engine.invoke("other", instance_id="o").result(TIMEOUT)
    engine.invoke("mailed", instance_id="m").result(TIMEOUT)
    store = _store(engine)
    assert store.status_counts() == [
        ("mailed", "completed", 1), ("other", "completed", 1), ("two", "completed", 2),
        ("two", "failed", 3)]
    assert store.queue_names() == ["mail"]
    oldest_first = store.failed_instances(None, limit=10)
    failed_at = {}
    for i in (1, 2, 3):  # each with the time it failed
        meta = engine.get_metadata("two", f"bad-{i}")
        assert meta is not None
        assert meta.completed_at is not None
        failed_at[i] = meta.completed_at.isoformat()
    assert oldest_first == [("two", f"bad-{i}", failed_at[i]) for i in (1, 2, 3)]
    assert store.failed_instances("two", limit=2) == oldest_first[:2]
    assert store.failed_instances("other", limit=10) == []
    assert store.failed_instances(None, id_prefix="bad-3", limit=10) == oldest_first[2:]
    at = epoch_seconds(failed_at[2])
    assert store.failed_instances(None, until=at, limit=10) == oldest_first[:2]
    assert store.failed_instances(None, since=at, limit=10) == oldest_first[1:]


def test_resume_failed_resumes_the_oldest_first_up_to_the_limit(engine: Engine) -> None:
    """``admin.resume_failed`` with a limit resumes the oldest failed instances up to it and
    leaves the next one failed; the running engine then runs the resumed ones again."""
    for i in (1, 2, 3):
        engine.invoke("two", -i, instance_id=f"bad-{i}").wait(TIMEOUT)
    resumed = admin.resume_failed(_store(engine), "two", limit=2, clock=SYSTEM_CLOCK)
    assert resumed == [("two", "bad-1"), ("two", "bad-2")]
    statuses = {i: type(m.status).__name__ for i, m in engine.list_instances("two")}
    assert statuses["bad-3"] == "Failed"
    # An engine's next look runs them again (they fail again: the input is negative).
    for instance_id in ("bad-1", "bad-2"):
        with pytest.raises(WorkflowFailed):
            engine.invocation("two", instance_id).result(TIMEOUT)
        assert len(engine.steps("two", instance_id)[1].error or "") > 0


def test_fork_from_a_key_copies_the_completed_steps_before_it(engine: Engine) -> None:
    """The fork is ready at once, and the running engine may take it before the test
    reads it: its step "one" is the source's record, copied (never executed again: the
    same completion time), and "two" is executed anew, after the source's."""
    engine.invoke("two", 1, instance_id="t").result(TIMEOUT)
    source = {s.key: s for s in engine.steps("two", "t")}
    store = _store(engine)
    new_id, made = admin.fork_instance(store, "two", "t", "two", "t-fork", clock=SYSTEM_CLOCK)
    assert (new_id, made) == ("t-fork", True)
    assert engine.invocation("two", "t-fork").result(TIMEOUT) == 2
    forked = {s.key: s for s in engine.steps("two", "t-fork")}
    assert list(forked) == ["one", "two"]
    assert forked["one"] == source["one"]
    assert forked["two"].completed_at is not None
    assert source["two"].completed_at is not None
    assert forked["two"].completed_at > source["two"].completed_at
    # The same id again writes nothing; with no key every completed step is copied.
    assert (admin.fork_instance(store, "two", "t", "one", "t-fork", clock=SYSTEM_CLOCK)
            == ("t-fork", False))
    assert [s.key for s in engine.steps("two", "t-fork")] == ["one", "two"]
    whole, made = admin.fork_instance(store, "two", "t", clock=SYSTEM_CLOCK)
    assert made
    assert whole.startswith("t.fork-")
    assert [s.key for s in engine.steps("two", whole)] == ["one", "two"]
    assert engine.invocation("two", whole).result(TIMEOUT) == 2


def test_a_fork_of_a_failed_step_reruns_it_and_the_source_stays(engine: Engine) -> None:
    """A fork from a failed step copies the step before it and runs the failed one anew (failing
    again here); the source's steps and its failed status stay as they were."""
    engine.invoke("two", -1, instance_id="bad").wait(TIMEOUT)
    before = engine.steps("two", "bad")
    admin.fork_instance(_store(engine), "two", "bad", "two", "again", clock=SYSTEM_CLOCK)
    with pytest.raises(WorkflowFailed):  # the running engine takes the fork at its look
        engine.invocation("two", "again").result(TIMEOUT)
    forked = engine.steps("two", "again")
    assert [s.key for s in forked] == ["one", "two"]
    assert forked[0] == before[0]  # copied, not executed again
    assert forked[1].completed_at is None  # "two" failed again, anew
    assert (forked[1].state, forked[1].attempts) == (before[1].state, before[1].attempts)
    assert engine.steps("two", "bad") == before
    meta = engine.get_metadata("two", "bad")
    assert meta is not None
    assert type(meta.status).__name__ == "Failed"


def test_a_fork_onto_a_queue_runs_through_its_queue(engine: Engine) -> None:
    """A fork of an instance of a queued workflow is stored on that queue and runs through
    it."""
    engine.invoke("mailed", instance_id="m").result(TIMEOUT)
    new_id, _ = admin.fork_instance(_store(engine), "mailed", "m", None, "m2",
                                    clock=SYSTEM_CLOCK)
    assert engine.invocation("mailed", new_id).result(TIMEOUT) is None
    row = _store(engine).get_instance("mailed", "m2")
    assert row is not None
    assert row.queue == "mail"


def test_fork_refuses_what_it_cannot_do_writing_nothing(engine: Engine) -> None:
    """A fork from a key the instance never reached (StepNotFound, listing its keys), of an
    unknown instance, to an empty new id, or from a key that is not a str is refused, and no
    instance is written."""
    engine.invoke("two", 1, instance_id="t").result(TIMEOUT)
    store = _store(engine)
    with pytest.raises(StepNotFound, match=r"its keys: 'one', 'two'.*step 'three'") as err:
        admin.fork_instance(store, "two", "t", "three", "x", clock=SYSTEM_CLOCK)
    assert err.value.keys == ["one", "two"]
    with pytest.raises(InstanceNotFound):
        admin.fork_instance(store, "two", "nope", None, "x", clock=SYSTEM_CLOCK)
    with pytest.raises(InvalidKey):
        admin.fork_instance(store, "two", "t", None, "", clock=SYSTEM_CLOCK)
    with pytest.raises(InvalidKey):
        admin.fork_instance(store, "two", "t", 42, "x", clock=SYSTEM_CLOCK)  # type: ignore[arg-type]
    assert [i for i, _ in engine.list_instances("two")] == ["t"]
