"""Helpers shared by several test modules (not a test module itself)."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NamedTuple

import pytest
import sqlite_utils
from click.testing import CliRunner, Result

from memable import Context, Engine, Invocation, StepError, WorkflowFailed, WorkflowState
from memable._cli.commands import main
from memable._engine.builder import EngineBuilder
from memable._run.options import Options
from memable._run.runner import Runner
from memable._sqlite.schema import MIGRATIONS
from memable._sqlite.store import SQLiteStore
from memable._store.protocol import Store
from memable._store.rows import InstanceRow

PROCS = str(Path(__file__).with_name("_procs.py"))

#: A fixed instant for tests that freeze the clock.
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


# ---------------------------------------------------------------------- an engine and its store
#
# A test reaches an engine through its public API. One that needs the store behind it
# (to read or write rows, or to hook a store operation) holds the store it built the
# engine on: ``build`` opens both as ``Engine.open`` and ``Engine.in_memory`` do,
# ``engine_on`` makes an engine on a store the test opened, and ``store_of`` finds the
# store of an engine made here (by those, ``clocked_engine`` or the conftest fixtures
# ``make_engine`` and ``open_shared``).


class Built(NamedTuple):
    """An engine and the store it runs on."""

    engine: Engine
    store: Store


#: The store each engine built here runs on.
_STORES: weakref.WeakKeyDictionary[Engine, Store] = weakref.WeakKeyDictionary()


def engine_on(store: Store, options: Options) -> Engine:
    """``Engine(store, options)``: an engine on a store the test opened itself."""
    engine = Engine(store, options)
    _STORES[engine] = store
    return engine


def _built(store: Store, options: Options) -> Built:
    return Built(engine_on(store, options), store)


def build(
    target: str | os.PathLike[str] | None = None, *, schema: str | None = None, **options: Any,
) -> Built:
    """``Engine.open(target, schema=schema, **options)`` (``Engine.in_memory(**options)``
    without a target), built by the same builder, and the store it opened."""
    builder = EngineBuilder(path=target, memory=target is None, schema=schema,
                            options=Options(**options), factory=_built)
    return builder.build()


def queued_row(instance_id: str, at: str = "2026-12-08T00:00:00+00:00") -> InstanceRow:
    """The row of an instance ("wf", ``instance_id``) created queued on queue "q" at ``at``."""
    return InstanceRow(workflow="wf", instance_id=instance_id, status="queued", message=None,
                       input="null", input_type=None, output=None, output_type=None,
                       created_at=at, updated_at=at, completed_at=None, queue="q", priority=0,
                       queued_at=at)


def store_of(engine: Engine) -> Store:
    """The store the engine built here (``build``, ``make_engine``, ...) runs on."""
    store = _STORES.get(engine)
    assert store is not None, "build the engine with helpers.build (or make_engine)"
    return store


def runner_of(engine: Engine) -> Runner:
    """The engine's runner, for a test that forces an interleaving through its parts (a
    hook on its claims, its clock, its idle wait): not public API, and the one place the
    tests reach it."""
    return engine._runner


# The helpers below read a store behind the engine's back, on purpose: a full
# snapshot, timers and statement traces are not public API.


def query(engine: Engine, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Rows of one read (``?`` placeholders) on the engine's store, file or PostgreSQL."""
    store = store_of(engine)
    if isinstance(store, SQLiteStore):
        with store._lock:
            return [tuple(row) for row in store._conn.execute(sql, params)]
    with store._db._pool.connection() as conn:  # type: ignore[attr-defined]
        return [tuple(row) for row in conn.execute(sql.replace("?", "%s"), params)]


def write(engine: Engine, sql: str, params: tuple[Any, ...] = ()) -> None:
    """Run one write (``?`` placeholders) on the engine's store behind its back, committed."""
    store = store_of(engine)
    if isinstance(store, SQLiteStore):
        with store._lock:
            store._conn.execute(sql, params)
        return
    with store._db._pool.connection() as conn:  # type: ignore[attr-defined]
        conn.execute(sql.replace("?", "%s"), params)


def dump(engine: Engine) -> list[str]:
    """Every row of the store, as text: a full snapshot to compare."""
    store = store_of(engine)
    if isinstance(store, SQLiteStore):
        with store._lock:
            return list(store._conn.iterdump())
    return [
        f"{table}: {row!r}"
        for table in ("memable_instances", "memable_steps", "memable_timers", "memable_owners",
                      "memable_schema")
        for row in sorted(query(engine, f"SELECT * FROM {table}"), key=repr)
    ]


#: A statement of a text of several (``memable._postgres.batch``): where one ends.
_NEXT_STATEMENT = re.compile(
    r";\s+(?=(?:BEGIN|COMMIT|ROLLBACK|PREPARE|EXECUTE|SELECT|INSERT|UPDATE|DELETE|WITH)\b)")
#: What each statement a PostgreSQL store prepared runs, by its name (unique in a process).
_PREPARED: dict[str, str] = {}


def statements_of(text: str, conn: Any) -> list[str]:
    """The statements a text sent to PostgreSQL on ``conn`` runs, as written: a text of
    several (``memable._postgres.batch``) is split, each ``EXECUTE`` is the statement it
    runs (prepared before, maybe before tracing began), and a ``PREPARE`` runs none."""
    out = []
    for statement in _NEXT_STATEMENT.split(text):
        if _prepare(statement):
            continue
        executed = re.match(r"EXECUTE (\w+)", statement)
        if executed and executed[1] not in _PREPARED:  # the server has its text
            source = conn.execute("SELECT statement FROM pg_prepared_statements "
                                  "WHERE name = %s", (executed[1],)).fetchone()[0]
            for part in _NEXT_STATEMENT.split(source):
                _prepare(part)
        out.append(_PREPARED[executed[1]] if executed else statement)
    return out


def _prepare(statement: str) -> bool:
    """Note what a ``PREPARE`` prepares; whether ``statement`` is one."""
    prepared = re.match(r"PREPARE (\w+)(?: \([^)]*\))? AS (.*)", statement, re.S)
    if prepared:
        _PREPARED[prepared[1]] = prepared[2]
    return prepared is not None


class _TracedConnection:
    """A pooled psycopg connection that notes each statement, and BEGIN/COMMIT around
    transactions, as SQLite's trace callback would. A transaction's statements are noted
    together when it ends, so transactions of several threads never interleave."""

    def __init__(self, conn: Any, statements: list[str]) -> None:
        self._conn, self._statements = conn, statements
        self._open: list[str] | None = None  # the statements of the open transaction

    def _note(self, sql: str) -> None:
        word = sql.split(None, 1)[0].upper().rstrip(";")
        if word == "BEGIN":
            self._open = [sql]
        elif self._open is None:
            self._statements.append(sql)
        else:
            self._open.append(sql)
            if word in ("COMMIT", "ROLLBACK"):
                self._statements.extend(self._open)
                self._open = None

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        return self._traced(sql, lambda: self._conn.execute(sql, *args, **kwargs))

    def send_text(self, text: bytes) -> Any:  # a text of several (memable._postgres.batch)
        return self._traced(text.decode(), lambda: self._conn.send_text(text))

    def _traced(self, sql: str, run: Callable[[], Any]) -> Any:
        for statement in statements_of(sql.strip(), self._conn):
            self._note(statement)
        try:
            return run()
        except BaseException:
            if self._open is not None and self._conn.info.transaction_status == 3:  # INERROR
                self._note("ROLLBACK")
            raise

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        return self._conn.cursor(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:  # closed, info: as the connection's
        return getattr(self._conn, name)

    @contextmanager
    def transaction(self) -> Iterator[None]:
        self._note("BEGIN")
        try:
            with self._conn.transaction():
                yield
        except BaseException:
            self._note("ROLLBACK")
            raise
        self._note("COMMIT")


class _TracedPool:
    def __init__(self, pool: Any, statements: list[str]) -> None:
        self._pool, self._statements = pool, statements

    @contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[_TracedConnection]:
        with self._pool.connection(timeout) as conn:
            yield _TracedConnection(conn, self._statements)

    def getconn(self, timeout: float | None = None) -> _TracedConnection:  # a run's session
        return _TracedConnection(self._pool.getconn(timeout), self._statements)

    def putconn(self, conn: _TracedConnection) -> None:
        self._pool.putconn(conn._conn)

    def close(self) -> None:
        self._pool.close()


@contextmanager
def traced_sqlite(store: SQLiteStore, statements: list[str] | None = None) -> Iterator[list[str]]:
    """The statements a SQLite store's connection runs meanwhile (into ``statements``).

    The callback is set and cleared under the store's lock: ``sqlite3_trace_v2``
    waits for the connection's mutex while the caller holds the interpreter lock, and
    a thread of the engine inside a statement holds that mutex while its trace
    callback waits for the interpreter lock (a deadlock, seen hanging CI)."""
    statements = [] if statements is None else statements
    with store._lock:
        store._conn.set_trace_callback(statements.append)
    try:
        yield statements
    finally:
        with store._lock:
            store._conn.set_trace_callback(None)


class _OfThread(list[str]):
    """A list that keeps what one thread appends (the engine's other threads' are dropped)."""

    def __init__(self, thread: threading.Thread) -> None:
        super().__init__()
        self._thread = thread

    def append(self, item: str) -> None:
        if threading.current_thread() is self._thread:
            super().append(item)

    def extend(self, items: Iterable[str]) -> None:  # (a transaction's, at its end)
        if threading.current_thread() is self._thread:
            super().extend(items)


@contextmanager
def traced(engine: Engine, thread: threading.Thread | None = None) -> Iterator[list[str]]:
    """The statements the engine's store sends meanwhile (PostgreSQL: with BEGIN and
    COMMIT around each transaction; a statement outside one commits on its own); with
    ``thread``, only those that thread sends (not a poll's or a heartbeat's)."""
    store = store_of(engine)
    statements: list[str] = [] if thread is None else _OfThread(thread)
    if isinstance(store, SQLiteStore):
        with traced_sqlite(store, statements):
            yield statements
        return
    pool = store._db._pool  # type: ignore[attr-defined]
    store._db._pool = _TracedPool(pool, statements)  # type: ignore[attr-defined]
    try:
        yield statements
    finally:
        store._db._pool = pool  # type: ignore[attr-defined]


@contextmanager
def killed_in_a_step(db: Path, log: Path, step: int = 3) -> Iterator[int]:
    """A child engine runs ten/crash (``_procs.py crash``) into step ``s<step>``.

    Yields the child's pid while it hangs there; on leaving, SIGKILLs it and
    reaps it, so its instance is left running with a dead owner.
    """
    child = subprocess.Popen(
        [sys.executable, PROCS, "crash", str(db), str(log), str(step)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == f"in step {step}\n"
        yield child.pid
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        if child.stdout is not None:
            child.stdout.close()


def runner() -> CliRunner:
    """A runner that keeps stderr apart (click < 8.2 mixes it into stdout by default)."""
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:  # click >= 8.2: always apart
        return CliRunner()


def cli(*args: str | os.PathLike[str]) -> Result:
    """Run ``memable ARGS`` in this process; a crash (not an exit) is raised as it is."""
    result = runner().invoke(main, [os.fspath(a) for a in args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Wait for a condition that offers no event to wait on (a server backend's wait
    state, another process's commit): look every 10 ms, fail after ``seconds``."""
    pause = threading.Event()
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        pause.wait(0.01)
    raise AssertionError("the condition never held")


def stored_apart(url: str, first: str, second: str) -> None:
    """An instance stored through schema ``first`` is not in schema ``second``, which
    stores its own: two schemas are two stores."""

    def double(ctx: Any, n: int) -> int:
        return int(ctx.step("double").run(lambda: n * 2))

    one = Engine.open(url, schema=first)
    one.register("double", double)
    with one:
        assert one.invoke("double", 21, instance_id="a").result(timeout=30) == 42
    other = Engine.open(url, schema=second)
    other.register("double", double)
    with other:
        assert other.get_metadata("double", "a") is None
        assert other.invoke("double", 1, instance_id="b").result(timeout=30) == 2
        assert other.get_metadata("double", "a") is None


#: Seconds ``Looks.twice_more`` waits for the engine's thread.
LOOK_TIMEOUT = 10.0


class Looks:
    """Counts the looks of an engine's thread at the store, as they return: by default
    each claim its queue thread made (paused or not, something queued or not); with
    ``method="look_around"``, each poll of its timer thread."""

    def __init__(self, engine: Engine, method: str = "claim_queued") -> None:
        self._changed = threading.Condition()
        self.count = 0
        store = store_of(engine)
        look = getattr(store, method)

        def counted(*args: Any, **kwargs: Any) -> Any:
            try:
                return look(*args, **kwargs)
            finally:
                with self._changed:
                    self.count += 1
                    self._changed.notify_all()

        setattr(store, method, counted)

    def past(self, count: int) -> None:
        """Wait for a look to return beyond the first ``count`` (read ``self.count``
        before the act whose look it waits for)."""
        with self._changed:
            assert self._changed.wait_for(lambda: self.count > count, LOOK_TIMEOUT)

    def twice_more(self) -> None:
        """Wait for two more looks to return: the second began after this call (the
        first may have been under way), so it saw everything stored before it."""
        with self._changed:
            target = self.count + 2
            assert self._changed.wait_for(lambda: self.count >= target, LOOK_TIMEOUT)


class FailsThenWaits:
    """A child workflow whose step fails for good while ``failing`` is set (its parent
    fails with it); resumed after ``failing = False``, its step works and it waits on
    signal ``finish``, returning the payload."""

    def __init__(self) -> None:
        self.failing = True

    def __call__(self, ctx: Context) -> str:
        def work() -> str:
            if self.failing:
                raise StepError.permanent("not yet")
            return "worked"

        ctx.step("work").run(work)
        return str(ctx.suspend("finish"))


class HeldLook:
    """A clock for an engine (its ``clock`` option: ``make_engine(clock=held.clock)``) that
    holds one look of its timer thread just after the look read the wall clock.

    ``hold(engine)`` arms it and kicks the engine's timer thread; ``held`` is set once that
    look has its reading and waits; ``release()`` lets it go on with that reading and
    returns once the look has ended (its thread reads the monotonic clock again). In
    between, a test may freeze the clock earlier and arm deadlines: the look must not
    judge them by its reading from before.
    """

    def __init__(self) -> None:
        from memable import _clock
        from memable._clock import Clock

        self._arm = False
        self.held, self._go, self._looked = threading.Event(), threading.Event(), threading.Event()

        def wall() -> float:
            now = _clock.wall()
            if (self._arm and threading.current_thread().name == "memable-timers"
                    and sys._getframe(1).f_code.co_name == "_fire_due"):
                self._arm = False
                self.held.set()
                assert self._go.wait(10)  # the look keeps its reading
            return now

        def monotonic() -> float:
            if self._go.is_set() and threading.current_thread().name == "memable-timers":
                self._looked.set()  # the held look has returned from its tick
            return _clock.monotonic()

        self.clock = Clock(wall=wall, monotonic=monotonic)

    def hold(self, engine: Engine) -> None:
        self._arm = True
        runner_of(engine).armed()  # a look now
        assert self.held.wait(10)

    def release(self) -> None:
        self._go.set()
        assert self._looked.wait(10)


# ---------------------------------------------------------------------- waiting, wrapping, clocks

#: Seconds any single wait in a test may take before the test gives up.
PATIENCE = 10

#: Run a test on the stores that outlive an engine (a file, PostgreSQL), not in memory.
shared_store_only = pytest.mark.parametrize("store_target", ["file", "postgres"], indirect=True)


def final_state(inv: Invocation, timeout: float = PATIENCE) -> WorkflowState:
    """The terminal state of an instance, waiting through suspensions and new runs."""
    try:
        inv.result(timeout=timeout)
    except WorkflowFailed as err:
        return err.state
    return inv.wait(timeout=timeout)


def wrap_after(obj: object, name: str, after: Callable[[Any], None]) -> None:
    """Make ``obj.name(...)`` call ``after(result)`` once the real method returned."""
    real = getattr(obj, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = real(*args, **kwargs)
        after(result)
        return result

    setattr(obj, name, wrapper)


def clocked_engine() -> tuple[Engine, list[float]]:
    """An in-memory engine on the test's wall clock (``now[0]``); no poll nor heartbeat soon."""
    from memable._clock import Clock

    now = [1_800_000_000.0]
    clock = Clock(wall=lambda: now[0])
    options = Options(poll_interval=60, lease=600, clock=clock)
    engine = engine_on(SQLiteStore(None, "full"), options)
    return engine, now


def flaky_once(calls: list[str], key: str, value: object, message: str) -> Callable[[], object]:
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


def earlier_sqlite_store(conn: sqlite3.Connection, version: int,
                         fill: Callable[[], None] = lambda: None) -> None:
    """Make on ``conn`` (autocommit) the store an earlier memable (schema ``version``, 15 or
    before) made: today's migrations up to ``version``, ``fill`` run on them (it writes
    ``memable_*``), then the tables unprefixed and the version in ``PRAGMA user_version``."""
    assert version <= 15
    for migrate in MIGRATIONS[:version]:
        migrate(sqlite_utils.Database(conn))
    fill()
    ours = conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'memable%'")
    for (name,) in ours.fetchall():
        conn.execute(f"ALTER TABLE {name} RENAME TO {name.removeprefix('memable_')}")
    conn.execute(f"PRAGMA user_version = {version}")
