"""Operations (issue 26, points 1 and 2): forking an instance from a step, and resuming
the failed ones in bulk, through the engine and the command line, on every store."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner
from helpers import cli, store_of

from memable import (
    ChildFailed,
    Context,
    Engine,
    InstanceNotFound,
    Suspended,
    WorkflowFailed,
    WorkflowNotFound,
)
from memable._cli.commands import main
from memable._store.sql import forks as forks_sql

TIMEOUT = 10
#: The steps each instance executed (not replayed), by instance id; cleared per test.
EXECUTED: dict[str, list[str]] = {}
#: The instances whose "flaky" step fails (until a test lets it work).
BROKEN: set[str] = set()
#: Set when a parent has caught its child's ChildFailed; cleared per test.
CAUGHT = threading.Event()


def pipeline(ctx: Context, n: int) -> int:
    ran = EXECUTED.setdefault(ctx.instance_id, [])

    def step(key: str, value: int) -> int:
        ran.append(key)
        if key == "load:v1" and ctx.instance_id in BROKEN:
            raise ConnectionError("warehouse down")
        return value

    a = ctx.step("extract:v1").run(lambda: step("extract:v1", n))
    b = ctx.step("transform:v1").run(lambda: step("transform:v1", a * 10))
    return ctx.step("load:v1").run(lambda: step("load:v1", b + 1))


def _fails(ctx: Context, n: int) -> int:
    """A child that fails."""
    return ctx.step("work").run(lambda: n // 0)


def _catches(ctx: Context, n: int) -> str:
    """A parent that handles its child's failure, then waits for a signal."""
    try:
        ctx.child("kid", "fails", n)
    except ChildFailed:  # the parent's step for it holds "told" by now
        CAUGHT.set()
        outcome = "handled"
    else:
        outcome = "kid worked"
    return f"{outcome}, {ctx.suspend('after')}"


def _propagates(ctx: Context, n: int) -> int:
    """A parent that fails with its child."""
    result: int = ctx.child("kid", "fails", n)
    return result


@pytest.fixture
def engine(make_engine: Callable[..., Engine]) -> Iterator[Engine]:
    EXECUTED.clear()
    BROKEN.clear()
    CAUGHT.clear()
    engine = make_engine(poll_interval=0.05)
    engine.register("pipeline", pipeline)
    engine.queue("batch", concurrency=1)
    engine.register("queued", pipeline, queue="batch")
    engine.register("fails", _fails)
    engine.register("catches", _catches)
    engine.register("propagates", _propagates)
    with engine:
        yield engine


# ---------------------------------------------------------------------- fork


def test_fork_reruns_from_the_key_and_leaves_the_source(engine: Engine) -> None:
    """``fork(from_key=...)`` copies the steps before that key into a new instance, which
    executes only the key and those after it; the source's steps stay as they were."""
    engine.invoke("pipeline", 1, instance_id="p").result(TIMEOUT)
    before = engine.steps("pipeline", "p")
    fork = engine.fork("pipeline", "p", from_key="transform:v1", new_instance_id="p2")
    assert fork.instance_id == "p2"
    assert fork.result(TIMEOUT) == 11
    assert EXECUTED["p2"] == ["transform:v1", "load:v1"]
    assert engine.steps("pipeline", "p") == before
    assert [s.key for s in engine.steps("pipeline", "p2")] == [
        "extract:v1", "transform:v1", "load:v1"]


def test_fork_after_a_fix_finishes_what_failed(engine: Engine) -> None:
    """A fork of a failed instance without ``from_key`` copies every completed step and,
    once the fault is gone, executes only the step that failed, under a generated
    ``<id>.fork-`` id; the source stays failed."""
    BROKEN.add("p")
    with pytest.raises(WorkflowFailed):
        engine.invoke("pipeline", 2, instance_id="p").result(TIMEOUT)
    fork = engine.fork("pipeline", "p")  # every completed step copied
    assert fork.instance_id.startswith("p.fork-")
    assert fork.result(TIMEOUT) == 21
    assert EXECUTED[fork.instance_id] == ["load:v1"]
    meta = engine.get_metadata("pipeline", "p")
    assert meta is not None
    assert meta.status.name == "failed"  # the source is untouched


def test_fork_of_a_queued_workflow_goes_through_its_queue(engine: Engine) -> None:
    """A fork of an instance of a queued workflow runs through that queue and executes only
    the steps from its key on."""
    engine.invoke("queued", 3, instance_id="q").result(TIMEOUT)
    fork = engine.fork("queued", "q", from_key="load:v1")
    assert fork.result(TIMEOUT) == 31
    assert EXECUTED[fork.instance_id] == ["load:v1"]


def test_fork_refuses_a_key_it_never_reached_a_taken_id_and_an_unknown_source(
    engine: Engine,
) -> None:
    """``fork`` refuses a key the source never reached (listing its keys), a new id that is
    taken, an unknown instance and an unknown workflow, and stores no instance for any of
    them."""
    engine.invoke("pipeline", 1, instance_id="p").result(TIMEOUT)
    with pytest.raises(ValueError, match=r"its keys: 'extract:v1', 'transform:v1', "
                       r"'load:v1'.*step 'ship:v1'"):
        engine.fork("pipeline", "p", from_key="ship:v1")
    with pytest.raises(ValueError, match=r"'p' is taken.*nothing was forked"):
        engine.fork("pipeline", "p", new_instance_id="p")
    with pytest.raises(InstanceNotFound):
        engine.fork("pipeline", "nope")
    with pytest.raises(WorkflowNotFound):
        engine.fork("nope", "p")
    assert [i for i, _ in engine.list_instances("pipeline")] == ["p"]


def test_a_fork_from_a_key_signalled_early_keeps_the_steps_reached_before_it(
    make_engine: Callable[..., Engine],
) -> None:
    """A signal delivered while an earlier step executes takes its place in the order
    where the run reaches its key: the source's steps read in the order reached, and a
    fork from that key replays every step reached before it (``charge`` and
    ``receipt``, executed once) and executes only from it. (The signal took the
    instance's highest seq plus one, at or below the steps run after it, and the fork
    charged again.)"""
    executed: list[tuple[str, str]] = []
    charging, signalled = threading.Event(), threading.Event()

    def order(ctx: Context) -> str:
        def charge() -> None:
            executed.append((ctx.instance_id, "charge"))
            charging.set()
            assert signalled.wait(TIMEOUT), "the test did not signal"

        ctx.step("charge").run(charge)
        ctx.step("receipt").run(lambda: executed.append((ctx.instance_id, "receipt")))
        approved = ctx.suspend("approve")
        ctx.step("ship").run(lambda: executed.append((ctx.instance_id, "ship")))
        return f"shipped ({approved})"

    engine = make_engine(poll_interval=0.05)
    engine.register("order", order)
    with engine:
        inv = engine.invoke("order", instance_id="o")
        assert charging.wait(TIMEOUT)
        engine.signal("order", "o", "approve", "yes")  # while charge executes
        signalled.set()
        assert inv.result(TIMEOUT) == "shipped (yes)"
        fork = engine.fork("order", "o", from_key="approve", new_instance_id="o2")
        assert isinstance(fork.wait(TIMEOUT), Suspended)  # at approve, which it re-runs
        assert engine.signal("order", "o2", "approve", "again").result(TIMEOUT) == (
            "shipped (again)")
        assert executed == [("o", "charge"), ("o", "receipt"), ("o", "ship"),
                            ("o2", "ship")]
        for instance_id in ("o", "o2"):
            assert [s.key for s in engine.steps("order", instance_id)] == [
                "charge", "receipt", "approve", "ship"]


@pytest.mark.parametrize("store_target", ["postgres"], indirect=True)
@pytest.mark.parametrize("before", [forks_sql.INSERT_FORK, forks_sql.COPY_STEPS_BEFORE],
                         ids=["insert", "copy"])
def test_a_purge_between_the_forks_statements_passes_its_source_over(
    engine: Engine, make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch,
    before: str,
) -> None:
    """A fork reads its source in several statements; a purge of the source that comes
    between them (forced: a second engine purges, on its own connection, just before the
    fork inserts the new instance, or copies the steps) passes the source over, so the
    fork is made, keeps the steps before its key and executes only from it. PostgreSQL
    alone: SQLite's fork holds the write lock throughout. (The fork holds the source FOR
    SHARE; without it the purge deleted the source, and the fork was refused as "id
    taken", or, stored with no steps, ran every step again.)"""
    engine.invoke("pipeline", 1, instance_id="p").result(TIMEOUT)
    purger = make_engine()
    store: Any = store_of(engine)
    real = store._tx
    purged: list[int] = []

    class Hooked:  # the fork's transaction, purging just before ``before`` runs
        def __init__(self, tx: Any) -> None:
            self.tx = tx

        def __getattr__(self, name: str) -> Any:
            return getattr(self.tx, name)

        def execute(self, text: str, params: Any = None) -> Any:
            if text == before:
                purged.append(purger.purge(0))
            return self.tx.execute(text, params)

    monkeypatch.setattr(store, "_tx", lambda conn: Hooked(real(conn)))
    fork = engine.fork("pipeline", "p", from_key="load:v1", new_instance_id="p2")
    assert purged == [0]  # the source was the fork's: passed over
    assert fork.result(TIMEOUT) == 11
    assert EXECUTED["p2"] == ["load:v1"]
    assert purger.purge(0) == 2  # once the fork committed, the source (and the fork) go


# ---------------------------------------------------------------------- resume_failed


def _failed(engine: Engine, *ids: str) -> None:
    for instance_id in ids:
        BROKEN.add(instance_id)
        with pytest.raises(WorkflowFailed):
            engine.invoke("pipeline", 1, instance_id=instance_id).result(TIMEOUT)


def test_resume_failed_resumes_oldest_first_up_to_the_limit(engine: Engine) -> None:
    """``resume_failed(limit=2)`` resumes the two oldest failures and leaves the third
    failed; without a workflow it takes the failures of every workflow, and with none left
    it resumes nothing."""
    _failed(engine, "f-1", "f-2", "f-3")
    BROKEN.clear()  # the fix is deployed
    assert engine.resume_failed("pipeline", limit=2) == 2
    assert engine.invocation("pipeline", "f-1").result(TIMEOUT) == 11
    assert engine.invocation("pipeline", "f-2").result(TIMEOUT) == 11
    meta = engine.get_metadata("pipeline", "f-3")
    assert meta is not None
    assert meta.status.name == "failed"
    assert engine.resume_failed() == 1  # every workflow
    assert engine.invocation("pipeline", "f-3").result(TIMEOUT) == 11
    assert engine.resume_failed("pipeline") == 0


def test_resume_failed_since_takes_only_the_later_failures(engine: Engine) -> None:
    """``resume_failed(since=...)`` resumes only the instances that failed after that
    instant; an earlier failure stays failed."""
    _failed(engine, "old")
    meta = engine.get_metadata("pipeline", "old")
    assert meta is not None
    assert meta.completed_at is not None
    later = meta.completed_at + timedelta(microseconds=1)
    _failed(engine, "new")
    BROKEN.clear()
    assert engine.resume_failed("pipeline", since=later) == 1
    assert engine.invocation("pipeline", "new").result(TIMEOUT) == 11
    old = engine.get_metadata("pipeline", "old")
    assert old is not None
    assert old.status.name == "failed"


def test_resume_failed_leaves_a_child_whose_parent_handled_its_failure(
    engine: Engine,
) -> None:
    """A failed child whose parent caught its ChildFailed is not resumed, while the parent
    waits and once it has completed (resumed, the child's end would settle the parent's
    step with an outcome the parent never saw); a child whose parent failed with it is
    left to the parent, whose resumed run resumes it. Counted and acted on alike: one
    instance, the failed parent."""
    engine.invoke("catches", 1, instance_id="c")
    assert CAUGHT.wait(TIMEOUT)
    with pytest.raises(WorkflowFailed):
        engine.invoke("propagates", 1, instance_id="p").result(TIMEOUT)
    failed = {(w, i) for w in ("fails", "propagates")
              for i, meta in engine.list_instances(w) if meta.status.name == "failed"}
    assert failed == {("fails", "c/kid"), ("fails", "p/kid"), ("propagates", "p")}
    assert engine.resume_failed("fails") == 0  # c waits, p ended: both failures handled
    assert engine.signal("catches", "c", "after", "done").result(TIMEOUT) == "handled, done"
    assert engine.resume_failed("fails") == 0  # c has ended too
    assert engine.resume_failed() == 1  # the parent p
    with pytest.raises(WorkflowFailed):  # it resumes its child, which fails again
        engine.invocation("propagates", "p").result(TIMEOUT)
    assert ("fails", "p/kid") in {(w, i) for w in ("fails",)
                                  for i, _ in engine.list_instances(w)}
    kid = engine.get_metadata("fails", "c/kid")
    assert kid is not None
    assert kid.status.name == "failed"
    assert engine.invocation("catches", "c").result(TIMEOUT) == "handled, done"


def test_memable_resume_failed_with_a_limit_acts_only_on_those_it_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``memable resume --failed --limit 2`` counts f-1 and f-2; while it asks, f-1 is
    resumed and fails again (forced: the confirmation does it). It then resumes f-2
    alone: not f-1's new failure, which came after the count, and not f-3, which it
    never counted. (It counted again when it acted, and took f-2 and f-3.)"""
    EXECUTED.clear()
    BROKEN.clear()
    path = tmp_path / "app.db"
    engine = Engine.open(path, poll_interval=0.05)
    engine.register("pipeline", pipeline)

    def refail_f1(text: str, **_: object) -> bool:
        assert text == "resume 2 failed instances of 'pipeline'?"
        with pytest.raises(WorkflowFailed):
            engine.resume("pipeline", "f-1").result(TIMEOUT)
        return True

    with engine:
        _failed(engine, "f-1", "f-2", "f-3")
        monkeypatch.setattr(click, "confirm", refail_f1)
        result = cli("resume", path, "pipeline", "--failed", "--limit", "2")
        assert result.exit_code == 0, result.output
        assert "resumed 1 of 2 failed instances of 'pipeline'" in result.stdout
        BROKEN.discard("f-2")
        assert engine.invocation("pipeline", "f-2").result(TIMEOUT) == 11
        statuses = {i: meta.status.name for i, meta in engine.list_instances("pipeline")}
    assert statuses == {"f-1": "failed", "f-2": "completed", "f-3": "failed"}


@pytest.mark.parametrize(("kwargs", "error"), [
    ({"limit": 0}, ValueError), ({"limit": 1.5}, ValueError),
    ({"since": datetime(2026, 1, 1)}, ValueError),  # naive
    ({"since": "2026-01-01"}, ValueError),
])
def test_resume_failed_refuses_bad_arguments(
    engine: Engine, kwargs: dict[str, object], error: type[Exception]
) -> None:
    """``resume_failed`` refuses a limit that is not a positive int, a naive or string
    ``since`` and an unknown workflow."""
    with pytest.raises(error):
        engine.resume_failed("pipeline", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(WorkflowNotFound):
        engine.resume_failed("nope")


# ---------------------------------------------------------------------- the command line


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Path]:
    """A file with a completed pipeline p and two failed ones, f-1 and f-2 (no engine
    running: what the commands write waits for one)."""
    EXECUTED.clear()
    BROKEN.clear()
    path = tmp_path / "app.db"
    engine = Engine.open(path)
    engine.register("pipeline", pipeline)
    with engine:
        engine.invoke("pipeline", 1, instance_id="p").result(TIMEOUT)
        _failed(engine, "f-1", "f-2")
    BROKEN.clear()
    return path


def _run(path: Path, *ids: str) -> dict[str, int]:
    """Start an engine on ``path`` and wait for ``ids`` to end; their results."""
    engine = Engine.open(path, poll_interval=0.05)
    engine.register("pipeline", pipeline)
    with engine:
        return {i: engine.invocation("pipeline", i).result(TIMEOUT) for i in ids}


def test_memable_fork_stores_a_fork_an_engine_runs(store: Path) -> None:
    """``memable fork --from --id`` stores the fork with no engine running, and the next
    engine on the file runs only its steps from that key; forking again onto a taken id
    exits 2 and forks nothing."""
    result = cli("fork", store, "pipeline", "p", "--from", "load:v1", "--id", "p2")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("forked pipeline/p as p2 from load:v1")
    assert _run(store, "p2") == {"p2": 11}
    assert EXECUTED["p2"] == ["load:v1"]
    again = cli("fork", store, "pipeline", "p", "--id", "p2")
    assert again.exit_code == 2
    assert "pipeline/p2 exists: nothing was forked" in again.stderr


def test_memable_fork_of_a_key_it_never_reached_exits_2_naming_its_keys(
    store: Path,
) -> None:
    """``memable fork --from`` with a key the source never reached exits 2 listing its keys,
    and so does forking an unknown instance."""
    result = cli("fork", store, "pipeline", "p", "--from", "ship")
    assert result.exit_code == 2
    assert "its keys: 'extract:v1', 'transform:v1', 'load:v1'" in result.stderr
    assert cli("fork", store, "pipeline", "nope").exit_code == 2


def test_memable_resume_failed_asks_with_the_count_and_resumes_those(store: Path) -> None:
    """``memable resume --failed`` asks for confirmation with the count: declining exits 1
    resuming nothing; confirming resumes both failed instances, which the next engine
    completes."""
    declined = CliRunner().invoke(main, ["resume", str(store), "pipeline", "--failed"],
                                  input="n\n")
    assert declined.exit_code == 1
    assert "resume 2 failed instances of 'pipeline'?" in declined.output
    assert "nothing resumed" in declined.output
    confirmed = CliRunner().invoke(main, ["resume", str(store), "pipeline", "--failed"],
                                   input="y\n")
    assert confirmed.exit_code == 0, confirmed.output
    assert "resumed 2 of 2 failed instances of 'pipeline'" in confirmed.output
    assert _run(store, "f-1", "f-2") == {"f-1": 11, "f-2": 11}


def test_memable_resume_failed_yes_since_and_limit(store: Path) -> None:
    """``memable resume --failed --yes`` honours ``--since`` (a duration or an instant) and
    ``--limit``, and says so when nothing is left to resume."""
    result = cli("resume", store, "pipeline", "--failed", "--yes", "--since", "1h",
                 "--limit", "1")
    assert result.exit_code == 0, result.output
    assert "resumed 1 of 1 failed instance of 'pipeline'" in result.stdout
    future = (datetime.now(timezone.utc) + timedelta(hours=1)).isoformat()
    nothing = cli("resume", store, "pipeline", "--failed", "--yes", "--since", future)
    assert "nothing to resume" in nothing.stdout


@pytest.mark.parametrize("args", [
    ["--failed", "--since", "yesterday"],
    ["--failed", "--since", "2026-12-01T00:00:00"],  # no offset
    ["f-1", "--failed"],
    ["--yes"],
])
def test_memable_resume_refuses_what_it_cannot_read_with_exit_2(
    store: Path, args: list[str]
) -> None:
    """``memable resume`` exits 2 with an error for an unreadable or naive ``--since``, an
    id together with ``--failed``, or ``--yes`` without ``--failed``, and changes no
    instance."""
    result = cli("resume", store, "pipeline", *args)
    assert result.exit_code == 2
    assert result.stderr.startswith("memable: error: ")
    assert _statuses(store) == {"p": "completed", "f-1": "failed", "f-2": "failed"}


def _statuses(path: Path) -> dict[str, str]:
    engine = Engine.open(path)
    try:
        return {i: m.status.name for i, m in engine.list_instances("pipeline")}
    finally:
        engine.close()
