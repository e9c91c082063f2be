"""Group commit on one SQLite connection: writers that meet share one transaction.

A writer that finds no commit in progress leads: it commits at once, with whatever others
queued meanwhile; one that finds one queues for the next. A write is done only when its COMMIT
returned. A body's ``REFUSALS`` undo its own statements (a savepoint) and reach its writer
alone; anything else that escapes rolls the whole transaction back and fails every writer of
the batch: the connection is never left in a transaction later writes would silently join."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

import attrs

from .._errors import EngineError, StorageError
from .._store.control import LostInstance, RunCancelled
from .watch import RunChecks

T = TypeVar("T")

#: What a body raises to refuse its own write, leaving the batch's others be.
REFUSALS: tuple[type[BaseException], ...] = (EngineError, LostInstance, RunCancelled)


@attrs.define
class _Pending:
    """One writer's body waiting for a group commit, and its outcome."""

    body: Callable[[sqlite3.Connection], Any]
    what: str
    workflow: str | None
    instance_id: str | None
    key: str | None
    single: bool = False  # one statement: alone, it is its own autocommit transaction
    done: bool = False  # set under GroupCommit._queue_lock
    result: Any = None
    error: BaseException | None = None
    # A follower's, held from when it queues; the leader releases it to wake it.
    wake: threading.Lock | None = None

    def outcome(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.result

    def failed(self, why: str, cause: BaseException) -> None:
        """Mark the write failed (not committed)."""
        self.error = StorageError(f"cannot {self.what} in {why}", workflow=self.workflow,
            instance_id=self.instance_id, key=self.key)
        self.error.__cause__ = cause


def _held_lock() -> threading.Lock:
    lock = threading.Lock()
    lock.acquire()
    return lock


class GroupCommit:
    """The writers of one connection, committed in groups; see the module docstring."""

    def __init__(
        self, lock: threading.Lock, where: str,
        connection: Callable[[], sqlite3.Connection | None], watch: RunChecks | None = None,
    ) -> None:
        # ``lock``: the store's connection lock, under which ``connection()`` (None once
        # closed) and ``watch`` are used.
        self._lock = lock
        self._where = where
        self._connection = connection
        self._watch = watch
        # _queue_lock guards _queue (writers waiting for the next commit) and
        # _leading (a writer is committing or about to).
        self._queue_lock = threading.Lock()
        self._queue: list[_Pending] = []
        self._leading = False
        # Tests set this to see a writer queue (called under _queue_lock).
        self.on_queue: Callable[[int], None] | None = None

    def write(
        self, what: str, workflow: str | None, instance_id: str | None, key: str | None,
        body: Callable[[sqlite3.Connection], T], *, single: bool = False,
    ) -> T:
        """Run ``body`` in a write transaction shared with concurrent writers (``single``: the
        body runs one statement)."""
        pending = _Pending(body, what, workflow, instance_id, key, single)
        with self._queue_lock:
            self._queue.append(pending)
            follower, self._leading = self._leading, True
            if follower:  # a lone writer needs no lock to be woken by
                pending.wake = _held_lock()
            if self.on_queue is not None:
                self.on_queue(len(self._queue))
        if follower:
            # Woken by a leader: with our work decided, or to lead the next commit.
            pending.wake.acquire()  # type: ignore[union-attr]
            if pending.done:
                return pending.outcome()  # type: ignore[no-any-return]
        with self._queue_lock:
            batch, self._queue = self._queue, []
        try:
            self._commit(batch)
        finally:
            with self._queue_lock:
                for item in batch:
                    item.done = True
                # Hand the lead to the oldest writer that queued meanwhile, if any.
                successor = self._queue[0] if self._queue else None
                self._leading = successor is not None
            for item in batch:
                if item is not pending:
                    item.wake.release()  # type: ignore[union-attr]
            if successor is not None:
                successor.wake.release()  # type: ignore[union-attr]
        return pending.outcome()  # type: ignore[no-any-return]

    def _commit(self, batch: list[_Pending]) -> None:
        """Leader: run every body of ``batch`` in one transaction and commit it; each item
        ends with an error, or a result once the commit returned."""
        committed = False
        with self._lock:
            conn = self._connection()
            before = None if self._watch is None or conn is None else self._watch.before_write()
            try:
                if conn is None:
                    raise sqlite3.ProgrammingError("the store is closed")
                if len(batch) == 1 and batch[0].single:
                    self._run_alone(conn, batch[0])
                else:
                    self._run_batch(conn, batch)
                committed = True
            except BaseException as exc:
                # Nothing committed: fail every writer (the leader's interrupt goes on up).
                if conn is not None and conn.in_transaction:
                    conn.execute("ROLLBACK")
                why = f"{self._where} ({exc})" if isinstance(exc, sqlite3.Error) else (
                    f"{self._where}: the transaction was interrupted "
                    f"({type(exc).__name__}) and rolled back")
                for item in batch:
                    item.result = None
                    item.failed(why, exc)
                if not isinstance(exc, Exception):
                    raise
            finally:
                if not committed and conn is not None and conn.in_transaction:
                    conn.execute("ROLLBACK")
                if before is not None:
                    self._tell_watch(before, committed, batch)

    def _tell_watch(self, before: int, committed: bool, batch: list[_Pending]) -> None:
        # The watch's triggers saw the changes; only the batch knows whether all committed.
        ok = committed and all(item.error is None for item in batch)
        self._watch.after_write(before, ok)  # type: ignore[union-attr]

    @staticmethod
    def _run_alone(conn: sqlite3.Connection, item: _Pending) -> None:
        try:
            item.result = item.body(conn)
        except REFUSALS as exc:
            item.error = exc

    @staticmethod
    def _run_batch(conn: sqlite3.Connection, batch: list[_Pending]) -> None:
        alone = len(batch) == 1
        conn.execute("BEGIN IMMEDIATE")
        for item in batch:
            # A refusing one-statement body wrote nothing: no savepoint (each statement gives
            # the interpreter lock away and must win it back).
            guarded = not alone and not item.single
            if guarded:
                conn.execute("SAVEPOINT write")
            try:
                item.result = item.body(conn)
            except REFUSALS as exc:  # this writer's own refusal
                item.error = exc
                if alone:
                    conn.execute("ROLLBACK")
                elif guarded:
                    conn.execute("ROLLBACK TO write")
            if guarded:
                conn.execute("RELEASE write")
        if conn.in_transaction:
            conn.execute("COMMIT")
