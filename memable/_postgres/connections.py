"""Connections to a PostgreSQL store's server: a pool, retries, and no secrets in messages.

Connections come from a ``psycopg_pool`` pool, in autocommit mode: a
one-statement operation is its own transaction (one round trip), a several-
statement one runs in ``conn.transaction()``. Inside ``session()`` (one run,
on its worker thread) every operation of the thread uses the one connection
it took first, and gives it back at the end: no pool hand-over per step.
An operation that meets a lost connection, a serialization failure or a
deadlock is tried again on a fresh connection, with backoff, for up to
``RETRY_FOR`` seconds. A write whose commit outcome is unknown (the
connection went before the answer came) first reads back whether it
committed (its ``read_back``), so a retry never stores a second outcome.
Every message names the server by ``schema.describe``: never the
URL's password.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from .._errors import StorageError
from .._store.protocol import Synchronous
from . import schema as schema_

T = TypeVar("T")
Connection = psycopg.Connection[Any]
#: Seconds an operation is tried again across lost connections before it fails.
RETRY_FOR = 30.0
#: ``read_back`` found the write not committed: run it (again).
NOT_DONE = object()


def _keep_real_time_in_psycopg() -> None:
    """Have freezegun (if a test uses it) leave psycopg's and its pool's clocks alone.

    The pool's threads schedule their work by ``time.monotonic``; frozen, they
    never see a deadline pass and ``close()`` cannot join them. freezegun
    gives real time to callers in modules on its ignore list.
    """
    freezegun = sys.modules.get("freezegun")
    if freezegun is not None and hasattr(freezegun, "configure"):
        freezegun.configure(extend_ignore_list=["psycopg"])


def _retryable(exc: BaseException) -> bool:
    """A lost connection, a pool that found none, a serialization failure or a deadlock."""
    return isinstance(exc, (psycopg.OperationalError, psycopg_pool.PoolTimeout))


class Connections:
    """The pool of one store, and how its operations are run and retried."""

    def __init__(
        self, url: str, synchronous: Synchronous, schema: str, *, create: bool, pool_size: int
    ) -> None:
        self._url = url
        self._params = schema_.parse(url)
        #: How messages name the store: server and schema, no password.
        self.where = f"{schema_.describe(self._params)} (schema {schema!r})"
        self._kwargs = schema_.connect_kwargs(self._params, synchronous, schema)
        # Each new connection's first statement: the store's schema and durability.
        self._session_sql = schema_.session_sql(synchronous, schema)
        _keep_real_time_in_psycopg()
        with self._connect("open the store") as conn:
            try:
                schema_.prepare(conn, schema, self.where, create=create)
            except psycopg.Error as exc:
                raise StorageError(f"cannot prepare {self.where} ({self._redact(exc)})") from None
        timeout = float(self._params.get("connect_timeout", schema_.CONNECT_TIMEOUT))
        # The pool's own threads are named after it; close() joins them.
        self._pool = psycopg_pool.ConnectionPool(
            url, kwargs=self._kwargs, min_size=1, max_size=max(2, pool_size),
            open=False, name="memable-pool", timeout=timeout, configure=self._configure,
        )
        self._pool.open(wait=True, timeout=timeout)
        # _closing is set once, by close(): retries stop waiting and fail.
        self._closing = threading.Event()
        # Each thread's own: ``active`` inside session(), and the connection it holds.
        self._held = threading.local()

    @property
    def closed(self) -> bool:
        return self._closing.is_set()

    def close(self) -> None:
        self._closing.set()
        self._pool.close()

    def _redact(self, exc: BaseException) -> str:
        return schema_.redact(str(exc).strip(), self._url, self._params)

    def _configure(self, conn: Connection) -> None:
        """Set a new connection's schema and durability (the pool's ``configure``, and
        ``_connect``'s): by SQL, never through a connection option."""
        conn.execute(self._session_sql)

    def _connect(self, what: str) -> Connection:
        """A connection of its own (not the pool's): opening, and listening."""
        conn: Connection | None = None
        try:
            conn = psycopg.connect(self._url, **self._kwargs)
            self._configure(conn)
            return conn
        except psycopg.Error as exc:
            if conn is not None:
                conn.close()
            raise StorageError(f"cannot {what}: cannot connect to {self.where} "
                               f"({self._redact(exc)})") from None

    def connect(self) -> Connection:
        """A new connection of its own to the store (the listener's); StorageError if none."""
        return self._connect("listen for changes")

    @contextmanager
    def session(self) -> Iterator[None]:
        """Within: this thread's operations share one pooled connection, taken at the first.

        Nested sessions are one. A connection that failed is given back (the
        pool replaces a broken one) and the next operation takes another.
        """
        held = self._held
        if getattr(held, "active", False):
            yield
            return
        held.active, held.conn = True, None
        try:
            yield
        finally:
            conn, held.active, held.conn = held.conn, False, None
            if conn is not None:
                self._pool.putconn(conn)

    def _take(self) -> Connection | None:
        """The connection this thread's session holds (taking one if needed); None outside."""
        held = self._held
        if not getattr(held, "active", False):
            return None
        if held.conn is None:
            held.conn = self._pool.getconn()
        conn: Connection = held.conn
        return conn

    def _give_back(self) -> None:
        """After an error: return the session's connection, if any, to the pool."""
        held = self._held
        conn = getattr(held, "conn", None)
        if conn is not None:
            held.conn = None
            self._pool.putconn(conn)

    def run(
        self,
        what: str,
        fn: Callable[[Connection], T],
        workflow: str | None = None,
        instance_id: str | None = None,
        key: str | None = None,
        *,
        transaction: bool = True,
        read_back: Callable[[Connection], object] | None = None,
    ) -> T:
        """Run ``fn`` on a pooled connection (in a transaction unless told not to).

        On a retryable error try again with backoff; a write whose commit
        outcome is unknown runs ``read_back`` first (its answer, unless
        ``NOT_DONE``, is the write's).
        """
        deadline = time.monotonic() + RETRY_FOR
        delay = 0.05
        unknown = False
        while True:
            if self._closing.is_set():
                raise StorageError(f"cannot {what}: the store {self.where} is closed",
                                   workflow=workflow, instance_id=instance_id, key=key)
            try:
                held = self._take()
                if held is not None:
                    return self._attempt(held, fn, transaction, unknown, read_back)
                with self._pool.connection() as conn:
                    return self._attempt(conn, fn, transaction, unknown, read_back)
            except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
                if isinstance(exc, psycopg.OperationalError):
                    self._give_back()
                if not _retryable(exc) or time.monotonic() + delay > deadline:
                    raise StorageError(
                        f"cannot {what} in {self.where} ({self._redact(exc)})",
                        workflow=workflow, instance_id=instance_id, key=key,
                    ) from None
                # A serialization failure or deadlock rolled back; else the
                # connection went, and the commit may or may not have happened.
                unknown = unknown or not isinstance(exc, psycopg.errors.TransactionRollback)
            # A wait between attempts that close() ends at once.
            self._closing.wait(delay)
            delay = min(delay * 2, 1.0)

    @staticmethod
    def _attempt(
        conn: Connection,
        fn: Callable[[Connection], T],
        transaction: bool,
        unknown: bool,
        read_back: Callable[[Connection], object] | None,
    ) -> T:
        """One try of an operation on ``conn``: read back first if a commit went unanswered."""
        if unknown and read_back is not None:
            done = read_back(conn)
            if done is not NOT_DONE:
                return done  # type: ignore[return-value]
        if not transaction:
            return fn(conn)
        with conn.transaction():
            return fn(conn)
