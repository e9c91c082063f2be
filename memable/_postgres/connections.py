"""Connections to a PostgreSQL store's server: a pool, retries, and no secrets in messages.

Connections come from a ``psycopg_pool`` pool, in autocommit mode: a
one-statement operation is its own transaction (one round trip), a several-
statement one runs between a ``BEGIN`` and a ``COMMIT`` of its own. Inside ``session()`` (one run,
on its worker thread) every operation of the thread uses the one connection
it took first, and gives it back at the end: no pool hand-over per step.
An operation that meets a lost connection, a serialization failure or a
deadlock is tried again on a fresh connection, with backoff, for up to
``RETRY_FOR`` seconds.

A transaction costs no round trip of its own: its ``BEGIN`` goes with the
body's first statement, and what only matters once it commits (its NOTIFYs,
a relaxed durability) goes with its ``COMMIT`` (``Opening``; statements that
share a round trip go as one text, each planned once per connection:
``batch``).

The commit outcome of a write whose connection went during its ``COMMIT`` is
unknown; one rule decides it, here. A transaction learns its id and its
server process with its ``BEGIN`` (the same round trip); after a lost
``COMMIT``, that process is ended if it is still there and the server says
whether the id committed (``txid_status``): if it did, the answer the
transaction computed is the operation's, else the operation runs again. A
connection lost before the ``COMMIT`` was sent ended the transaction
uncommitted: it runs again. A one-statement operation (``transaction=False``)
is a read, or a write whose second run writes and answers as the first did
(a fenced upsert): it simply runs again.
Every message names the server by ``schema.describe``: never the
URL's password.

A store outage (connections lost or refused) is the engine's lease's
business: once the engine holds one (``renewed``), a run's operation (in a
``session``) retries across lost connections until the lease is known lost
(no heartbeat committed for ``LEASE_USED`` of ``lease`` seconds, so that it
stops before another engine may take over), then raises ``LeaseLost``;
every other operation stops retrying then too, so ``stop()`` returns within
the lease. Each write is fenced by its SQL (the instance is still this
engine's), so a retried write of a run whose lease was in fact lost writes
nothing. The pool does not reconnect on its own schedule (its backoff grows
to many seconds, past a lease): the operations waiting for a connection ask
it for one, with their own short backoff. One WARNING says the connection
was lost, one INFO line that it is back; the pool's own log lines of the
outage (one per try) are demoted to DEBUG.
"""

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
#: Seconds an operation is tried again across lost connections before it fails.
RETRY_FOR = 30.0

#: Longest wait for a pooled connection, and longest backoff between tries: the pool
#: gives up a connect that fails without waking its waiters, and connects again when
#: asked, so each wait that ends (and is tried again) asks it to.
OUTAGE_WAIT = 0.5
#: The part of a lease an outage may use up before the lease counts as lost here: the
#: rest is for the last attempts to end, and for a server clock a little faster than
#: this host's, so a run stops (and ``stop()`` returns) before another engine may take
#: its instance over.
LEASE_USED = 0.9
#: Numbers the pools of this process (their names, and their threads', say whose).
_POOLS = itertools.count(1)
#: This thread's own: ``quiet`` while it is inside ``Connections`` (see ``_QuietPool``).
_INSIDE = threading.local()


class Opening:
    """The transaction ``Connections`` holds open on a connection for one operation.

    Nothing is sent until the body's first statement, which goes with the
    ``BEGIN`` (and the question of the transaction's id and server process) in
    one round trip; what only matters once the transaction commits
    (``at_commit``: NOTIFYs, a relaxed durability) is sent with the ``COMMIT``.
    A statement whose result the body does not read (``later``) waits for the
    next one, or the ``COMMIT``, and shares its round trip. Statements that
    share a round trip go as one text (``batch``). Used by one thread, the
    operation's.
    """

    __slots__ = ("at_commit", "begun", "later", "pid", "xid")

    def __init__(self) -> None:
        self.begun = False
        self.xid = self.pid = 0
        #: Statements to send just before the ``COMMIT``, in its round trip.
        self.at_commit: list[batch.Statement] = []
        #: Statements whose results nobody reads, to send with the next one.
        self.later: list[batch.Statement] = []

    def commit(self, conn: psycopg.Connection[Any]) -> None:
        """Send what waits, and the ``COMMIT``, in one round trip."""
        batch.send(conn, [*self.later, *self.at_commit, ("COMMIT", None)])

    def execute(
        self, conn: psycopg.Connection[Any], sql: str, params: batch.Parameters
    ) -> batch.Read:
        """Run ``sql`` in this transaction: with what waits, and its ``BEGIN`` if it is
        the first, in one round trip."""
        return self._send(conn, [(sql, params)])[0]

    def execute_each(
        self, conn: psycopg.Connection[Any], statements: list[batch.Statement]
    ) -> list[list[Any]]:
        """Run each of ``statements`` in this transaction (with what waits, and its
        ``BEGIN`` if they are the first), in one round trip; each one's rows."""
        return [read.rows for read in self._send(conn, statements)]

    def flush(self, conn: psycopg.Connection[Any]) -> None:
        """Send the ``BEGIN`` if nothing was sent yet, and what waits."""
        self._send(conn, [])

    def _send(self, conn: psycopg.Connection[Any], statements: list[batch.Statement]) -> list[
            batch.Read]:
        """Send the ``BEGIN`` if nothing was sent yet, what waits, then ``statements``, in
        one round trip; what each of ``statements`` read."""
        first: list[batch.Statement] = [] if self.begun else [("BEGIN", None), (_ASK_XID, None)]
        reads = batch.send(conn, [*first, *self.later, *statements])
        if first:
            self.begun = True
            self.xid, self.pid = reads[1].rows[0]
        self.later.clear()
        return reads[len(reads) - len(statements):]


#: A transaction's id and server process, asked with its ``BEGIN``.
_ASK_XID = "SELECT txid_current(), pg_backend_pid()"


class Connection(psycopg.Connection[Any]):
    """A connection of a store's pool: ``opening`` is the transaction an operation holds
    open on it (None between operations, and in a one-statement operation)."""

    opening: Opening | None = None
    #: The store prepares its statements on it (``batch``).
    prepares = True

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
    """Demote to DEBUG the WARNINGs psycopg's pool logs for memable's pools: a failed
    reconnect per try, a broken connection given back. ``Connections`` says it once
    per outage instead. Records of other pools in the process are left alone."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.WARNING and (
            getattr(_INSIDE, "quiet", False)
            or threading.current_thread().name.startswith("memable-pool")
        ):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            # The logger let it through as a WARNING: as a DEBUG record, only if it
            # would let that through.
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


_QUIET_POOL = _QuietPool()
logging.getLogger("psycopg.pool").addFilter(_QUIET_POOL)  # adding it twice adds it once


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
        self._timeout = timeout
        # _state_lock guards _lease_until (monotonic: when this engine's lease is known
        # lost, None while it holds none) and _down_since (monotonic: when the
        # connection was found lost, None while it answers).
        self._state_lock = threading.Lock()
        self._lease_until: float | None = None
        self._down_since: float | None = None
        # The pool's own threads are named after it; close() joins them. It gives up
        # a reconnect at its first failure (reconnect_timeout 0): the operations that
        # wait for a connection ask for the next one (see run).
        self._pool = psycopg_pool.ConnectionPool(
            url, kwargs=self._kwargs, connection_class=Connection,
            min_size=1, max_size=max(2, pool_size),
            open=False, name=f"memable-pool-{next(_POOLS)}", timeout=timeout,
            configure=self._configure, reconnect_timeout=0.0,
            reconnect_failed=lambda pool: self._went_down(None),
        )
        self._pool.open(wait=True, timeout=timeout)
        # _closing is set once, by close(): retries stop waiting and fail.
        self._closing = threading.Event()
        # Each thread's own: ``active`` inside session(), and the connection it holds.
        self._held = threading.local()

    def renewed(self, at: float | None, lease: float) -> None:
        """This engine's lease was renewed by a heartbeat sent at ``at`` (monotonic) and
        committed; None: it holds none any more (its owner row is gone)."""
        with self._state_lock:
            self._lease_until = None if at is None else at + lease * LEASE_USED

    def _answered(self) -> None:
        """An operation went through: if the connection had been lost, say it is back."""
        with self._state_lock:
            since, self._down_since = self._down_since, None
        if since is not None:
            log.info("reached %s again after %.1fs", self.where, time.monotonic() - since)

    def _went_down(self, exc: BaseException | None) -> None:
        """An operation found the connection lost, or the pool could not connect (None):
        say so once per outage."""
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
        """Set a new connection's schema and durability (the pool's ``configure``, and
        ``_connect``'s): by SQL, never through a connection option."""
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
        self,
        what: str,
        fn: Callable[[Connection], T],
        workflow: str | None = None,
        instance_id: str | None = None,
        key: str | None = None,
        *,
        transaction: bool = True,
        past_lease: float = OUTAGE_WAIT,
    ) -> T:
        """Run ``fn`` on a pooled connection (in a transaction unless told not to).

        On a retryable error try again with backoff; a transaction whose
        commit went unanswered is decided first (the module docstring). A
        lost connection is retried for
        ``RETRY_FOR`` seconds, and no longer than this engine's lease is known
        held; in a run's ``session``, until then, whatever ``RETRY_FOR`` says,
        and then ``LeaseLost`` is raised instead of ``StorageError``. An operation
        outside a run is tried for ``past_lease`` seconds at least, even if the
        lease was known lost when it began: once the server answers again, it gets
        a connection that takes a moment to open (the lease stays known lost until
        the next heartbeat commits).
        """
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
                # Read each time round: a heartbeat may have renewed the lease meanwhile.
                with self._state_lock:
                    lease_until = self._lease_until
                lost_deadline = deadline
                if lease_until is not None:  # (outside a run, one real try at least)
                    lost_deadline = lease_until if in_run else max(
                        min(deadline, lease_until), began + past_lease)
                # A wait for a pooled connection is short, and tried again: the pool
                # gives up a connect that fails and does not wake its waiters, it
                # connects again when asked.
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
                            workflow=workflow, instance_id=instance_id, key=key,
                        ) from None
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
                                "again once the store answers)"
                            ) from None
                        raise StorageError(
                            f"cannot {what} in {self.where} ({self._redact(exc)})",
                            workflow=workflow, instance_id=instance_id, key=key,
                        ) from None
                # A wait between attempts that close() ends at once.
                self._closing.wait(delay)
                delay = min(delay * 2, OUTAGE_WAIT)
        finally:
            _INSIDE.quiet = quiet

    @staticmethod
    def _attempt(
        conn: Connection,
        fn: Callable[[Connection], T],
        transaction: bool,
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
        if not opening.begun:
            return answer  # it ran no statement: nothing to commit
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
    """End the transaction an operation left open on ``conn`` (if the connection went,
    the server ends it)."""
    if not conn.closed and conn.info.transaction_status != _IDLE:
        # Every prepared statement goes too, in the same round trip: psycopg deallocates
        # them all after a ROLLBACK once it prepared any itself; now always, and known.
        batch.forget(conn)
        with contextlib.suppress(psycopg.Error):
            conn.execute("ROLLBACK; DEALLOCATE ALL")


#: Ends the server process ``pid`` if it still holds the transaction ``xid`` (its 32-bit
#: form, as ``pg_stat_activity`` shows it), waiting up to 5 s for it to end.
_END_HOLDER = (
    "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity "
    "WHERE pid = %s AND backend_xid::text = %s"
)


def _committed(conn: Connection, lost: _LostCommit) -> bool:
    """Whether the transaction whose ``COMMIT`` went unanswered committed, asked on another
    connection ``conn``: its server process is ended first if it is still there, so the
    answer is final."""
    while True:
        status = conn.execute("SELECT txid_status(%s)", (lost.xid,)).fetchone()[0]  # type: ignore[index]
        if status != "in progress":
            return status == "committed"  # type: ignore[no-any-return]
        # The server has not seen the connection go: end its process (waiting up to 5 s
        # for it to end), then ask again. Only the process that still holds the
        # transaction: one that ended meanwhile may have left its pid to another.
        conn.execute(_END_HOLDER, (lost.pid, str(lost.xid % (1 << 32))))
