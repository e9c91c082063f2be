"""Connections to a PostgreSQL store's server: a pool, retries, and no secrets in messages.

Connections come from a pool, in autocommit mode; in a ``session()`` (one run) the thread's
operations share one. A lost connection, serialization failure or deadlock is retried on a
fresh connection, with backoff. Messages name the server by ``schema.describe``.

A lost ``COMMIT`` is decided by one rule: the transaction learned its id and server process
with its ``BEGIN``; the process is ended if still there, and ``txid_status`` says whether the
id committed: if so, the answer computed is the operation's, else it runs again (as it does
after a connection lost before the ``COMMIT``). A one-statement operation is a read or a
fenced upsert that answers alike twice: it simply runs again.

An outage is the lease's business: once the engine holds one (``renewed``), an operation
retries until the lease is known lost (``LEASE_USED``), then a run's raises ``LeaseLost`` and
others stop, so ``stop()`` returns within the lease; writes are fenced, so a late retry writes
nothing. One WARNING says the connection was lost, one INFO that it is back; the pool's
per-try lines are demoted to DEBUG."""

from __future__ import annotations

import contextlib
import itertools
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import psycopg
import psycopg_pool

from .._errors import StorageError
from .._log import log
from .._store.control import LeaseLost
from .._store.protocol import Synchronous
from . import batch
from . import schema as schema_

T = TypeVar("T")
Cursor = psycopg.Cursor[Any]
RETRY_FOR = 30.0  # seconds an operation is retried across lost connections

#: Longest wait for a pooled connection, and longest backoff between tries: the pool gives up a
#: failed connect without waking its waiters and connects again when asked, so each retry asks.
OUTAGE_WAIT = 0.5
#: The part of a lease an outage may use before the lease counts as lost: the rest is for the
#: last attempts, and a server clock a little fast, so a run stops before another engine may
#: take its instance over.
LEASE_USED = 0.9
_POOLS = itertools.count(1)  # numbers this process's pools (in their threads' names)
_INSIDE = threading.local()  # ``quiet`` while this thread is inside ``Connections``


class Opening:
    """The transaction held open for one operation, costing no round trip of its own: the
    ``BEGIN`` (asking its id and process) goes with the first statement, ``at_commit`` with the
    ``COMMIT``, ``later`` with the next statement; each round trip is one text (``batch``)."""

    __slots__ = ("at_commit", "begun", "committed", "later", "pid", "xid")

    def __init__(self) -> None:
        self.begun = self.committed = False
        self.xid = self.pid = 0
        self.at_commit: list[batch.Statement] = []
        self.later: list[batch.Statement] = []

    def commit(self, conn: psycopg.Connection[Any]) -> None:
        """Send what waits, and the ``COMMIT``, in one round trip."""
        batch.send(conn, [*self.later, *self.at_commit, ("COMMIT", None)])

    def execute(
        self, conn: psycopg.Connection[Any], sql: str, params: batch.Parameters
    ) -> batch.Read:
        """Run ``sql`` in this transaction, in one round trip with what waits."""
        return self._send(conn, [(sql, params)])[0]

    def execute_each(
        self, conn: psycopg.Connection[Any], statements: list[batch.Statement], *,
        last: bool = False,
    ) -> list[list[Any]]:
        """Run ``statements`` in this transaction in one round trip; each one's rows.
        ``last``: the ``COMMIT`` goes in that round trip too (``Transaction.execute_each``);
        its answer lost, the connection's error is raised, and the body runs again."""
        commit = [*self.at_commit, ("COMMIT", None)] if last else []
        reads = self._send(conn, [*statements, *commit])
        self.committed = last
        return [read.rows for read in reads[:len(statements)]]

    def flush(self, conn: psycopg.Connection[Any]) -> None:
        """Send the ``BEGIN`` if nothing was sent yet, and what waits."""
        self._send(conn, [])

    def _send(self, conn: psycopg.Connection[Any], statements: list[batch.Statement]) -> list[
            batch.Read]:
        """Send ``BEGIN`` (if unsent), what waits and ``statements`` in one trip; their reads."""
        first: list[batch.Statement] = [] if self.begun else [("BEGIN", None), (_ASK_XID, None)]
        reads = batch.send(conn, [*first, *self.later, *statements])
        if first:
            self.begun = True
            self.xid, self.pid = reads[1].rows[0]
        self.later.clear()
        return reads[len(reads) - len(statements):]


_ASK_XID = "SELECT txid_current(), pg_backend_pid()"


class Connection(psycopg.Connection[Any]):
    """A connection of a store's pool: ``opening`` is the transaction an operation holds
    open on it (None between operations, and in a one-statement operation)."""

    opening: Opening | None = None
    prepares = True  # the store prepares its statements on it (``batch``)

    def send_text(self, text: bytes) -> list[Any]:
        """Run the statements of ``text`` in one round trip (``batch.run_text``): where a
        test stands in for the connection to watch, or lose, what ``batch`` sends."""
        return batch.run_text(self, text)


class _LostCommit(Exception):
    """A transaction's ``COMMIT`` went unanswered: the server decides whether it happened."""

    def __init__(self, xid: int, pid: int, answer: object, cause: psycopg.Error) -> None:
        super().__init__(str(cause))
        self.xid, self.pid, self.answer, self.cause = xid, pid, answer, cause


class _QuietPool(logging.Filter):
    """Demote to DEBUG the WARNINGs psycopg's pool logs for memable's pools (``Connections``
    says it once per outage); other pools' records are left alone."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and (getattr(_INSIDE, "quiet", False)
                or threading.current_thread().name.startswith("memable-pool")):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            # The logger let it through as a WARNING; as a DEBUG, it may not.
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


_QUIET_POOL = _QuietPool()
logging.getLogger("psycopg.pool").addFilter(_QUIET_POOL)  # adding it twice adds it once


def _keep_real_time_in_psycopg() -> None:
    """Have freezegun (if a test uses it) leave psycopg's clocks alone: the pool's threads
    schedule by ``time.monotonic``, and frozen, ``close()`` cannot join them."""
    freezegun = sys.modules.get("freezegun")
    if freezegun is not None and hasattr(freezegun, "configure"):
        freezegun.configure(extend_ignore_list=["psycopg"])


def _retryable(exc: BaseException) -> bool:
    """A lost connection, a pool that found none, a serialization failure or a deadlock."""
    return isinstance(exc, (psycopg.OperationalError, psycopg_pool.PoolTimeout))


def _lost(exc: BaseException) -> bool:
    """A lost or refused connection (the server unreachable), not a rolled-back one."""
    return _retryable(exc) and not isinstance(exc, psycopg.errors.TransactionRollback)


class Connections:
    """The pool of one store, and how its operations are run and retried."""

    def __init__(
        self, url: str, synchronous: Synchronous, schema: str, *, create: bool, pool_size: int
    ) -> None:
        self._url = url
        self._params = schema_.parse(url)
        self.where = f"{schema_.describe(self._params)} (schema {schema!r})"
        self._kwargs = schema_.connect_kwargs(self._params, synchronous, schema)
        self._session_sql = schema_.session_sql(synchronous, schema)
        _keep_real_time_in_psycopg()
        with self._connect("open the store") as conn:
            try:
                schema_.prepare(conn, schema, self.where, create=create)
            except psycopg.Error as exc:
                raise StorageError(f"cannot prepare {self.where} ({self._redact(exc)})") from None
        timeout = float(self._params.get("connect_timeout", schema_.CONNECT_TIMEOUT))
        self._timeout = timeout
        # _state_lock guards _lease_until (monotonic: when the lease is known lost; None:
        # no lease) and _down_since (monotonic: when the connection was lost; None: up).
        self._state_lock = threading.Lock()
        self._lease_until: float | None = None
        self._down_since: float | None = None
        # reconnect_timeout 0: waiting operations ask for the next connect (see run).
        self._pool = psycopg_pool.ConnectionPool(url, kwargs=self._kwargs,
            connection_class=Connection, min_size=1, max_size=max(2, pool_size), open=False,
            name=f"memable-pool-{next(_POOLS)}", timeout=timeout, configure=self._configure,
            reconnect_timeout=0.0, reconnect_failed=lambda pool: self._went_down(None))
        self._pool.open(wait=True, timeout=timeout)
        self._closing = threading.Event()  # set by close(): retries stop and fail
        # Each thread's own: ``active`` inside session(), and the connection it holds.
        self._held = threading.local()

    def renewed(self, at: float | None, lease: float) -> None:
        """A heartbeat sent at ``at`` (monotonic) committed; None: the lease is gone."""
        with self._state_lock:
            self._lease_until = None if at is None else at + lease * LEASE_USED

    def _answered(self) -> None:
        """An operation went through: say so if the connection had been lost."""
        with self._state_lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            log.info("reached %s again after %.1fs", self.where, time.monotonic() - since)

    def _went_down(self, exc: BaseException | None) -> None:
        """Connection lost (``exc``) or pool unable to connect (None): say so once per outage."""
        with self._state_lock:
            first = self._down_since is None
            if first:
                self._down_since = time.monotonic()
        if first:
            text = "" if exc is None else self._redact(exc)
            reason = (text.splitlines() or ["cannot connect"])[0]
            log.warning("lost the connection to %s (%s); retrying, the engine's runs keep "
                        "their leases meanwhile", self.where, reason)

    @property
    def closed(self) -> bool:
        return self._closing.is_set()

    def close(self) -> None:
        self._closing.set()
        self._pool.close()

    def _redact(self, exc: BaseException) -> str:
        return schema_.redact(str(exc).strip(), self._url, self._params)

    def _configure(self, conn: Connection) -> None:
        """Set a new connection's schema and durability, by SQL (never a connection option)."""
        conn.execute(self._session_sql)

    def _connect(self, what: str) -> Connection:
        """A connection of its own (not the pool's): opening, and listening."""
        conn: Connection | None = None
        try:
            conn = Connection.connect(self._url, **self._kwargs)
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
        """Within (nested: once), this thread's operations share one pooled connection, taken at
        the first; a failed one is given back and the next operation takes another."""
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
                quiet, _INSIDE.quiet = getattr(_INSIDE, "quiet", False), True
                try:
                    self._pool.putconn(conn)
                finally:
                    _INSIDE.quiet = quiet

    def _take(self, timeout: float) -> Connection | None:
        """The connection this thread's session holds (taking one if needed); None outside."""
        held = self._held
        if not getattr(held, "active", False):
            return None
        if held.conn is None:
            held.conn = self._pool.getconn(timeout)
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
        self, what: str, fn: Callable[[Connection], T], workflow: str | None = None,
        instance_id: str | None = None, key: str | None = None, *, transaction: bool = True,
        past_lease: float = OUTAGE_WAIT,
    ) -> T:
        """Run ``fn`` on a pooled connection (in a transaction unless told not to), retrying.

        A lost connection is retried for ``RETRY_FOR`` seconds, no longer than the lease is known
        held; in a run's ``session``, until then, then ``LeaseLost``. Outside a run, for
        ``past_lease`` seconds at least: a lease known lost stays so until a heartbeat commits."""
        in_run = bool(getattr(self._held, "active", False))
        began = time.monotonic()
        deadline = began + RETRY_FOR  # for a serialization failure or deadlock
        delay = 0.05
        lost_commit: _LostCommit | None = None
        quiet, _INSIDE.quiet = getattr(_INSIDE, "quiet", False), True
        try:
            while True:
                if self._closing.is_set():
                    raise StorageError(f"cannot {what}: the store {self.where} is closed",
                                       workflow=workflow, instance_id=instance_id, key=key)
                now = time.monotonic()
                # Each time round: a heartbeat may have renewed the lease.
                with self._state_lock:
                    lease_until = self._lease_until
                lost_deadline = deadline
                if lease_until is not None:  # (outside a run, one real try at least)
                    lost_deadline = lease_until if in_run else max(
                        min(deadline, lease_until), began + past_lease)
                # Short, and tried again (see OUTAGE_WAIT).
                wait = max(0.05, min(self._timeout, OUTAGE_WAIT, lost_deadline - now))
                try:
                    held = self._take(wait)
                    if held is not None:
                        done = self._attempt(held, fn, transaction, lost_commit)
                    else:
                        with self._pool.connection(wait) as conn:
                            done = self._attempt(conn, fn, transaction, lost_commit)
                    self._answered()
                    return done
                except _LostCommit as exc:
                    lost_commit = exc
                    self._give_back()
                    self._went_down(exc.cause)
                    if time.monotonic() + delay > lost_deadline:
                        raise StorageError(
                            f"cannot {what} in {self.where} ({self._redact(exc.cause)}): "
                            "whether it was stored is not known",
                            workflow=workflow, instance_id=instance_id, key=key) from None
                except (psycopg.Error, psycopg_pool.PoolTimeout) as exc:
                    if isinstance(exc, psycopg.OperationalError):
                        self._give_back()
                    lost = _lost(exc)
                    if lost and not isinstance(exc, psycopg_pool.PoolTimeout):
                        self._went_down(exc)  # (no connection in time: the pool says)
                    ends = lost_deadline if lost else deadline
                    if not _retryable(exc) or time.monotonic() + delay > ends:
                        if lost and in_run and lease_until is not None:
                            raise LeaseLost(
                                f"cannot {what} of {workflow}/{instance_id} in "
                                f"{self.where}: unreachable until this "
                                "engine's lease ran out (the run stops; the instance runs "
                                "again once the store answers)") from None
                        raise StorageError(f"cannot {what} in {self.where} ({self._redact(exc)})",
                            workflow=workflow, instance_id=instance_id, key=key) from None
                self._closing.wait(delay)
                delay = min(delay * 2, OUTAGE_WAIT)
        finally:
            _INSIDE.quiet = quiet

    @staticmethod
    def _attempt(
        conn: Connection, fn: Callable[[Connection], T], transaction: bool,
        lost_commit: _LostCommit | None,
    ) -> T:
        """One try of an operation on ``conn``; a lost commit's outcome decided first."""
        if lost_commit is not None and _committed(conn, lost_commit):
            return lost_commit.answer  # type: ignore[return-value]
        if not transaction:
            return fn(conn)
        opening = conn.opening = Opening()
        try:
            answer = fn(conn)
        except BaseException:
            _roll_back(conn)
            raise
        finally:
            conn.opening = None
        if not opening.begun or opening.committed:
            return answer  # it ran no statement, or committed with its last ones
        try:
            opening.commit(conn)
        except psycopg.OperationalError as exc:
            if isinstance(exc, psycopg.errors.TransactionRollback):
                raise  # refused at commit (serialization): rolled back, tried again
            raise _LostCommit(opening.xid, opening.pid, answer, exc) from exc
        except BaseException:  # a statement sent with the COMMIT failed: it did not commit
            _roll_back(conn)
            raise
        return answer


_IDLE = psycopg.pq.TransactionStatus.IDLE


def _roll_back(conn: Connection) -> None:
    """End the transaction an operation left open on ``conn`` (if it went, the server does)."""
    if not conn.closed and conn.info.transaction_status != _IDLE:
        # psycopg deallocates all prepared statements after a ROLLBACK once it prepared any:
        # do it always, in the same round trip, and know it.
        batch.forget(conn)
        with contextlib.suppress(psycopg.Error):
            conn.execute("ROLLBACK; DEALLOCATE ALL")


#: Ends process ``pid`` if it still holds transaction ``xid`` (32-bit, as
#: ``pg_stat_activity`` shows it), waiting up to 5 s.
_END_HOLDER = (
    "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
    "WHERE pid = %s AND backend_xid::text = %s"
)


def _committed(conn: Connection, lost: _LostCommit) -> bool:
    """Whether the transaction of a lost ``COMMIT`` committed, asked on another connection
    ``conn``; its process is ended first if still there, so the answer is final."""
    while True:
        status = conn.execute("SELECT txid_status(%s)", (lost.xid,)).fetchone()[0]  # type: ignore[index]
        if status != "in progress":
            return status == "committed"  # type: ignore[no-any-return]
        # The server has not seen the connection go: end its process, then ask again. Only
        # while it holds the transaction: a process that ended may have left its pid to another.
        conn.execute(_END_HOLDER, (lost.pid, str(lost.xid % (1 << 32))))
