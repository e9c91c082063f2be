"""The group commit (``memable._sqlite.group_commit``): writers queued behind a commit share
one transaction, each undone alone when it refuses; what a failed batch tells each writer;
whether a batch tells the run checks it committed whole."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from memable import (
    EngineError,
    StorageError,
)
from memable._sqlite.group_commit import GroupCommit, _Pending
from memable._store.control import LostInstance


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


class _Interrupting:
    """A connection whose ``n``-th COMMIT raises KeyboardInterrupt (as Ctrl-C would)."""

    def __init__(self, conn: sqlite3.Connection, n: int) -> None:
        self._conn = conn
        self._commits_left = n

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        if sql == "COMMIT":
            self._commits_left -= 1
            if self._commits_left == 0:
                raise KeyboardInterrupt
        return self._conn.execute(sql, *args)

    @property
    def in_transaction(self) -> bool:
        return self._conn.in_transaction


def test_group_commit_fails_closed_when_the_leader_is_interrupted(tmp_path: Path) -> None:
    """An interrupt at a batch's COMMIT fails every writer of it and leaves no open transaction.

    Writer A commits alone while B, C and D queue; B leads their batch and
    its COMMIT is interrupted: B sees the interrupt, C and D a StorageError,
    none of their rows is stored, and a later write commits on its own.
    """
    path = tmp_path / "t.db"
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("CREATE TABLE t (x TEXT)")
    proxy = _Interrupting(conn, 2)
    lock = threading.Lock()
    commits = GroupCommit(lock, str(path), lambda: proxy)  # type: ignore[arg-type,return-value]
    three_queued = threading.Event()
    commits.on_queue = lambda n: three_queued.set() if n == 3 else None

    def insert(x: str, wait: bool = False) -> Callable[[sqlite3.Connection], None]:
        def body(c: sqlite3.Connection) -> None:
            if wait:
                assert three_queued.wait(10)
            c.execute("INSERT INTO t VALUES (?)", (x,))

        return body

    outcomes: dict[str, BaseException | None] = {}

    def write(x: str, wait: bool = False) -> None:
        try:
            commits.write("insert", None, None, None, insert(x, wait))
            outcomes[x] = None
        except BaseException as exc:
            outcomes[x] = exc

    a = threading.Thread(target=write, args=("a", True))
    a.start()
    others = [threading.Thread(target=write, args=(x,)) for x in "bcd"]
    for thread in others:
        thread.start()
    for thread in [a, *others]:
        thread.join(10)

    assert outcomes["a"] is None
    failed = {x: type(outcomes[x]).__name__ for x in "bcd"}
    assert sorted(failed.values()) == ["KeyboardInterrupt", "StorageError", "StorageError"]
    assert not conn.in_transaction
    commits.write("insert", None, None, None, insert("e"))
    with closing(sqlite3.connect(path)) as reader:
        rows = sorted(x for (x,) in reader.execute("SELECT x FROM t"))
    assert rows == ["a", "e"]
    conn.close()


# ---------------------------------------------------------------------- telling the run checks


class _Told:
    """Stands for RunChecks: records what the group commit tells it after a transaction."""

    def __init__(self) -> None:
        self.told: list[bool] = []

    def after_write(self, before: int, ok: bool) -> None:
        self.told.append(ok)


def _item() -> Any:
    return _Pending(lambda conn: None, "write", "wf", "x", None, False)


def test_a_refused_write_in_a_batch_is_told_as_not_ok() -> None:
    """A batch with a write refused (LostInstance), or a transaction that failed, is told to
    the run checks as not ok (they forget every instance: a refused body may have claimed
    one before it refused); a batch that committed whole is told as ok."""
    told = _Told()
    commits = GroupCommit(threading.Lock(), "here", lambda: None, told)  # type: ignore[arg-type]
    refused = _item()
    refused.error = LostInstance("wf", "x")
    commits._tell_watch(0, True, [_item(), refused, _item()])
    commits._tell_watch(0, False, [_item()])
    commits._tell_watch(0, True, [_item(), _item()])
    assert told.told == [False, False, True]
