"""Tests that kill mutants mutmut found surviving in the concurrency-critical modules.

Each guards a behaviour no other test pinned down: the group commit's
batching and its refusals, the timer thread's wake-up on a newly armed timer.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing, suppress
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import attrs
import pytest
from helpers import write

from memable import (
    Completed,
    Context,
    Engine,
    EngineError,
    Failed,
    InProgress,
    NotStarted,
    StorageError,
)
from memable._background.timers import BackgroundThread
from memable._clock import Clock
from memable._run.options import Options
from memable._run.runner import Runner
from memable._sqlite.group_commit import GroupCommit, _Pending
from memable._sqlite.store import SQLiteStore
from memable._store import admin
from memable._store.control import LostInstance
from memable._store.protocol import InstanceRow, StepWrite
from memable._store.rows import UNREACHED


class _Recording:
    """A connection that records every statement (and can interrupt the ``n``-th COMMIT)."""

    def __init__(self, conn: sqlite3.Connection, interrupt_commit: int = 0) -> None:
        self._conn = conn
        self._commits_left = interrupt_commit
        self.statements: list[str] = []

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        self.statements.append(sql.split()[0] if sql.startswith("INSERT") else sql)
        if sql == "COMMIT" and self._commits_left:
            self._commits_left -= 1
            if self._commits_left == 0:
                raise KeyboardInterrupt
        return self._conn.execute(sql, *args)

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction


# Connections _commits opened, closed after each test (an unclosed one warns at GC).
_OPENED: list[sqlite3.Connection] = []


@pytest.fixture(autouse=True)
def _close_opened_connections() -> Iterator[None]:
    yield
    while _OPENED:
        _OPENED.pop().close()


def _commits(tmp_path: Path, interrupt_commit: int = 0) -> tuple[GroupCommit, _Recording]:
    conn = sqlite3.connect(
        tmp_path / "t.db", isolation_level=None, check_same_thread=False
    )
    _OPENED.append(conn)
    conn.execute("CREATE TABLE t (x TEXT)")
    proxy = _Recording(conn, interrupt_commit)
    commits = GroupCommit(threading.Lock(), "t.db", lambda: proxy)  # type: ignore[arg-type,return-value]
    return commits, proxy


def _insert(x: str, before: Callable[[], None] = lambda: None) -> Callable[..., None]:
    def body(c: sqlite3.Connection) -> None:
        before()
        c.execute("INSERT INTO t VALUES (?)", (x,))

    return body


def _rows(tmp_path: Path) -> list[str]:
    with closing(sqlite3.connect(tmp_path / "t.db")) as reader:
        return sorted(x for (x,) in reader.execute("SELECT x FROM t"))


def _queue_three_behind_one(
    commits: GroupCommit, write: Callable[[str, Callable[[], None]], None]
) -> None:
    """Writer a commits while b, c and d queue behind it; return once all four ended."""
    three_queued = threading.Event()
    commits.on_queue = lambda n: three_queued.set() if n == 3 else None
    a = threading.Thread(target=write, args=("a", lambda: three_queued.wait(10)))
    a.start()
    others = [threading.Thread(target=write, args=(x, lambda: None)) for x in "bcd"]
    for thread in others:
        thread.start()
    for thread in [a, *others]:
        thread.join(10)
        assert not thread.is_alive()


def test_writers_queued_behind_a_commit_share_exactly_one_transaction(tmp_path: Path) -> None:
    """b, c and d queued behind a: two transactions in all, and each queued write is undone alone.

    A follower woken with its work done returns; it does not lead an empty
    commit of its own.
    """
    commits, proxy = _commits(tmp_path)
    errors: list[BaseException] = []

    def write(x: str, before: Callable[[], None]) -> None:
        try:
            commits.write("insert", None, None, None, _insert(x, before))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    _queue_three_behind_one(commits, write)
    assert errors == []
    assert _rows(tmp_path) == ["a", "b", "c", "d"]
    assert proxy.statements.count("BEGIN IMMEDIATE") == 2
    assert proxy.statements.count("COMMIT") == 2
    assert proxy.statements.count("SAVEPOINT write") == 3


def test_a_lone_single_statement_write_runs_without_begin_or_commit(tmp_path: Path) -> None:
    """A one-statement write alone in its commit is its own autocommit transaction."""
    commits, proxy = _commits(tmp_path)
    commits.write("insert", None, None, None, _insert("a"), single=True)
    commits.write("insert", None, None, None, _insert("b"))
    assert proxy.statements == ["INSERT", "BEGIN IMMEDIATE", "INSERT", "COMMIT"]
    assert _rows(tmp_path) == ["a", "b"]


def test_a_lone_single_statement_write_that_refuses_raises_to_its_writer(
    tmp_path: Path,
) -> None:
    """The refusal of a one-statement body run alone reaches its writer; nothing is left open."""
    commits, proxy = _commits(tmp_path)

    def refuse(c: sqlite3.Connection) -> None:
        raise EngineError("refused")

    with pytest.raises(EngineError, match="refused"):
        commits.write("insert", None, None, None, refuse, single=True)
    assert proxy.statements == []
    commits.write("insert", None, None, None, _insert("a"), single=True)
    assert _rows(tmp_path) == ["a"]


def test_a_failed_batch_tells_each_writer_what_of_its_own_failed(tmp_path: Path) -> None:
    """An interrupted batch: each StorageError names its write, workflow, instance and key."""
    commits, _ = _commits(tmp_path, interrupt_commit=2)
    outcomes: dict[str, BaseException | None] = {}

    def write(x: str, before: Callable[[], None]) -> None:
        try:
            commits.write(f"store {x}", f"wf-{x}", f"id-{x}", f"key-{x}", _insert(x, before))
            outcomes[x] = None
        except BaseException as exc:
            outcomes[x] = exc

    _queue_three_behind_one(commits, write)
    assert outcomes["a"] is None
    failed = {x: e for x, e in outcomes.items() if isinstance(e, StorageError)}
    assert len(failed) == 2
    for x, error in failed.items():
        assert str(error).startswith(
            f"cannot store {x} in t.db: the transaction was interrupted "
            "(KeyboardInterrupt) and rolled back"
        )
        assert (error.workflow, error.instance_id, error.key) == (f"wf-{x}", f"id-{x}", f"key-{x}")
        assert isinstance(error.__cause__, KeyboardInterrupt)
    assert _rows(tmp_path) == ["a"]


def test_a_timer_armed_while_the_thread_sleeps_to_the_next_poll_wakes_it(tmp_path: Path) -> None:
    """A 0.2 s timer fires long before the thread's next look (60 s poll, 200 s heartbeat).

    The run starts only once the thread made its first look and went to
    sleep: arming the timer must wake it to look at the deadlines again.
    """
    engine = Engine.open(tmp_path / "db", poll_interval=60, lease=600)
    engine.register("wf", lambda ctx: ctx.timer("soon:v1", 0.2) or "fired")
    looked = threading.Event()
    real = engine._runner._tick

    def tick(poll: bool) -> float | None:
        until = real(poll)
        looked.set()
        return until

    engine._runner._tick = tick  # type: ignore[method-assign]
    with engine:
        assert looked.wait(10)
        assert engine.invoke("wf").result(timeout=10) == "fired"
    engine.close()


def test_a_writer_that_refuses_in_a_batch_undoes_only_its_own_statements(tmp_path: Path) -> None:
    """c inserts, then refuses, in one batch with b and d: c gets its error, b and d commit."""
    commits, proxy = _commits(tmp_path)
    outcomes: dict[str, BaseException | None] = {}

    def write(x: str, before: Callable[[], None]) -> None:
        def body(c: sqlite3.Connection) -> None:
            _insert(x, before)(c)
            if x == "c":
                raise EngineError("c refuses")

        try:
            commits.write("insert", None, None, None, body)
            outcomes[x] = None
        except BaseException as exc:
            outcomes[x] = exc

    _queue_three_behind_one(commits, write)
    assert isinstance(outcomes.pop("c"), EngineError)
    assert outcomes == {"a": None, "b": None, "d": None}
    assert _rows(tmp_path) == ["a", "b", "d"]
    assert proxy.statements.count("ROLLBACK TO write") == 1


def test_a_storage_error_in_a_write_names_the_sqlite_error(tmp_path: Path) -> None:
    """A sqlite3 error in a body fails the write with a StorageError that quotes it."""
    commits, proxy = _commits(tmp_path)

    def broken(c: sqlite3.Connection) -> None:
        c.execute("INSERT INTO missing VALUES (1)")

    with pytest.raises(StorageError, match=r"^cannot insert in t\.db \(no such table: missing\)"):
        commits.write("insert", None, None, None, broken)
    assert proxy.statements[-1] == "ROLLBACK"
    assert not proxy.in_transaction


def test_the_timer_thread_is_a_daemon_named_for_memable(tmp_path: Path) -> None:
    """One daemon thread named memable-timers per started engine (a forgotten stop never hangs)."""
    engine = Engine.open(tmp_path / "db")
    with engine:
        timers = [t for t in threading.enumerate() if t.name == "memable-timers"]
        assert len(timers) == 1
        assert timers[0].daemon
    engine.close()
    assert not timers[0].is_alive()


def test_an_engine_whose_start_failed_stops_and_closes_cleanly(tmp_path: Path) -> None:
    """Registering as an owner fails: start raises it, and stop and close still work."""
    engine = Engine.open(tmp_path / "db")

    def register_owner(lease: float, now: float, declares: str | None = None) -> None:
        raise StorageError("cannot register the engine (forced)")

    engine._store.register_owner = register_owner  # type: ignore[method-assign]
    with pytest.raises(StorageError, match="forced"):
        engine.start()
    engine.stop()
    engine.close()
    assert not [t for t in threading.enumerate() if t.name == "memable-timers"]


# ---------------------------------------------------------------------- the timer thread's loop


def _ticking(
    poll_interval: float, answer: Callable[[int], float | None], clock: Clock | None = None
) -> tuple[BackgroundThread, list[bool], threading.Condition]:
    """A timer thread whose tick records its ``poll`` flags and answers ``answer(n)``."""
    polls: list[bool] = []
    ticked = threading.Condition()

    def tick(poll: bool) -> float | None:
        with ticked:
            polls.append(poll)
            ticked.notify_all()
            return answer(len(polls))

    thread = BackgroundThread(tick, poll_interval, clock or Clock())
    return thread, polls, ticked


def _wait_ticks(polls: list[bool], ticked: threading.Condition, n: int, timeout: float) -> bool:
    with ticked:
        return ticked.wait_for(lambda: len(polls) >= n, timeout)


def test_the_timer_thread_polls_once_per_interval_and_ticks_again_when_armed() -> None:
    """A first look polls; a timer armed later gets a look without a poll (next poll: 60 s)."""
    thread, polls, ticked = _ticking(60, lambda n: None)
    thread.start()
    assert _wait_ticks(polls, ticked, 1, 10)
    thread.armed()
    assert _wait_ticks(polls, ticked, 2, 10)
    thread.stop()
    assert polls == [True, False]


def test_the_timer_thread_looks_again_at_once_when_a_deadline_is_due() -> None:
    """Ticks that answer "due now" get the next look at once: five in well under a second each."""
    thread, polls, ticked = _ticking(60, lambda n: 0.0)
    start = time.monotonic()
    thread.start()
    assert _wait_ticks(polls, ticked, 5, 10)
    thread.stop()
    assert time.monotonic() - start < 2.5


def test_the_timer_thread_polls_every_interval_even_below_a_second() -> None:
    """With a 10 ms poll interval, five polls take far less than five seconds."""
    thread, polls, ticked = _ticking(0.01, lambda n: None)
    start = time.monotonic()
    thread.start()
    assert _wait_ticks(polls, ticked, 5, 10)
    thread.stop()
    assert time.monotonic() - start < 2.5
    assert polls[:5] == [True] * 5


def test_a_timer_thread_stopped_before_its_first_look_never_ticks() -> None:
    """stop() lands while the thread starts up: it ends without a single tick."""
    started, go = threading.Event(), threading.Event()

    def monotonic() -> float:
        if not started.is_set():
            started.set()
            assert go.wait(10)
        return time.monotonic()

    thread, polls, _ = _ticking(60, lambda n: None, Clock(monotonic=monotonic))
    thread.start()
    assert started.wait(10)
    stopper = threading.Thread(target=thread.stop)
    stopper.start()
    with thread._cond:
        assert thread._cond.wait_for(lambda: thread._stopping, 10)
    go.set()
    stopper.join(10)
    assert not thread.is_alive()
    assert polls == []


# ---------------------------------------------------------------------- step writes and fencing


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


@pytest.fixture
def two_engines(tmp_path: Path) -> Iterator[tuple[Engine, Engine]]:
    """Two engines on one file, not started (neither has an owner row, so either may claim)."""
    a, b = Engine.open(tmp_path / "db"), Engine.open(tmp_path / "db")
    yield a, b
    a.close()
    b.close()


def _instance(engine: Engine, instance_id: str) -> None:
    now = _now()
    assert engine._store.create_instance(InstanceRow(
        workflow="wf", instance_id=instance_id, status="running", message=None,
        input="null", input_type=None, output=None, output_type=None,
        created_at=now, updated_at=now, completed_at=None,
    ))


def _step(key: str, result: str, kind: str = "step") -> StepWrite:
    return StepWrite(
        workflow="wf", instance_id="i", key=key, seq=0, kind=kind,  # type: ignore[arg-type]
        state="completed", result=result, result_type=None, status=None, error=None,
        at=_now(), started=_now(),
    )


def test_a_step_write_of_an_engine_that_lost_its_instance_is_refused(
    two_engines: tuple[Engine, Engine],
) -> None:
    """B claims the instance A created: A's step write raises LostInstance and stores nothing."""
    a, b = two_engines
    _instance(a, "i")
    a._store.save_step(_step("first", "1"))
    assert b._store.begin_run("wf", "i", now=_now(), claim="resume") is not None
    with pytest.raises(LostInstance) as lost:
        a._store.save_step(_step("second", "2"))
    assert lost.value.args == ("wf", "i")
    assert a._store.read_step("wf", "i", "second") is None
    b._store.save_step(_step("second", "3"))
    stored = b._store.read_step("wf", "i", "second")
    assert stored is not None
    assert stored.result == "3"


def test_placing_a_signal_is_the_owners_alone(two_engines: tuple[Engine, Engine]) -> None:
    """A signal stored before the run reached its key waits at UNREACHED; the owner's run
    places it, and once B has claimed the instance A's placement raises LostInstance and
    leaves the row as it was, while B's takes."""
    a, b = two_engines
    _instance(a, "i")
    for key in ("k1", "k2"):
        admin.store_signal(a._store, "wf", "i", key, key)

    def seqs() -> list[int | None]:
        rows = [b._store.read_step("wf", "i", key) for key in ("k1", "k2")]
        return [None if row is None else row.seq for row in rows]

    a._store.place_signal("wf", "i", "k1", 3)
    assert b._store.begin_run("wf", "i", now=_now(), claim="resume") is not None
    with pytest.raises(LostInstance):
        a._store.place_signal("wf", "i", "k2", 4)
    assert seqs() == [3, UNREACHED]
    b._store.place_signal("wf", "i", "k2", 4)
    assert seqs() == [3, 4]


def test_a_step_write_to_a_key_stored_as_another_kind_is_refused(
    two_engines: tuple[Engine, Engine],
) -> None:
    """The owner writes a step where a signal is stored: InvalidKey names both kinds."""
    a, _ = two_engines
    _instance(a, "i")
    a._store.save_step(_step("k", "1", kind="signal"))
    with pytest.raises(EngineError) as info:
        a._store.save_step(_step("k", "2"))
    assert type(info.value).__name__ == "InvalidKey"
    assert str(info.value) == (
        "invalid key 'k' (it holds a signal, and the workflow uses it as a step): "
        "workflow 'wf', instance 'i'"
    )
    stored = a._store.read_step("wf", "i", "k")
    assert stored is not None
    assert (stored.kind, stored.result) == ("signal", "1")


def test_a_step_write_to_a_key_completed_meanwhile_leaves_it(
    two_engines: tuple[Engine, Engine],
) -> None:
    """The owner writes a key completed as the same kind: no error, the first row stands."""
    a, _ = two_engines
    _instance(a, "i")
    a._store.save_step(_step("k", "1"))
    a._store.save_step(_step("k", "2"))
    stored = a._store.read_step("wf", "i", "k")
    assert stored is not None
    assert stored.result == "1"


def test_a_run_check_by_an_engine_that_lost_its_instance_raises_lost_instance(
    two_engines: tuple[Engine, Engine],
) -> None:
    """check_run: the owner sees the status; a former owner, or a missing instance, is lost."""
    a, b = two_engines
    _instance(a, "i")
    assert a._store.check_run("wf", "i") == "running"
    assert b._store.begin_run("wf", "i", now=_now(), claim="resume") is not None
    assert b._store.check_run("wf", "i") == "running"
    a._store.cancel("wf", "i", now=_now())
    assert b._store.check_run("wf", "i") == "cancelled"
    for store, instance_id in [(a._store, "i"), (b._store, "missing")]:
        with pytest.raises(LostInstance) as lost:
            store.check_run("wf", instance_id)
        assert lost.value.args == ("wf", instance_id)


def test_a_fired_timer_records_when_it_completed(tmp_path: Path) -> None:
    """The timer thread fires a due timer: its step row is completed with a completion time."""
    engine = Engine.open(tmp_path / "db", poll_interval=0.05)
    engine.register("wf", lambda ctx: ctx.timer("t:v1", 0.1) or "fired")
    with engine:
        inv = engine.invoke("wf")
        assert inv.result(timeout=10) == "fired"
    engine.close()
    with closing(sqlite3.connect(tmp_path / "db")) as reader:
        sql = "SELECT state, completed_at FROM steps WHERE key = 't:v1'"
        rows = reader.execute(sql).fetchall()
    [(state, completed_at)] = rows
    assert state == "completed"
    assert completed_at is not None


def test_stop_leaves_an_engine_stopped_for_good() -> None:
    """stop() on a new engine or a started one: it says stopped, and it cannot start (again)."""
    for start_first in (False, True):
        engine = Engine.in_memory()
        if start_first:
            engine.start()
        engine.stop()
        assert repr(engine).startswith("<Engine stopped ")
        with pytest.raises(EngineError):
            engine.start()
        engine.close()
        assert repr(engine).startswith("<Engine closed ")


def _owner_row(path: Path, owner: str) -> tuple[Any, ...] | None:
    with closing(sqlite3.connect(path)) as reader:
        return reader.execute(  # type: ignore[no-any-return]
            "SELECT heartbeat, lease, started_at FROM owners WHERE id = ?", (owner,)
        ).fetchone()


def test_a_heartbeat_renews_the_lease_and_brings_back_a_reaped_owner(tmp_path: Path) -> None:
    """heartbeat moves only the heartbeat; an owner row reaped meanwhile is registered again."""
    db = tmp_path / "db"
    engine = Engine.open(db)
    store = engine._store
    store.register_owner(30.0, 1000.0)
    first = _owner_row(db, store.owner)
    assert first is not None
    store.heartbeat(1010.0)
    assert _owner_row(db, store.owner) == (1010.0, 30.0, first[2])
    with closing(sqlite3.connect(db)) as writer, writer:
        writer.execute("DELETE FROM owners WHERE id = ?", (store.owner,))
    store.heartbeat(5000.0)
    again = _owner_row(db, store.owner)
    assert again is not None
    assert again[:2] == (5000.0, 30.0)
    assert again[2] != first[2]
    engine.close()


def test_a_step_with_a_timeout_gets_its_arguments_and_fails_with_its_own_error(
    tmp_path: Path,
) -> None:
    """fn(*args, **kwargs) on the timeout thread: the arguments arrive, its error is the step's."""
    engine = Engine.open(tmp_path / "db")

    def add(a: int, b: int = 0) -> int:
        return a + b

    def boom() -> None:
        raise ValueError("boom")

    def wf(ctx: Any) -> int:
        total: int = ctx.step("add").timeout(10).run(add, 1, b=2)
        ctx.step("boom").timeout(10).run(boom)
        return total

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        state = inv.wait(timeout=10)
        [add_row, boom_row] = engine.steps("wf", inv.instance_id)
    engine.close()
    assert add_row.result == 3
    assert "ValueError" in str(state)
    assert "boom" in str(state)
    assert boom_row.error is not None
    assert "boom" in boom_row.error


def test_a_stored_step_keeps_when_its_execution_started(tmp_path: Path) -> None:
    """A completed step's row holds the time its execution began."""
    engine = Engine.open(tmp_path / "db")
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda: 1))
    with engine:
        assert engine.invoke("wf").result(timeout=10) == 1
    engine.close()
    with closing(sqlite3.connect(tmp_path / "db")) as reader:
        [(started_at,)] = reader.execute("SELECT started_at FROM steps").fetchall()
    assert started_at is not None


@pytest.mark.parametrize("where", ["memory", "file"])
def test_a_write_after_the_store_closed_fails_naming_it(tmp_path: Path, where: str) -> None:
    """Not an AttributeError from the closed connection: a StorageError that says why."""
    store = SQLiteStore(None if where == "memory" else tmp_path / "db", "normal")
    store.close()
    write = StepWrite(
        workflow="wf", instance_id="x", key="k", seq=0, kind="step", state="completed",
        result="1", result_type=None, status=None, error=None, at="2026-01-01T00:00:00+00:00",
    )
    with pytest.raises(StorageError) as raised:
        store.save_step(write)
    assert str(raised.value).startswith("cannot store the step in ")
    assert str(raised.value).endswith(
        "(the store is closed): workflow 'wf', instance 'x', step 'k'"
    )
    with pytest.raises(StorageError) as raised:
        store.check_run("wf", "x")
    assert str(raised.value).startswith("cannot check the run in ")
    assert str(raised.value).endswith("(the store is closed): workflow 'wf', instance 'x'")
    assert (raised.value.workflow, raised.value.instance_id) == ("wf", "x")


def test_a_tick_that_raises_is_logged_and_the_thread_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A failed look (a store locked past its timeout) is logged; the next look still comes."""

    def answer(n: int) -> float | None:
        if n == 1:
            raise sqlite3.OperationalError("database is locked")
        return None

    thread, polls, ticked = _ticking(60, answer)
    with caplog.at_level(logging.ERROR, logger="memable"):
        thread.start()
        assert _wait_ticks(polls, ticked, 1, 10)
        thread.armed()
        assert _wait_ticks(polls, ticked, 2, 10)
        thread.stop()
    [failed] = caplog.records
    assert failed.getMessage() == "timer thread: looking at the store failed; trying again"
    assert failed.exc_info is not None
    assert isinstance(failed.exc_info[1], sqlite3.OperationalError)


def test_looks_that_fail_with_a_storage_error_log_one_line_per_run_of_failures(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A store unreachable for several looks is one WARNING line without a traceback, not
    one traceback per look; after a look that succeeds, the next failure is said again."""

    def answer(n: int) -> float | None:
        if n in (1, 2, 3, 5):
            raise StorageError(f"cannot look at the store (look {n})")
        return None

    thread, polls, ticked = _ticking(60, answer)
    with caplog.at_level(logging.WARNING, logger="memable"):
        thread.start()
        assert _wait_ticks(polls, ticked, 1, 10)
        for n in range(2, 7):  # each look armed after the one before began
            thread.armed()
            assert _wait_ticks(polls, ticked, n, 10)
        thread.stop()
    assert [r.getMessage() for r in caplog.records] == [
        "timer thread: looking at the store failed; trying again "
        "(cannot look at the store (look 1))",
        "timer thread: looking at the store failed; trying again "
        "(cannot look at the store (look 5))",
    ]
    assert not [r for r in caplog.records if r.exc_info]


class _Told:
    """Stands for RunChecks: records what the group commit tells it after a transaction."""

    def __init__(self) -> None:
        self.told: list[tuple[bool, list[tuple[str, str]] | None]] = []

    def after_write(self, before: int, ok: bool, forget: list[tuple[str, str]] | None) -> None:
        self.told.append((ok, forget))


def _item(changes: str, workflow: str | None = "wf", instance_id: str | None = "x") -> Any:
    return _Pending(lambda conn: None, "write", workflow, instance_id, None, False, changes)


@pytest.mark.parametrize(
    ("batch", "forget"),
    [
        ([("none",)], []),
        ([("none",), ("instance",)], [("wf", "x")]),
        ([("instance",), ("none",)], [("wf", "x")]),
        ([("instance", "wf", "x"), ("instance", "wf", "y")], [("wf", "x"), ("wf", "y")]),
        ([("instance", "wf", None)], None),
        ([("instance", None, "x")], None),
        ([("any",)], None),
        ([("none",), ("any",), ("instance",)], None),
    ],
    ids=["none", "none-then-instance", "instance-then-none", "two-instances",
         "instance-without-id", "instance-without-workflow", "any", "any-among-others"],
)
def test_the_group_commit_tells_the_run_checks_whose_status_may_have_changed(
    batch: list[tuple[Any, ...]], forget: list[tuple[str, str]] | None
) -> None:
    told = _Told()
    commits = GroupCommit(threading.Lock(), "here", lambda: None, told)  # type: ignore[arg-type]
    commits._tell_watch(0, True, [_item(*spec) for spec in batch])
    assert told.told == [(True, forget)]
    assert (told.told[0][1] is None) == (forget is None)


def test_a_refused_write_in_a_batch_is_told_as_not_ok() -> None:
    told = _Told()
    commits = GroupCommit(threading.Lock(), "here", lambda: None, told)  # type: ignore[arg-type]
    refused = _item("none")
    refused.error = LostInstance("wf", "x")
    commits._tell_watch(0, True, [_item("none"), refused, _item("none")])
    commits._tell_watch(0, False, [_item("none")])
    assert told.told == [(False, []), (False, [])]


@pytest.mark.parametrize("lease", ["expired", "current"])
def test_an_owner_elsewhere_is_judged_by_its_lease(tmp_path: Path, lease: str) -> None:
    """An owner on another host is judged by its lease alone.

    Expired, its instance is taken over and run on; current, it is left
    alone however many times the engine looks.
    """
    db = tmp_path / "db"
    ran: list[str] = []

    def wf(ctx: Any) -> str:
        ctx.step("a").run(lambda: ran.append("a") or "a")
        return str(ctx.step("b").run(lambda: ran.append("b") or "b"))

    first = Engine.open(db)
    first.register("wf", wf)
    with first:
        first.invoke("wf", instance_id="x").result(timeout=10)
    first.close()
    heartbeat = 1000.0 if lease == "expired" else time.time()
    with closing(sqlite3.connect(db)) as conn, conn:  # as if it ran on another host
        conn.execute(
            "INSERT INTO owners (id, host, pid, heartbeat, lease, started_at) "
            "VALUES ('ghost', 'another-host', 4242, ?, 600.0, '2026-01-01')",
            (heartbeat,),
        )
        conn.execute("UPDATE instances SET status = 'running', owner = 'ghost', output = NULL")
        conn.execute("DELETE FROM steps WHERE key = 'b'")
    second = Engine.open(db, poll_interval=0.05)
    second.register("wf", wf)
    looks = threading.Semaphore(0)
    real_look = second._store.look_around

    def look(*args: Any) -> Any:
        found = real_look(*args)
        looks.release()
        return found

    second._store.look_around = look  # type: ignore[method-assign]
    with second:
        if lease == "expired":
            assert second.invocation("wf", "x").result(timeout=10) == "b"
        else:
            for _ in range(3):  # three looks at the store, each after the last
                assert looks.acquire(timeout=10)
        owner = second._store.read_rows("owner", "SELECT owner FROM instances", {})
    second.close()
    if lease == "expired":
        assert ran == ["a", "b", "b"]
    else:
        assert ran == ["a", "b"]
        assert owner == [{"owner": "ghost"}]


def test_a_step_passes_keyword_arguments_to_its_function() -> None:
    engine = Engine.in_memory()
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda a, *, b: a + b, 1, b=2))
    with engine:
        assert engine.invoke("wf").result(timeout=10) == 3
    engine.close()


def test_a_step_whose_attempt_timed_out_does_not_hold_up_another_steps_timeout() -> None:
    """Step a timed out (its call abandoned); step b, with a timeout of its own, runs at once."""
    release = threading.Event()
    engine = Engine.in_memory()

    def wf(ctx: Any) -> str:
        with suppress(EngineError):
            ctx.step("a").timeout(0.05).run(release.wait, 30)
        return str(ctx.step("b").timeout(10).run(lambda: "b"))

    engine.register("wf", wf)
    try:
        with engine:
            assert engine.invoke("wf").result(timeout=10) == "b"
    finally:
        release.set()
        engine.close()


# ---------------------------------------------------------------------- the runner's runs


@attrs.frozen
class _Order:
    id: int
    total: float


def test_a_resumed_run_decodes_its_stored_input_with_its_type(
    make_engine: Callable[..., Engine],
) -> None:
    """A resumed run (not the first) reads its input from the store, as the annotated class."""
    engine = make_engine()
    fail = [True]

    def wf(ctx: Context, order: _Order) -> str:
        ctx.step("a").run(lambda: order.id)
        if fail[0]:
            ctx.step("b").run(lambda: 1 / 0)
        return f"{order.id}: {order.total:.2f} ({type(order).__name__})"

    engine.register("wf", wf)
    with engine:
        first = engine.invoke("wf", _Order(7, 19.5), instance_id="x")
        assert isinstance(first.wait(timeout=10), Failed)
        fail[0] = False
        assert engine.resume("wf", "x").result(timeout=10) == "7: 19.50 (_Order)"


def test_a_replay_restores_the_status_a_step_was_stored_with(
    make_engine: Callable[..., Engine],
) -> None:
    """The status set before a stored step (by code that does not set it again) is published
    once the resumed run leaves replay."""
    engine = make_engine()
    first_run, entered, release = [True], threading.Event(), threading.Event()

    def wf(ctx: Context) -> int:
        if first_run[0]:
            ctx.set_status("first run only")
        ctx.step("a").run(lambda: 1)
        if first_run[0]:
            ctx.step("b").run(lambda: 1 / 0)
        return int(ctx.step("c").run(lambda: entered.set() or release.wait(10)))

    engine.register("wf", wf)
    with engine:
        assert isinstance(engine.invoke("wf", instance_id="x").wait(timeout=10), Failed)
        first_run[0] = False
        resumed = engine.resume("wf", "x")
        try:
            assert entered.wait(10)
            assert resumed.state == InProgress("first run only")
        finally:
            release.set()
        assert resumed.result(timeout=10) == 1


def test_only_a_recovered_instance_logs_that_its_owner_died(
    make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    engine = make_engine()
    fail = [True]
    engine.register("wf", lambda ctx: ctx.step("a").run(lambda: 1 / 0 if fail[0] else 1))
    with caplog.at_level(logging.INFO, logger="memable"), engine:
        assert isinstance(engine.invoke("wf", instance_id="x").wait(timeout=10), Failed)
        fail[0] = False
        assert engine.resume("wf", "x").result(timeout=10) == 1
    assert not [r for r in caplog.records if "owner died" in r.getMessage()]


@pytest.mark.parametrize("store_target", ["file", "postgres"], indirect=True)
def test_the_invocation_of_a_run_that_lost_its_instance_follows_the_engine_that_took_it(
    make_engine: Callable[..., Engine],
) -> None:
    """A's run is in step a when its lease is made to run out; B takes the instance and runs
    it. A's write is then refused and its run ends, while B still runs: A's Invocation must
    wait for B's end (it returned the running row's state)."""
    a = make_engine(poll_interval=0.05, lease=600)  # A's heartbeat never comes in time
    b = make_engine(poll_interval=0.05)
    in_a, release_a, in_b, release_b = (threading.Event() for _ in range(4))

    def wf_a(ctx: Context) -> str:
        return str(ctx.step("a").run(lambda: in_a.set() or (release_a.wait(10) and "from a")))

    def wf_b(ctx: Context) -> str:
        return str(ctx.step("a").run(lambda: in_b.set() or (release_b.wait(10) and "from b")))

    a.register("wf", wf_a)
    b.register("wf", wf_b)
    a_ended = threading.Event()
    real = a._store.get_instance

    def noting_the_end(*args: Any, **kwargs: Any) -> Any:
        found = real(*args, **kwargs)
        if release_a.is_set():  # the refused run reads the store once it lost the instance
            a_ended.set()
        return found

    a._store.get_instance = noting_the_end  # type: ignore[method-assign]
    with a, b:
        inv = a.invoke("wf", instance_id="x")
        assert in_a.wait(10)
        write(a, "UPDATE owners SET heartbeat = 0 WHERE id = ?", (a._store.owner,))
        assert in_b.wait(10)
        waited: list[Any] = []
        waiter = threading.Thread(target=lambda: waited.append(inv.wait(timeout=20)))
        waiter.start()
        release_a.set()
        assert a_ended.wait(10)
        release_b.set()
        waiter.join(30)
        assert waited == [Completed()]
        assert inv.result(timeout=10) == "from b"


def test_a_suspend_point_rebuilds_its_signal_as_the_class_it_returns(
    make_engine: Callable[..., Engine],
) -> None:
    """``ctx.suspend(key, returns=C)`` gives the run that goes on a C, not the stored dict,
    for a payload sent as plain JSON (as the command line sends it)."""
    engine = make_engine()

    def wf(ctx: Context) -> str:
        order = ctx.suspend("order", returns=_Order)
        return f"{type(order).__name__} {order.id}"

    engine.register("wf", wf)
    with engine:
        assert str(engine.invoke("wf", instance_id="x").wait(timeout=10)) == "suspended: order"
        signalled = engine.signal("wf", "x", "order", {"id": 3, "total": 1.5})
        assert signalled.result(timeout=10) == "_Order 3"


def test_the_heartbeat_comes_every_third_of_the_lease_by_the_engines_clock() -> None:
    """Ticks at 0.5, 1.0, 1.5, 1.9 and 2.0 s of a 3 s lease: beats at 1.0 and 2.0 only."""
    now = [1_800_000_000.0]
    store = SQLiteStore(None, "full")
    runner = Runner(store, Options(lease=3.0, clock=Clock(wall=lambda: now[0])))
    start = now[0]
    store.register_owner(3.0, start)
    runner._next_heartbeat = start + 1.0  # as start() sets it
    beats: list[float] = []
    real = store.heartbeat

    def noted(at: float) -> None:
        beats.append(at - start)
        real(at)

    store.heartbeat = noted  # type: ignore[method-assign]
    for offset in (0.5, 1.0, 1.5, 1.9, 2.0):
        now[0] = start + offset
        runner._tick(False)
    store.close()
    assert beats == [1.0, 2.0]


def test_wait_all_waits_for_a_timer_firing_that_another_caller_started() -> None:
    """Two callers fire timers at once; the one that found nothing ends first. wait_all must
    still wait for the other, whose run it then drains (it drained nothing and stopped)."""
    now = [1_800_000_000.0]
    engine = Engine(
        SQLiteStore(None, "full"),
        Options(poll_interval=60, lease=600, clock=Clock(wall=lambda: now[0])),
    )
    engine.register("wf", lambda ctx: ctx.timer("t", 3600) or "woke")
    entered, release = threading.Event(), threading.Event()
    real = engine._store.fire_due_timers

    def held(*args: Any) -> Any:
        fired = real(*args)
        if fired:
            entered.set()
            assert release.wait(10)
        return fired

    engine._store.fire_due_timers = held  # type: ignore[method-assign]
    engine.start()
    try:
        inv = engine.invoke("wf", instance_id="x")
        assert str(inv.wait(timeout=10)) == "suspended: timer t"
        now[0] += 3601
        first = threading.Thread(target=engine.fire_due_timers)
        first.start()
        assert entered.wait(10)
        assert engine.fire_due_timers() == 0  # the second caller: nothing left to fire
        waiter = threading.Thread(target=engine.wait_all)
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive()  # the first caller's firing is still under way
        release.set()
        waiter.join(10)
        first.join(10)
        assert engine.get_metadata("wf", "x") is not None
        assert inv.result(timeout=10) == "woke"
    finally:
        release.set()
        engine.close()


def test_the_steps_in_flight_list_a_run_that_has_not_begun_its_workflow_yet() -> None:
    """A run registered but still claiming its instance has no context yet: the heartbeat's
    list of steps in flight shows it with no step (it raised)."""
    engine = Engine.in_memory(poll_interval=60, lease=600)
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda: 1))
    claiming, release = threading.Event(), threading.Event()
    real = engine._store.begin_run

    def held(*args: Any, **kwargs: Any) -> Any:
        claiming.set()
        assert release.wait(10)
        return real(*args, **kwargs)

    engine._store.begin_run = held  # type: ignore[method-assign]
    with engine:
        assert isinstance(engine.invoke("wf", instance_id="x").wait(timeout=10), Completed)
        # resume() claims on its caller's thread: call it on a thread of its own.
        resumed: list[Any] = []
        caller = threading.Thread(target=lambda: resumed.append(engine.resume("wf", "x")))
        caller.start()
        try:
            assert claiming.wait(10)
            assert engine._runner.in_flight() == [("wf", "x", None, None)]
        finally:
            release.set()
            caller.join(10)
        assert resumed[0].result(timeout=10) == 1
    engine.close()


def test_a_step_that_returned_a_class_replays_it_as_that_class(
    make_engine: Callable[..., Engine],
) -> None:
    """The stored type tag, not a hint, rebuilds a step's attrs result on replay."""
    engine = make_engine()
    fail = [True]

    def wf(ctx: Context) -> str:
        order = ctx.step("make").run(lambda: _Order(4, 2.5))
        ctx.step("check").run(lambda: 1 / 0 if fail[0] else 1)
        return f"{type(order).__name__} {order.id}"

    engine.register("wf", wf)
    with engine:
        assert isinstance(engine.invoke("wf", instance_id="x").wait(timeout=10), Failed)
        fail[0] = False
        assert engine.resume("wf", "x").result(timeout=10) == "_Order 4"


def test_a_run_cancelled_in_its_last_step_ends_cancelled_without_an_error_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its end is not recorded (the instance is cancelled): it reports what the store holds."""
    engine = Engine.in_memory()
    entered, release = threading.Event(), threading.Event()
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda: entered.set() or release.wait(10)))
    with caplog.at_level(logging.INFO, logger="memable"), engine:
        inv = engine.invoke("wf", instance_id="x")
        assert entered.wait(10)
        engine.cancel("wf", "x")
        release.set()
        assert str(inv.wait(timeout=10)) == "cancelled"
    engine.close()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


class _NotingWaits:
    """A runner's idle condition that says when a caller begins to wait on it."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond
        self.waiting = threading.Event()

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        self.waiting.set()
        return self._cond.wait_for(predicate, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cond, name)


def test_wait_all_takes_no_new_work_while_it_drains() -> None:
    engine = Engine.in_memory()
    entered, release = threading.Event(), threading.Event()
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda: entered.set() or release.wait(10)))
    idle = _NotingWaits(engine._runner._idle)
    engine._runner._idle = idle  # type: ignore[assignment]
    engine.start()
    try:
        inv = engine.invoke("wf", instance_id="x")
        assert entered.wait(10)
        drain = threading.Thread(target=engine.wait_all)
        drain.start()
        assert idle.waiting.wait(10)
        with pytest.raises(NotStarted):
            engine.invoke("wf", instance_id="y")
        release.set()
        drain.join(10)
        assert inv.result(timeout=10) is True
    finally:
        release.set()
        engine.close()


def test_start_sizes_names_and_paces_the_engines_threads() -> None:
    """The worker pool has max_workers threads named memable-worker; the timer thread looks
    at least every third of the lease (the heartbeat must come in time, whatever the poll
    interval), and the first heartbeat is due a third of a lease after start."""
    now = [1_800_000_000.0]
    engine = Engine(
        SQLiteStore(None, "full"),
        Options(max_workers=3, poll_interval=60, lease=3.0, clock=Clock(wall=lambda: now[0])),
    )
    names: list[str] = []
    engine.register("wf", lambda ctx: ctx.step("s").run(
        lambda: names.append(threading.current_thread().name)))
    with engine:
        runner = engine._runner
        assert runner._executor is not None
        assert runner._executor._max_workers == 3
        assert runner._background is not None
        assert runner._background._poll_interval == 1.0
        assert runner._next_heartbeat == now[0] + 1.0
        engine.invoke("wf").result(timeout=10)
    engine.close()
    assert [name.split("_")[0] for name in names] == ["memable-worker"]
