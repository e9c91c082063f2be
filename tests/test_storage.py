"""Storage: WAL, one transaction per step, one read per run, schema version, refusals.

A file that also holds the application's tables: ``test_shared_file``."""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Callable
from contextlib import closing
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import attrs
import pytest
import sqlite_utils
from helpers import earlier_sqlite_store, traced

from memable import (
    Completed,
    Context,
    Engine,
    Failed,
    MetadataStatus,
    StorageError,
    Suspended,
)
from memable._engine import access
from memable._sqlite.schema import SCHEMA_VERSION
from memable._sqlite.store import SQLiteStore
from memable._store.protocol import StepWrite

# Several tests look at the engine's own connection (its store's ``_conn``): PRAGMA
# synchronous is per connection, and the statement trace (``helpers.traced``) is the
# only way to count transactions and reads. Touching that private attribute is
# deliberate. The pragma's test reaches the store of an engine built by the public
# constructors it tests, through the engine's accessor (``memable._engine.access``).

# A write of steps, perhaps after a WITH clause (PostgreSQL's fenced upsert).
_STEPS_WRITE = re.compile(
    r"^\s*(WITH\b.*?)?\b(INSERT|REPLACE|UPDATE|DELETE)\b[^;]*?\b[\[\"`]?memable_steps\b",
    re.I | re.S,
)
# A read of steps.
_STEPS_READ = re.compile(r"^\s*SELECT\b.*\bFROM\s+[\[\"`]?memable_steps\b", re.I | re.S)
_WRITE = re.compile(r"^\s*(WITH\b.*?)?\b(INSERT|REPLACE|UPDATE|DELETE)\b", re.I | re.S)


@attrs.frozen
class Order:
    id: int
    total: float


def _sqlite(path: Path, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run ``sql`` on a fresh plain sqlite3 connection to ``path``, as another reader would."""
    with closing(sqlite3.connect(path)) as conn:
        return conn.execute(sql, params).fetchall()


def _transactions(statements: list[str]) -> list[list[str]]:
    """Group traced statements into transactions: BEGIN..COMMIT, else one per write."""
    transactions: list[list[str]] = []
    current: list[str] | None = None
    for sql in statements:
        word = sql.split(None, 1)[0].upper().rstrip(";")
        if word == "BEGIN":
            current = []
        elif word in ("COMMIT", "END"):
            assert current is not None
            transactions.append(current)
            current = None
        elif word == "ROLLBACK":
            current = None
        elif current is not None:
            current.append(sql)
        elif _WRITE.match(sql):  # autocommit: a write outside BEGIN is its own transaction
            transactions.append([sql])
    assert current is None, "a transaction was left open"
    return transactions


# ---------------------------------------------------------------------- pragmas


def test_file_store_uses_wal_and_schema_version(tmp_path: Path) -> None:
    """A file store is in WAL mode and carries the schema version in ``memable_schema``, not
    in ``user_version`` (the application's)."""
    path = tmp_path / "wal.db"
    engine = Engine.open(path)
    try:
        assert _sqlite(path, "PRAGMA journal_mode") == [("wal",)]
        assert _sqlite(path, "SELECT version FROM memable_schema") == [(SCHEMA_VERSION,)]
        assert _sqlite(path, "PRAGMA user_version") == [(0,)]
        assert SCHEMA_VERSION >= 1
    finally:
        engine.close()


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        pytest.param(lambda path: Engine.open(path), 2, id="default-full"),
        pytest.param(lambda path: Engine.open(path, synchronous="full"), 2, id="full"),
        pytest.param(lambda path: Engine.open(path, synchronous="normal"), 1, id="normal"),
        pytest.param(
            lambda path: Engine.builder().open(path).synchronous("normal").build(),
            1,
            id="builder-normal",
        ),
    ],
)
def test_synchronous_option_sets_the_pragma(
    tmp_path: Path, build: Callable[[Path], Engine], expected: int
) -> None:
    """``synchronous`` defaults to FULL (2) and ``"normal"`` gives NORMAL (1)."""
    engine = build(tmp_path / "sync.db")
    try:
        # Private attribute on purpose: the pragma is per connection.
        store: Any = access.store(engine)
        assert store._conn.execute("PRAGMA synchronous").fetchone() == (expected,)
    finally:
        engine.close()


# ---------------------------------------------------------------------- transactions


def test_each_completed_step_is_one_transaction(make_engine: Callable[..., Engine]) -> None:
    """Each completed step of a run is written in exactly one transaction of its own."""
    engine = make_engine()
    keys = [f"step-{i}" for i in range(5)]

    def wf(ctx: Context) -> int:
        return sum(ctx.step(key).run(lambda i=i: i) for i, key in enumerate(keys))

    engine.register("five", wf)
    engine.start()
    with traced(engine) as statements:
        assert engine.invoke("five", instance_id="f-1").result() == 10

    steps_transactions = [
        t for t in _transactions(statements) if any(_STEPS_WRITE.match(s) for s in t)
    ]
    assert len(steps_transactions) == 5
    assert [sum(bool(_STEPS_WRITE.match(s)) for s in t) for t in steps_transactions] == [1] * 5
    assert [(s.key, s.state, s.attempts) for s in engine.steps("five", "f-1")] == [
        (key, "completed", 1) for key in keys
    ]


def test_a_step_is_committed_before_run_returns(tmp_path: Path) -> None:
    """When ``run`` returns, another connection already reads the step as completed."""
    path = tmp_path / "durable.db"
    keys = [f"step-{i}" for i in range(5)]
    observed: list[list[tuple[str, str, str]]] = []

    def wf(ctx: Context) -> None:
        for i, key in enumerate(keys):
            ctx.step(key).run(lambda i=i: {"n": i})
            observed.append(
                _sqlite(
                    path,
                    "SELECT key, state, result FROM memable_steps WHERE instance_id = ? "
                    "ORDER BY seq",
                    (ctx.instance_id,),
                )
            )

    engine = Engine.open(path)
    try:
        engine.register("durable", wf)
        engine.start()
        assert engine.invoke("durable", instance_id="d-1").wait() == Completed()
    finally:
        engine.close()

    expected = [(key, "completed", json.dumps({"n": i})) for i, key in enumerate(keys)]
    assert [[(k, s, json.dumps(json.loads(r))) for k, s, r in rows] for rows in observed] == [
        expected[: n + 1] for n in range(5)
    ]


def test_a_resumed_run_reads_its_steps_once(make_engine: Callable[..., Engine]) -> None:
    """A resumed run of 50 stored steps reads the steps table with one query, not 50."""
    engine = make_engine()
    calls: dict[str, int] = {}

    def call(key: str) -> str:
        calls[key] = calls.get(key, 0) + 1
        if key == "step-50" and calls[key] == 1:
            raise ConnectionError("not yet")
        return key.upper()

    def wf(ctx: Context) -> int:
        return len([ctx.step(f"step-{i}").run(call, f"step-{i}") for i in range(51)])

    engine.register("fifty", wf)
    engine.start()
    state = engine.invoke("fifty", instance_id="50-1").wait()
    assert isinstance(state, Failed)
    assert "'step-50'" in state.message

    with traced(engine) as statements:
        assert engine.resume("fifty", "50-1").result() == 51

    assert len([s for s in statements if _STEPS_READ.match(s)]) == 1
    assert calls == {f"step-{i}": 1 for i in range(50)} | {"step-50": 2}


def test_a_due_timer_is_recorded_without_a_second_look_at_its_row(
    make_engine: Callable[..., Engine],
) -> None:
    """Reaching a due timer, a run reads its row only as recording it does (firing it).

    A timer not yet due is looked at once more first (a signal or another run
    may have completed its key meanwhile, and suspending would be wasted).
    """
    engine = make_engine()

    def wf(ctx: Context, seconds: float) -> str:
        ctx.timer("t", seconds)
        return "past"

    def key_reads(statements: list[str]) -> int:
        return len([s for s in statements if _STEPS_READ.match(s) and "key =" in s])

    engine.register("wf", wf)
    engine.start()
    with traced(engine) as due:
        assert engine.invoke("wf", 0).result(timeout=10) == "past"
    with traced(engine) as later:
        assert engine.invoke("wf", 3600).wait(timeout=10) == Suspended("timer t")
    assert key_reads(due) == key_reads(later) - 1


def test_the_result_of_a_run_ended_here_is_not_read_back(
    make_engine: Callable[..., Engine],
) -> None:
    """result() decodes the output the run here stored, without reading the row back."""
    engine = make_engine()

    def wf(ctx: Context) -> dict[str, int]:
        return {"n": ctx.step("s").run(lambda: 7)}

    engine.register("wf", wf)
    engine.start()
    inv = engine.invoke("wf", instance_id="r-1")
    assert inv.wait(timeout=10) == Completed()
    # This thread's statements: a poll the run's end woke may look meanwhile.
    with traced(engine, threading.current_thread()) as statements:
        assert inv.result(timeout=10) == {"n": 7}
    assert statements == []

# ---------------------------------------------------------------------- refusing files


def _text_file(path: Path) -> None:
    path.write_text("name,total\norder-1,9.5\n", encoding="utf-8")


def _newer_memable(path: Path) -> None:
    engine = Engine.open(path)
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda: 1))
    with engine:
        engine.invoke("wf", instance_id="w-1").wait()
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE memable_schema SET version = ?", (SCHEMA_VERSION + 1,))
        conn.commit()


@pytest.mark.parametrize(
    ("prepare", "phrase"),
    [
        pytest.param(_text_file, "not a SQLite database", id="text-file"),
        pytest.param(_newer_memable, "newer", id="newer-schema"),
    ],
)
def test_a_foreign_or_newer_file_is_refused_and_left_unchanged(
    tmp_path: Path, prepare: Callable[[Path], None], phrase: str
) -> None:
    """A file that is not SQLite, or a store of a newer version, raises StorageError and stays
    unchanged."""
    path = tmp_path / "store.db"
    prepare(path)
    before = path.read_bytes()
    files_before = sorted(p.name for p in tmp_path.iterdir())

    with pytest.raises(StorageError, match=phrase) as info:
        Engine.open(path)

    assert str(path) in str(info.value)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == files_before
    assert not (tmp_path / "store.db-wal").exists()


# ---------------------------------------------------------------------- reopening and reading


def test_a_reopened_file_shows_what_was_stored(tmp_path: Path) -> None:
    """A new engine on the same file lists the instances and steps an earlier one stored."""
    path = tmp_path / "reopen.db"

    def wf(ctx: Context, n: int) -> int:
        doubled = ctx.step("double").run(lambda: n * 2)
        if n < 0:
            raise ValueError("negative")
        return ctx.step("add-one").run(lambda: doubled + 1)

    first = Engine.open(path)
    first.register("calc", wf)
    with first:
        assert first.invoke("calc", 4, instance_id="a").result() == 9
        assert isinstance(first.invoke("calc", -1, instance_id="b").wait(), Failed)

    second = Engine.open(path)
    try:
        listed = second.list_instances("calc")
        assert [(i, type(m.status)) for i, m in listed] == [
            ("a", MetadataStatus.Completed),
            ("b", MetadataStatus.Failed),
        ]
        assert "ValueError: negative" in listed[1][1].status.message
        assert [(s.key, s.state, s.result) for s in second.steps("calc", "a")] == [
            ("double", "completed", 8),
            ("add-one", "completed", 9),
        ]
        assert [(s.key, s.state, s.result) for s in second.steps("calc", "b")] == [
            ("double", "completed", -2),
        ]
    finally:
        second.close()


def test_tables_are_readable_with_plain_sqlite(tmp_path: Path) -> None:
    """Stored values are JSON text and timestamps ISO 8601 aware UTC, readable by sqlite3."""
    path = tmp_path / "plain.db"

    def wf(ctx: Context, order: Order) -> Order:
        return ctx.step("price").run(lambda: Order(order.id, order.total + 1))

    engine = Engine.open(path)
    engine.register("price", wf)
    before = datetime.now(timezone.utc)
    with engine:
        assert engine.invoke("price", Order(5, 1.5), instance_id="p-1").result() == Order(5, 2.5)
    after = datetime.now(timezone.utc)

    [(key, result, completed_at)] = _sqlite(
        path, "SELECT key, result, completed_at FROM memable_steps")
    assert (key, json.loads(result)) == ("price", {"id": 5, "total": 2.5})
    [(input_text, output_text, *stamps)] = _sqlite(
        path, "SELECT input, output, created_at, updated_at, completed_at FROM memable_instances"
    )
    assert json.loads(input_text) == {"id": 5, "total": 1.5}
    assert json.loads(output_text) == {"id": 5, "total": 2.5}
    for text in [completed_at, *stamps]:
        stamp = datetime.fromisoformat(text)
        assert stamp.utcoffset() == timedelta(0)
        assert before <= stamp <= after


# ---------------------------------------------------------------------- closed store


@pytest.mark.parametrize(
    "read",
    [
        pytest.param(lambda e: e.get_metadata("wf", "c-1"), id="get_metadata"),
        pytest.param(lambda e: e.list_instances("wf"), id="list_instances"),
        pytest.param(lambda e: e.steps("wf", "c-1"), id="steps"),
    ],
)
def test_reading_a_closed_engine_raises_storage_error(
    make_engine: Callable[..., Engine], read: Callable[[Engine], object]
) -> None:
    """After ``close()``, reads raise StorageError saying the store is closed."""
    engine = make_engine()
    engine.register("wf", lambda ctx: None)
    with engine:
        assert engine.invoke("wf", instance_id="c-1").wait() == Completed()

    with pytest.raises(StorageError, match="closed"):
        read(engine)


def test_a_version_1_store_is_migrated_and_keeps_its_rows(tmp_path: Path) -> None:
    """A store written at schema version 1 (unprefixed tables, ``user_version`` 1) opens at
    the current version with its rows, its tables renamed and ``user_version`` back to 0."""
    path = tmp_path / "v1.db"
    now = "2026-01-01T00:00:00+00:00"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:

        def fill() -> None:
            sqlite_utils.Database(conn)["memable_instances"].insert(  # type: ignore[union-attr]
                {"workflow": "wf", "instance_id": "old", "status": "completed", "input": "null",
                 "output": '"kept"', "created_at": now, "updated_at": now, "completed_at": now})

        earlier_sqlite_store(conn, 1, fill)
    engine = Engine.open(path)
    engine.register("wf", lambda ctx: "new")
    try:
        with engine:
            assert engine.invocation("wf", "old").result(timeout=10) == "kept"
            assert engine.invoke("wf").result(timeout=10) == "new"
    finally:
        engine.close()
    assert _sqlite(path, "PRAGMA user_version") == [(0,)]
    assert _sqlite(path, "SELECT version FROM memable_schema") == [(SCHEMA_VERSION,)]
    tables = {name for (name,) in _sqlite(path, "SELECT name FROM sqlite_master "
                                                "WHERE type = 'table'")}
    assert tables == {"memable_instances", "memable_steps", "memable_timers", "memable_owners",
                      "memable_queue_starts", "memable_schedules", "memable_queue_states",
                      "memable_schema"}


@pytest.mark.parametrize("where", ["memory", "file"])
def test_a_write_after_the_store_closed_fails_naming_it(tmp_path: Path, where: str) -> None:
    """Not an AttributeError from the closed connection: a StorageError that says why."""
    store = SQLiteStore(None if where == "memory" else tmp_path / "db", "normal")
    store.close()
    write = StepWrite(
        workflow="wf", instance_id="x", key="k", seq=0, kind="step", state="completed",
        result="1", result_type=None, status=None, error=None, at=1767225600.0,
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


def test_a_stored_row_is_built_by_name_never_by_position() -> None:
    """Every column an instance is stored with is a field of ``InstanceRow`` of that name,
    and the record takes no position: a row read with its columns in another order (or
    fewer of them than named) is built right, or refused."""
    from memable._store.rows import InstanceRow, instance_row
    from memable._store.sql.instances import INSTANCE_COLUMNS

    assert [f.name for f in attrs.fields(InstanceRow)] == list(INSTANCE_COLUMNS)
    with pytest.raises(TypeError):
        InstanceRow("wf", "i", "running", None, "null", None, None, None, "t", "t", None)  # type: ignore[misc]
    names = ["status", "instance_id", "workflow", "message", "input", "input_type", "output",
             "output_type", "created_at", "updated_at", "completed_at", "queue"]
    values = ["queued", "i", "wf", None, "null", None, None, None, "t", "t", None, "q"]
    row = instance_row(names, values)
    assert (row.workflow, row.instance_id, row.status, row.queue) == ("wf", "i", "queued", "q")
    with pytest.raises(ValueError, match="zip"):
        instance_row(names, values[:-1])
