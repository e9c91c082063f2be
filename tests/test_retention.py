"""Retention: the engine's thread purges finished instances older than ``retention``, in
batches of at most 500 per transaction, never a run in flight or an instance with a live
child; a SQLite file returns the pages (incremental auto-vacuum).

No test sleeps: the retention thread looks when the engine starts and then only once a
minute (with a retention of an hour), so a test kicks it for another round and waits on
a condition that the store's ``purge_batch`` (wrapped) notifies.
"""

from __future__ import annotations

import itertools
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers import (
    FailsThenWaits,
    build,
    earlier_sqlite_store,
    query,
    runner_of,
    store_of,
    until,
    write,
)

from memable import ChildFailed, Context, Engine, MetadataStatus, WorkflowFailed
from memable._background.retention import Purger
from memable._postgres.transaction import PostgresTransaction
from memable._sqlite.schema import SCHEMA_VERSION, switch_to_incremental_vacuum
from memable._sqlite.store import SQLiteStore
from memable._states import Cancelled, Completed, Failed, Suspended
from memable._store.admin import PURGE_BATCH as BATCH
from memable._store.sql import retention as retention_sql

#: When the "old" instances finished: long before any retention here.
OLD = "2001-01-01T00:00:00+00:00"
HOUR = timedelta(hours=1)


class Batches:
    """Wraps the engine's ``store.purge_batch``: each call's (limit, deleted), and a
    condition notified after each; a round ends with a batch that was not full."""

    def __init__(self, engine: Engine,
                 after: Callable[[int], None] | None = None) -> None:
        self.calls: list[tuple[int, int]] = []
        self._cond = threading.Condition()
        self._engine = engine
        store = store_of(engine)
        inner = store.purge_batch

        def purge_batch(completed_before: float, limit: int, now: float) -> int:
            deleted = inner(completed_before, limit, now)
            with self._cond:
                self.calls.append((limit, deleted))
                self._cond.notify_all()
            if after is not None:
                after(len(self.calls))
            return deleted

        store.purge_batch = purge_batch  # type: ignore[method-assign]

    def rounds(self) -> int:
        return sum(1 for limit, deleted in self.calls if deleted < limit)

    def wait_rounds(self, n: int, timeout: float = 30.0) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self.rounds() >= n, timeout), self.calls

    def another_round(self) -> list[tuple[int, int]]:
        """Kick the (idle) retention thread and wait for its round; that round's calls."""
        with self._cond:
            rounds, start = self.rounds(), len(self.calls)
        purger(self._engine).kick()
        self.wait_rounds(rounds + 1)
        with self._cond:
            return self.calls[start:]


def purger(engine: Engine) -> Purger:
    found = runner_of(engine)._purger
    assert found is not None
    return found


def ids(engine: Engine, workflow: str) -> set[str]:
    return {instance_id for instance_id, _ in engine.list_instances(workflow)}


def backdate(engine: Engine, *instance_ids: str) -> None:
    """Make the instances look finished long ago (whatever their status)."""
    for instance_id in instance_ids:
        write(engine, "UPDATE memable_instances SET completed_at = ? WHERE instance_id = ?",
              (OLD, instance_id))


def _finished_rows(workflow: str, n: int, steps: int, size: int, prefix: str
                   ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    at = OLD
    result = '"' + "x" * size + '"'
    instances = [(workflow, f"{prefix}-{i}", "completed", "null", result, at, at, at)
                 for i in range(n)]
    rows = [(workflow, f"{prefix}-{i}", f"s{k}", k, "step", "completed", result, 1, at)
            for i in range(n) for k in range(steps)]
    return instances, rows


INSERT_INSTANCES = (
    "INSERT INTO memable_instances (workflow, instance_id, status, input, output, created_at, "
    "updated_at, completed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)")
INSERT_STEPS = (
    "INSERT INTO memable_steps (workflow, instance_id, key, seq, kind, state, result, attempts, "
    "completed_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")


def insert_finished(conn: sqlite3.Connection, workflow: str, n: int, *, steps: int = 1,
                    size: int = 100, prefix: str = "old") -> None:
    """Insert ``n`` completed instances that finished at ``OLD`` on a SQLite connection
    (autocommit), in one transaction."""
    instances, rows = _finished_rows(workflow, n, steps, size, prefix)
    conn.execute("BEGIN IMMEDIATE")
    conn.executemany(INSERT_INSTANCES, instances)
    conn.executemany(INSERT_STEPS, rows)
    conn.execute("COMMIT")


def bulk_finished(engine: Engine, workflow: str, n: int, *, steps: int = 1,
                  size: int = 100, prefix: str = "old") -> None:
    """Insert ``n`` completed instances of ``workflow`` (with ``steps`` steps each holding
    ``size`` characters) that finished at ``OLD``, behind the engine's back, quickly."""
    store = store_of(engine)
    if isinstance(store, SQLiteStore):
        with store._lock:
            insert_finished(store._conn, workflow, n, steps=steps, size=size, prefix=prefix)
        return
    instances, rows = _finished_rows(workflow, n, steps, size, prefix)
    pool = store._db._pool  # type: ignore[attr-defined]
    with pool.connection() as pg, pg.transaction(), pg.cursor() as cursor:
        cursor.executemany(INSERT_INSTANCES.replace("?", "%s"), instances)
        cursor.executemany(INSERT_STEPS.replace("?", "%s"), rows)


# ---------------------------------------------------------------------- the option


@pytest.mark.parametrize(("value", "error", "phrase"), [
    (0, ValueError, "retention is > 0 seconds"),
    (-1.0, ValueError, "retention is > 0 seconds"),
    (float("nan"), ValueError, "retention"),
    ("30d", TypeError, "retention is float seconds or a timedelta"),
    (True, TypeError, "retention"),
])
def test_a_bad_retention_is_refused_naming_it(value: object, error: type, phrase: str) -> None:
    """A zero, negative, NaN, string or bool ``retention`` is refused, naming it, both by
    ``Engine.in_memory`` and by the builder."""
    with pytest.raises(error, match=phrase):
        Engine.in_memory(retention=value)  # type: ignore[arg-type]
    with pytest.raises(error, match=phrase):
        Engine.builder().in_memory().retention(value)  # type: ignore[arg-type]


def test_retention_is_kept_as_seconds_and_none_starts_no_thread() -> None:
    """A ``timedelta`` retention is kept as seconds, and an engine without retention starts
    no retention thread."""
    engine = Engine.builder().in_memory().retention(timedelta(days=30)).build()
    assert runner_of(engine).options.retention == 30 * 86400.0
    engine.close()
    engine = Engine.in_memory()
    with engine:
        assert runner_of(engine).options.retention is None
        assert runner_of(engine)._purger is None
        assert "memable-retention" not in {t.name for t in threading.enumerate()}


# ---------------------------------------------------------------------- what goes, what stays


def test_retention_purges_only_finished_instances_older_than_it(
    make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture,
) -> None:
    """Completed, failed and cancelled instances that finished before now - retention go,
    with their steps and timers; newer ones, and a suspended one, stay."""
    engine = make_engine(retention=HOUR)

    def done(ctx: Context) -> str:
        return ctx.step("a").run(lambda: "done")

    def fails(ctx: Context) -> str:
        return ctx.step("a").run(lambda: 1 // 0)  # type: ignore[no-any-return]

    def waits(ctx: Context) -> str:
        return str(ctx.suspend("go"))

    for name, fn in (("done", done), ("fails", fails), ("waits", waits)):
        engine.register(name, fn)
    batches = Batches(engine)
    caplog.set_level(logging.INFO, logger="memable")
    with engine:
        batches.wait_rounds(1)  # the look at start: nothing to purge yet
        assert engine.invoke("done", instance_id="d-old").wait(10) == Completed()
        assert engine.invoke("done", instance_id="d-new").wait(10) == Completed()
        assert isinstance(engine.invoke("fails", instance_id="f-old").wait(10), Failed)
        assert isinstance(engine.invoke("waits", instance_id="c-old").wait(10), Suspended)
        engine.cancel("waits", "c-old")
        assert isinstance(engine.invoke("waits", instance_id="w-old").wait(10), Suspended)
        # Even with an old completed_at, a suspended instance is not finished.
        backdate(engine, "d-old", "f-old", "c-old", "w-old")
        # A stray timer of a finished instance goes with it.
        write(engine, "INSERT INTO memable_timers (workflow, instance_id, key, deadline) "
              "VALUES ('done', 'd-old', 'stray', 1e12)")

        assert batches.another_round() == [(BATCH, 3)]

        assert ids(engine, "done") == {"d-new"}
        assert ids(engine, "fails") == set()
        assert ids(engine, "waits") == {"w-old"}
        assert query(engine, "SELECT DISTINCT instance_id FROM memable_steps ORDER BY 1") == [
            ("d-new",), ("w-old",)]
        assert query(engine, "SELECT instance_id FROM memable_timers") == []
        assert purger(engine).purged == 3
        # The one left waiting goes on as if nothing happened.
        assert engine.signal("waits", "w-old", "go", "now").result(10) == "now"
    purged = [r.getMessage() for r in caplog.records if "retention: purged" in r.getMessage()]
    assert len(purged) == 1
    assert purged[0].startswith("retention: purged 3 finished instances")


def test_a_run_in_flight_is_never_purged(make_engine: Callable[..., Engine]) -> None:
    """An instance cancelled while its step runs is finished but still owned: it stays
    until its run lets go, and goes at the next round."""
    engine = make_engine(retention=HOUR)
    in_step, release = threading.Event(), threading.Event()

    def slow() -> str:
        in_step.set()
        release.wait(10)
        return "stored"

    engine.register("wf", lambda ctx: ctx.step("slow").run(slow))
    batches = Batches(engine)
    with engine:
        batches.wait_rounds(1)
        inv = engine.invoke("wf", instance_id="job-1")
        try:
            assert in_step.wait(10)
            engine.cancel("wf", "job-1")
            backdate(engine, "job-1")
            assert batches.another_round() == [(BATCH, 0)]
            assert ids(engine, "wf") == {"job-1"}
        finally:
            release.set()
        assert inv.wait(timeout=10) == Cancelled()
        assert [(s.key, s.state) for s in engine.steps("wf", "job-1")] == [
            ("slow", "completed")]
        backdate(engine, "job-1")
        assert batches.another_round() == [(BATCH, 1)]
        assert ids(engine, "wf") == set()


def test_an_instance_with_a_live_child_is_kept_until_the_child_ends(
    make_engine: Callable[..., Engine],
) -> None:
    """A parent that failed with its child, whose child was then resumed and waits: the
    parent stays while the child lives; once the child ends, both go."""
    engine = make_engine(retention=HOUR)
    child = FailsThenWaits()

    def parent(ctx: Context) -> str:
        return str(ctx.child("kid", "child"))

    engine.register("child", child)
    engine.register("parent", parent)
    batches = Batches(engine)
    with engine:
        batches.wait_rounds(1)
        with pytest.raises(WorkflowFailed):
            engine.invoke("parent", instance_id="p").result(10)
        meta = engine.get_metadata("child", "p/kid")
        assert meta is not None
        assert isinstance(meta.status, MetadataStatus.Failed)
        child.failing = False
        assert engine.resume("child", "p/kid").wait(10) == Suspended("finish")
        backdate(engine, "p")

        assert batches.another_round() == [(BATCH, 0)]
        assert ids(engine, "parent") == {"p"}

        assert engine.signal("child", "p/kid", "finish", "bye").result(10) == "bye"
        backdate(engine, "p", "p/kid")
        assert batches.another_round() == [(BATCH, 2)]
        assert ids(engine, "parent") == ids(engine, "child") == set()


def test_a_finished_child_of_a_parent_in_a_run_is_kept(
    make_engine: Callable[..., Engine],
) -> None:
    """The run of a parent may read (or resume) its children: while it runs, its
    finished child stays; once the parent ends, both go."""
    engine = make_engine(retention=HOUR)
    in_step, release = threading.Event(), threading.Event()

    def hold() -> str:
        in_step.set()
        release.wait(10)
        return "held"

    def parent(ctx: Context) -> str:
        got = ctx.child("kid", "child")
        return f"{got} {ctx.step('hold').run(hold)}"

    engine.register("child", lambda ctx: "kid done")
    engine.register("parent", parent)
    batches = Batches(engine)
    with engine:
        batches.wait_rounds(1)
        inv = engine.invoke("parent", instance_id="p")
        try:
            assert in_step.wait(10)
            child = engine.get_metadata("child", "p/kid")
            assert child is not None
            assert child.status == MetadataStatus.Completed()
            backdate(engine, "p/kid")
            assert batches.another_round() == [(BATCH, 0)]
            assert ids(engine, "child") == {"p/kid"}
        finally:
            release.set()
        assert inv.result(10) == "kid done held"
        backdate(engine, "p", "p/kid")
        assert batches.another_round() == [(BATCH, 2)]
        assert ids(engine, "parent") == ids(engine, "child") == set()


def _retries_its_child(ctx: Context) -> str:
    """Waits for the signal "retry" when its child fails; the run after it resumes the
    failed child (and waits for it), or gives up if the child is gone."""
    try:
        return str(ctx.child("kid", "child"))
    except ChildFailed:
        ctx.suspend("retry")
        return "gave up"


def test_a_failed_child_its_parent_resumed_is_kept_until_its_run_claims_it(
    make_engine: Callable[..., Engine],
) -> None:
    """A parent caught ``ChildFailed`` and waits; signalled, its run resumes the failed
    child (its step for the child waits again) and suspends on it, before the child's
    run has claimed the child (held here): a purge then keeps the child, which runs,
    and the parent gets its output. (The purge deleted it: the child's claim found
    nothing and the parent waited for ever.)"""
    engine = make_engine()
    child = FailsThenWaits()
    engine.register("child", child)
    engine.register("parent", _retries_its_child)
    store = store_of(engine)
    begin_run = store.begin_run
    claiming, go = threading.Event(), threading.Event()

    def hold_the_childs_claim(workflow: str, instance_id: str, **kwargs: Any) -> Any:
        if workflow == "child" and not child.failing:
            claiming.set()
            assert go.wait(30)
        return begin_run(workflow, instance_id, **kwargs)

    store.begin_run = hold_the_childs_claim  # type: ignore[method-assign]
    with engine:
        _waits_for_retry(engine)
        child.failing = False
        try:
            assert engine.signal("parent", "p", "retry", None).wait(10) == Suspended(
                "child kid")
            assert claiming.wait(10)
            assert engine.get_metadata("child", "p/kid") is not None
            assert engine.purge(older_than=0) == 0
        finally:
            go.set()
        assert engine.invocation("child", "p/kid").wait(10) == Suspended("finish")
        assert engine.signal("child", "p/kid", "finish", "bye").result(10) == "bye"
        assert engine.invocation("parent", "p").result(10) == "bye"


class PurgeHold:
    """Holds a PostgreSQL purge's transaction once, right after the statement ``at``
    picks, while ``meanwhile`` runs in a thread of its own, until a server backend
    waits for one of the purge's locks or ``done`` holds."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, at: Callable[[str], bool],
                 meanwhile: Callable[[], object],
                 done: Callable[[], bool] = lambda: False) -> None:
        self.held = threading.Event()
        self.errors: list[BaseException] = []
        execute = PostgresTransaction.execute

        def run(tx: PostgresTransaction, text: str, params: Any = None) -> Any:
            cursor = execute(tx, text, params)
            if at(text) and not self.held.is_set():
                self.held.set()
                self._hold(tx._conn.info.backend_pid, meanwhile, done)
            return cursor

        monkeypatch.setattr(PostgresTransaction, "execute", run)

    def _hold(self, pid: int, meanwhile: Callable[[], object], done: Callable[[], bool]
              ) -> None:
        def run() -> None:
            try:
                meanwhile()
            except BaseException as exc:  # pragma: no cover - reported by the test
                self.errors.append(exc)

        threading.Thread(target=run, name="test-meanwhile", daemon=True).start()
        until(lambda: done() or _waits_for(pid), 30)


def _waits_for(pid: int) -> bool:
    """Whether a backend of the test server waits for a lock the backend ``pid`` holds."""
    import psycopg
    from conftest import POSTGRES_URL

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_activity "
                           "WHERE %s = ANY(pg_blocking_pids(pid))", (pid,)).fetchone()
    return bool(row and row[0])


def _parent_retrying(engine: Engine) -> Callable[[], None]:
    """Register the parent that retries its child; the call that starts "p" (once the
    engine is), whose child fails, and leaves it waiting for "retry", the child now able
    to work."""
    child = FailsThenWaits()
    engine.register("child", child)
    engine.register("parent", _retries_its_child)

    def start() -> None:
        _waits_for_retry(engine)
        child.failing = False

    return start


def _waits_for_retry(engine: Engine) -> None:
    """Invoke "p" and wait until it waits for "retry" (its child failed)."""
    inv = engine.invoke("parent", instance_id="p")
    until(lambda: inv.wait(10) == Suspended("retry"))


def test_postgres_a_purge_keeps_a_child_whose_parent_takes_it_back_after_the_choice(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PostgreSQL: a batch has chosen (and locked) the failed child of a parent waiting
    for "retry"; the signal arrives then, the parent's run resumes the child and
    suspends on it, and the child's claim waits for the batch's lock. The batch reads
    the rules again once it holds the parent: it keeps the child, which then runs, and
    the parent gets its output. (It deleted the child: the parent waited for ever.)"""
    from conftest import POSTGRES_URL

    engine = build(POSTGRES_URL, schema=pg_schema).engine
    start = _parent_retrying(engine)
    try:
        with engine:
            start()
            hold = PurgeHold(monkeypatch, lambda text: text == retention_sql.CHOOSE,
                             lambda: engine.signal("parent", "p", "retry", None))
            assert engine.purge(older_than=0) == 0
            assert hold.held.is_set()
            assert not hold.errors
            assert engine.invocation("child", "p/kid").wait(10) == Suspended("finish")
            assert engine.signal("child", "p/kid", "finish", "bye").result(10) == "bye"
            assert engine.invocation("parent", "p").result(10) == "bye"
    finally:
        engine.close()


def test_postgres_a_parent_waits_for_a_purge_that_judged_by_it(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PostgreSQL: a batch has judged the failed child of a parent waiting for "retry"
    purgeable and is about to delete it when the signal arrives: the parent is locked
    by the batch, so its run starts after the commit and finds the child gone (the
    workflow gives up) instead of resuming a child the batch then deletes, which left
    the parent waiting for ever."""
    from conftest import POSTGRES_URL

    engine = build(POSTGRES_URL, schema=pg_schema).engine
    start = _parent_retrying(engine)
    try:
        with engine:
            start()
            hold = PurgeHold(monkeypatch,
                             lambda text: text.startswith("DELETE FROM memable_timers"),
                             lambda: engine.signal("parent", "p", "retry", None))
            assert engine.purge(older_than=0) == 1
            assert hold.held.is_set()
            assert not hold.errors
            assert engine.get_metadata("child", "p/kid") is None
            assert engine.invocation("parent", "p").result(10) == "gave up"
    finally:
        engine.close()


def test_postgres_a_purge_keeps_a_failed_parent_whose_child_is_resumed_after_the_choice(
    pg_schema: str, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """PostgreSQL: a batch has chosen (and locked) a parent that failed with its child;
    the child is resumed then, and its run starts and waits. The batch reads the rules
    again once it holds the child: the parent stays while its child lives (it was
    deleted, the child outliving it)."""
    from conftest import POSTGRES_URL

    engine = build(POSTGRES_URL, schema=pg_schema).engine
    child = FailsThenWaits()
    engine.register("child", child)
    engine.register("parent", lambda ctx: str(ctx.child("kid", "child")))
    try:
        with engine:
            with pytest.raises(WorkflowFailed):
                engine.invoke("parent", instance_id="p").result(10)
            child.failing = False
            backdate(engine, "p")  # only the parent is old enough to go

            def resumed() -> bool:
                meta = engine.get_metadata("child", "p/kid")
                return meta is not None and not isinstance(meta.status, MetadataStatus.Failed)

            hold = PurgeHold(monkeypatch, lambda text: text == retention_sql.CHOOSE,
                             lambda: engine.resume("child", "p/kid"), done=resumed)
            assert engine.purge(older_than=HOUR) == 0
            assert hold.held.is_set()
            assert not hold.errors
            assert engine.get_metadata("parent", "p") is not None
            assert engine.invocation("child", "p/kid").wait(10) == Suspended("finish")
    finally:
        engine.close()


# ---------------------------------------------------------------------- batches


def test_a_purge_goes_in_batches_of_at_most_500(make_engine: Callable[..., Engine]) -> None:
    """1,234 old instances: the look at start purges them in three transactions of
    500, 500 and 234, each one call of ``purge_batch``."""
    engine = make_engine(retention=HOUR)
    engine.register("wf", lambda ctx: "new")
    bulk_finished(engine, "wf", 1234)
    batches = Batches(engine)
    with engine:
        batches.wait_rounds(1)
        assert batches.calls == [(BATCH, 500), (BATCH, 500), (BATCH, 234)]
        assert BATCH == 500
        assert ids(engine, "wf") == set()
        assert query(engine, "SELECT count(*) FROM memable_steps") == [(0,)]
        assert purger(engine).purged == 1234


def test_engines_purging_one_store_at_once_share_the_work(
    open_shared: Callable[..., Engine],
) -> None:
    """Three engines on one file or schema purge 3,000 old instances at once: each
    instance goes once, nothing fails, and every batch holds at most 500."""
    engines = [open_shared(retention=HOUR) for _ in range(3)]
    for engine in engines:
        engine.register("wf", lambda ctx: "new")
    bulk_finished(engines[0], "wf", 3000)
    started = threading.Barrier(3)
    watched = [Batches(e, after=lambda n: started.wait(10) if n == 1 else None)
               for e in engines]
    errors: list[BaseException] = []

    def start(engine: Engine) -> None:
        try:
            engine.start()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=start, args=(e,)) for e in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not errors
    for batches in watched:
        batches.wait_rounds(1)
    calls = [call for batches in watched for call in batches.calls]
    assert all(deleted <= limit == BATCH for limit, deleted in calls)
    assert sum(deleted for _, deleted in calls) == 3000
    assert sum(purger(e).purged for e in engines) == 3000
    assert ids(engines[0], "wf") == set()
    for engine in engines:
        engine.stop()


def test_a_one_off_purge_lets_another_engine_write_between_its_batches(
    open_shared: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """``engine.purge`` of 5,000 old instances goes in batches, one transaction each:
    another engine on the store, which starts invoking and heartbeating once the purge's
    first batch is under way, gets its writes through while old instances are still
    there (it waits one batch at most, never the whole purge), with no error or
    warning; the purge takes them all. (In one transaction, the other engine's writes
    waited for all of it, and for a large store failed with "database is locked".)"""
    purging = open_shared()
    other = open_shared()
    other.register("work", lambda ctx, n: ctx.step("s").run(lambda: n + 1))
    bulk_finished(purging, "old", 5000)
    under_way, wrote = threading.Event(), threading.Event()
    old_left: list[int] = []  # old instances stored when the other engine's writes went
    errors: list[BaseException] = []
    choose = retention_sql.purge_batch

    def first_batch_under_way(*args: Any, **kwargs: Any) -> int:
        under_way.set()  # inside the batch's transaction
        return choose(*args, **kwargs)

    monkeypatch.setattr(retention_sql, "purge_batch", first_batch_under_way)
    one_batch = store_of(purging).purge_batch

    def purge_batch(completed_before: float, limit: int, now: float) -> int:
        deleted = one_batch(completed_before, limit, now)
        assert wrote.wait(30)  # the next batch once the other engine's writes went
        return deleted

    store_of(purging).purge_batch = purge_batch  # type: ignore[method-assign]

    def write_meanwhile() -> None:
        try:
            assert under_way.wait(30)
            inv = other.invoke("work", 1, instance_id="during")
            store_of(other).heartbeat(time.time())
            [(left,)] = query(
                other, "SELECT count(*) FROM memable_instances WHERE workflow = 'old'")
            old_left.append(int(left))
            assert inv.result(30) == 2
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            wrote.set()

    caplog.set_level(logging.WARNING, logger="memable")
    with other:
        writer = threading.Thread(target=write_meanwhile, name="test-writer")
        writer.start()
        try:
            assert purging.purge(older_than=0) == 5000
        finally:
            wrote.set()
            writer.join(30)
    assert not errors, errors
    assert len(old_left) == 1
    assert old_left[0] > 0  # they went before the purge ended
    assert ids(purging, "old") == set()
    assert ids(purging, "work") == {"during"}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


# ---------------------------------------------------------------------- the file shrinks


def _file_bytes(path: Path) -> tuple[int, int]:
    """(page_count * page_size, the file's size after a checkpoint) of a SQLite file."""
    with closing(sqlite3.connect(path)) as conn:
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    return pages * size, os.path.getsize(path)


def test_20000_finished_instances_are_purged_the_file_shrinks_and_runs_go_on(
    tmp_path: Path,
) -> None:
    """20,000 old instances on a file: the retention thread purges them in 40 batches
    while the engine runs other workflows, which all complete correctly and are kept;
    the file ends several times smaller."""
    path = tmp_path / "big.db"
    engine = build(path, retention=HOUR, poll_interval=0.05).engine

    def work(ctx: Context, n: int) -> int:
        doubled = ctx.step("double").run(lambda: n * 2)
        return doubled + ctx.step("one").run(lambda: 1)  # type: ignore[no-any-return]

    engine.register("work", work)
    engine.register("old", lambda ctx: None)
    bulk_finished(engine, "old", 20_000, steps=2, size=300)
    logical, before = _file_bytes(path)
    assert logical == before  # a checkpointed file is its pages
    first_batch, go_on = threading.Event(), threading.Event()

    def after(n: int) -> None:
        if n == 1:  # hold the purge after its first batch until runs have started
            first_batch.set()
            assert go_on.wait(10)

    batches = Batches(engine, after)
    results: dict[int, Any] = {}
    try:
        with engine:
            assert first_batch.wait(10)
            invs = [engine.invoke("work", n, instance_id=f"w-{n}") for n in range(20)]
            go_on.set()
            counter = itertools.count(20)
            while batches.rounds() == 0:  # keep invoking while the purge goes on
                n = next(counter)
                invs.append(engine.invoke("work", n, instance_id=f"w-{n}"))
            during = len(invs)
            batches.wait_rounds(1)
            for n, inv in enumerate(invs):
                results[n] = inv.result(timeout=30)
            assert ids(engine, "old") == set()
            assert ids(engine, "work") == {f"w-{n}" for n in range(during)}
    finally:
        go_on.set()
        engine.close()
    assert results == {n: 2 * n + 1 for n in range(during)}
    assert batches.calls[:40] == [(BATCH, 500)] * 40
    assert sum(deleted for _, deleted in batches.calls) == 20_000
    logical_after, after_size = _file_bytes(path)
    print(f"file: {before} bytes with 20,000 old instances, {after_size} after the purge "
          f"({logical} -> {logical_after} in pages); {during} runs meanwhile")
    assert after_size == logical_after
    assert after_size * 5 < before


# ---------------------------------------------------------------------- auto_vacuum


def _auto_vacuum(path: Path) -> int:
    with closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("PRAGMA auto_vacuum").fetchone()[0])


def test_a_new_file_is_made_with_incremental_auto_vacuum(tmp_path: Path) -> None:
    """A new SQLite file, and a new in-memory SQLite store, are made with incremental auto-
    vacuum."""
    path = tmp_path / "new.db"
    Engine.open(path).close()
    assert _auto_vacuum(path) == 2  # incremental
    store = SQLiteStore(None, "full")
    assert store._conn.execute("PRAGMA auto_vacuum").fetchone() == (2,)
    store.close()


def test_an_older_file_without_auto_vacuum_is_switched_when_migrated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A store at schema version 11, made (as that release made them) without
    auto_vacuum, is migrated, then switched by a VACUUM outside the migration's
    transaction: its rows stay, and purges shrink it."""
    path = tmp_path / "v11.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("PRAGMA journal_mode = WAL")
        earlier_sqlite_store(conn, 11, lambda: insert_finished(conn, "wf", 2000, size=1000))
    assert _auto_vacuum(path) == 0
    _, before = _file_bytes(path)

    caplog.set_level(logging.INFO, logger="memable")
    engine = build(path, retention=HOUR).engine
    engine.register("wf", lambda ctx: "new")
    assert _auto_vacuum(path) == 2
    assert _sqlite_version(path) == SCHEMA_VERSION
    assert any("switched" in r.getMessage() and "incremental auto-vacuum" in r.getMessage()
               for r in caplog.records)
    assert len(ids(engine, "wf")) == 2000  # the VACUUM kept every row
    batches = Batches(engine)
    with engine:
        batches.wait_rounds(1)
        assert engine.invoke("wf").result(10) == "new"
    engine.close()
    assert purger(engine).purged == 2000
    _, after = _file_bytes(path)
    print(f"version 11 file: {before} bytes with 2,000 old instances, {after} after")
    assert after * 5 < before


def _sqlite_version(path: Path) -> int:
    with closing(sqlite3.connect(path)) as conn:
        return int(conn.execute("SELECT version FROM memable_schema").fetchone()[0])


def test_a_switch_that_cannot_run_leaves_the_store_as_it_was(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """VACUUM cannot run inside a transaction: the store is left as it was, with a
    WARNING saying how to switch it by hand."""
    path = tmp_path / "busy.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("CREATE TABLE memable_t (a)")
        conn.execute("BEGIN")
        conn.execute("INSERT INTO memable_t VALUES (1)")
        assert switch_to_incremental_vacuum(conn, str(path)) is False
        conn.execute("COMMIT")
    assert _auto_vacuum(path) == 0
    assert any(r.levelno == logging.WARNING and "VACUUM" in r.getMessage()
               for r in caplog.records)
