"""Several statements in one round trip: one text, each statement planned once per connection.

Every statement of a store goes through ``send``. Those that need no answer between them
(``BEGIN`` and the first reads; the last writes, NOTIFYs and ``COMMIT``) go as one text
over the simple query protocol, through libpq (``run_text``): a psycopg cursor or pipeline
costs more Python than the round trip (the client's CPU, measured: a three-column
``SELECT`` 75 µs through ``Connection.execute``, 35 µs so; a claim 400 µs through the
pipeline, 270 as one text). On the store's own connections (``prepares``), a statement with
named parameters is prepared in the text that first sends it (again, renamed, if that text
failed) and run by ``EXECUTE`` after, its arguments written into the text (``_bind``).
"""

from __future__ import annotations

import itertools
import math
import re
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg
from psycopg import generators
from psycopg.adapt import Transformer

#: A statement's parameters: by name (prepared), by position (bound each time), or none.
Parameters = Mapping[str, Any] | Sequence[Any] | None
#: A statement and its parameters.
Statement = tuple[str, Parameters]

#: Statements one connection keeps prepared: past that, the one used longest ago is
#: deallocated, so statements built per call (a purge's ``IN`` list) never pile up.
PREPARED = 256
#: The names of statements prepared, unique in this process.
_NAMES = itertools.count(1)
#: ``%(name)s``, a named parameter as a spelled statement writes it.
_PARAMETER = re.compile(r"%\((\w+)\)s")
_ROWS = psycopg.pq.ExecStatus.TUPLES_OK
_FAILED = psycopg.pq.ExecStatus.FATAL_ERROR
_OK = psycopg.pq.ConnStatus.OK
_IDLE = psycopg.pq.TransactionStatus.IDLE

#: A statement prepared on a connection: its name, and the start of the ``EXECUTE`` that
#: runs it (its arguments follow, then a closing parenthesis if it has any).
_Prepared = tuple[str, bytes]
# _sessions_lock guards _sessions: per libpq connection (under any wrapper), its ``_Session``.
_sessions_lock = threading.Lock()
_sessions: weakref.WeakKeyDictionary[Any, _Session] = weakref.WeakKeyDictionary()


class Read:
    """What one statement of a text read: its rows, and how many rows it changed (as a
    cursor gives them: ``Transaction.execute`` answers with it)."""

    __slots__ = ("_result", "rowcount", "rows")

    def __init__(self, result: Any, rowcount: int, rows: list[Any]) -> None:
        self._result, self.rowcount, self.rows = result, rowcount, rows

    @property
    def description(self) -> list[tuple[str]] | None:
        """The names of the columns read (each a 1-tuple); None if it read no rows."""
        result = self._result
        if result is None or result.status != _ROWS:
            return None
        return [((result.fname(i) or b"").decode(),) for i in range(result.nfields)]

    def fetchone(self) -> Any:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[Any]:
        return self.rows


class _Session:
    """What ``send`` keeps of one connection: the statements prepared there (by text and
    parameters' types, the one used longest ago first), and how it reads rows and quotes
    strings. Used by the one thread that holds the connection."""

    __slots__ = ("encoding", "escaping", "prepared", "transformer")

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.prepared: dict[tuple[str, tuple[str, ...]], _Prepared] = {}
        self.transformer = Transformer(conn)
        self.escaping = psycopg.pq.Escaping(conn.pgconn)
        self.encoding = conn.info.encoding


def send(conn: psycopg.Connection[Any], statements: list[Statement]) -> list[Read]:
    """Run ``statements`` on ``conn`` as one text, in one round trip; what each read, in
    order. The first that fails raises (those after it do not run)."""
    # Only on the store's own connections, whose ROLLBACKs forget what was prepared.
    ours = getattr(conn, "prepares", False)
    with _sessions_lock:
        session = _sessions.get(conn.pgconn)
        if session is None:
            session = _sessions[conn.pgconn] = _Session(conn)
    prepared = session.prepared
    encoding = session.encoding
    # The text's statements, and whether each is one of ``statements`` (else added here).
    parts: list[bytes] = []
    answers: list[bool] = []
    made: dict[tuple[str, tuple[str, ...]], _Prepared] = {}
    for sql, params in statements:
        if params is None:
            parts.append(sql.encode(encoding))
        elif isinstance(params, Mapping) and ours:
            names = _parameters(sql)
            types, arguments = _bind(conn, session, [params[name] for name in names])
            # Prepared again for other types: an int too large for the type it had first.
            key = (sql, types)
            found = prepared.pop(key, None) or made.get(key)
            if found is None:
                if len(prepared) >= PREPARED:  # the statement used longest ago goes
                    parts.append(f"DEALLOCATE {prepared.pop(next(iter(prepared)))[0]}".encode())
                    answers.append(False)
                found, prepare = _prepare(*key, names)
                parts.append(prepare.encode(encoding))
                answers.append(False)
                made[key] = found
            else:
                prepared[key] = found  # (the last used go last)
            parts.append(found[1] + arguments + b")" if names else found[1])
        else:
            parts.append(psycopg.ClientCursor(conn).mogrify(sql, params).encode(encoding))
        answers.append(True)
    text = b"; ".join(parts)
    send_text = getattr(conn, "send_text", None)  # (a test's connection may stand in)
    results = run_text(conn, text) if send_text is None else send_text(text)
    reads = []
    transformer = session.transformer
    # One result per statement, in order, up to the first that failed.
    for result, answer in zip(results, answers, strict=False):
        status = result.status
        if status == _FAILED:
            raise psycopg.errors.error_from_result(result, encoding=encoding)
        if answer:
            rows: list[Any] = []
            if status == _ROWS:
                transformer.set_pgresult(result)
                rows = transformer.load_rows(0, result.ntuples, tuple)
            count = result.command_tuples
            reads.append(Read(result, -1 if count is None else count, rows))
    prepared.update(made)
    return reads


def run_text(conn: psycopg.Connection[Any], text: bytes) -> list[Any]:
    """Send ``text`` in the simple query protocol (one message, however many statements,
    no parameters): each statement's result, up to the first that failed."""
    with conn.lock:
        pgconn = conn.pgconn
        if pgconn.status != _OK:
            raise psycopg.OperationalError("the connection is closed")
        # Not autocommit (a connection handed in): begin first, as psycopg does.
        begin = not conn.autocommit and pgconn.transaction_status == _IDLE
        pgconn.send_query(b"BEGIN; " + text if begin else text)
        results: list[Any] = conn.wait(generators.execute(pgconn))
    return results[1:] if begin else results


def _bind(conn: psycopg.Connection[Any], session: _Session, values: list[Any]) -> tuple[
        tuple[str, ...], bytes]:
    """The types ``values`` are prepared with (as ``_type_of``), and the values as an
    ``EXECUTE``'s arguments: quoted by libpq (a string), written out (a number, None, a
    bool), else by psycopg."""
    types: list[str] = []
    literals: list[bytes] = []
    for value in values:
        kind = type(value)
        if value is None:
            types.append("unknown")
            literals.append(b"NULL")
            continue
        if kind is str:
            text = value.encode(session.encoding)
            if b"\x00" not in text:  # (a NUL: psycopg refuses it, saying why)
                types.append("unknown")
                literals.append(session.escaping.escape_literal(text))
                continue
        elif kind is int:
            types.append(_integer(value))
            literals.append(str(value).encode())
            continue
        elif kind is bool:
            types.append("boolean")
            literals.append(b"true" if value else b"false")
            continue
        elif kind is float and math.isfinite(value):
            types.append("double precision")
            literals.append(repr(value).encode())
            continue
        types.append(_type_of(value))
        literals.append(psycopg.ClientCursor(conn).mogrify("%s", (value,)).encode(
            session.encoding))
    return tuple(types), b", ".join(literals)


def forget(conn: psycopg.Connection[Any]) -> None:
    """Every statement prepared on ``conn`` is deallocated (with a ``ROLLBACK``)."""
    with _sessions_lock:
        _sessions.pop(conn.pgconn, None)


def _parameters(sql: str) -> tuple[str, ...]:
    """The names of ``sql``'s parameters, in the order each first comes.

    >>> _parameters("SELECT %(a)s, %(b)s, %(a)s, 5 %% 2")
    ('a', 'b')
    """
    names = _NAMES_OF.get(sql)
    if names is None:
        if len(_NAMES_OF) >= 4096:  # (statements built per call never pile up)
            _NAMES_OF.clear()
        names = _NAMES_OF[sql] = tuple(dict.fromkeys(_PARAMETER.findall(sql)))
    return names


#: ``_parameters``' answers, by statement: a thread may find one missing, and work it out.
_NAMES_OF: dict[str, tuple[str, ...]] = {}


def _prepare(sql: str, types: tuple[str, ...], names: tuple[str, ...]) -> tuple[_Prepared, str]:
    """``sql`` prepared under a new name (its name, and its ``EXECUTE`` up to the
    arguments, ``names`` in order), and its ``PREPARE``, with those ``types``.

    >>> (name, call), prepare = _prepare(
    ...     "SELECT %(a)s, %(b)s, %(a)s, 5 %% 2", ("smallint", "unknown"), ("a", "b"))
    >>> call == f"EXECUTE {name}(".encode()
    True
    >>> prepare == f"PREPARE {name} (smallint, unknown) AS SELECT $1, $2, $1, 5 % 2"
    True
    """
    number = {name: f"${i}" for i, name in enumerate(names, 1)}
    body = _PARAMETER.sub(lambda found: number[found[1]], sql).replace("%%", "%")
    name = f"memable_{next(_NAMES)}"
    if not names:
        return (name, f"EXECUTE {name}".encode()), f"PREPARE {name} AS {body}"
    return (name, f"EXECUTE {name}(".encode()), f"PREPARE {name} ({', '.join(types)}) AS {body}"


def _type_of(value: Any) -> str:
    """The type a parameter of this value is prepared with, as psycopg sends it."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return _integer(value)
    if isinstance(value, float):
        return "double precision"
    return "unknown"  # a string, None, a list (cast where it is used): as the server infers


def _integer(value: int) -> str:
    """The smallest integer type that holds ``value`` (numeric past bigint)."""
    for bound, name in _INTEGERS:
        if -bound <= value < bound:
            return name
    return "numeric"


#: The integer types, each with the bound of the values it holds.
_INTEGERS = ((1 << 15, "smallint"), (1 << 31, "integer"), (1 << 63, "bigint"))
