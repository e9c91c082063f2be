"""Several statements in one round trip to the server: one text, each statement planned
once per connection.

Every statement of a store's transaction goes through ``send`` (an operation
of one statement goes through psycopg, which prepares it itself). Those that
need no answer between them (a transaction's ``BEGIN`` and first reads; its
last writes, NOTIFYs and ``COMMIT``) go to the server as one text (the simple
query protocol: one message out, one answer read, however many statements),
where psycopg's pipeline mode costs a round of its own Python per statement
(measured: a claim's CPU here fell from about 400 µs to 270).

On the store's own connections (``connections.Connection``: ``prepares``), a
statement with named parameters is prepared the first time it goes there
(``PREPARE``, in the same text) and run by name after (``EXECUTE``), so the
server plans it once per connection (the ``PREPARED`` used last are kept),
not once per call. Its parameters are bound into the text by psycopg
(``ClientCursor.mogrify``: quoted as the connection needs), and typed as
psycopg types them when it sends them itself: a string or None as
``unknown`` (the server infers the type from where it is used), a number or
a bool as what it is.

A text that failed may have prepared some of its statements: they are
prepared again under new names (the old ones stay unused). A rollback
deallocates every statement of its connection and ``forget``s them
(``connections``): psycopg does so after a ``ROLLBACK`` anyway, once it
prepared any itself.
"""

from __future__ import annotations

import itertools
import re
import threading
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

import psycopg

#: A statement's parameters: by name (prepared), by position (bound each time), or none.
Parameters = Mapping[str, Any] | Sequence[Any] | None
#: A statement and its parameters.
Statement = tuple[str, Parameters]

#: How many statements one connection keeps prepared: past that, the one used longest
#: ago is deallocated, so statements built per call (a purge's ``IN`` list, an
#: operator's filter) never pile up on the server.
PREPARED = 256
#: The names of statements prepared, unique in this process.
_NAMES = itertools.count(1)
#: ``%(name)s``, a named parameter as a spelled statement writes it.
_PARAMETER = re.compile(r"%\((\w+)\)s")
_ROWS = psycopg.pq.ExecStatus.TUPLES_OK

#: A statement prepared on a connection: its name, and the ``EXECUTE`` that runs it.
_Prepared = tuple[str, str]
# _prepared_lock guards _prepared: per libpq connection (the same under any wrapper of
# it), the statements prepared there, by text and parameters' types. Each inner dict
# is used by the one thread that holds its connection.
_prepared_lock = threading.Lock()
_prepared: weakref.WeakKeyDictionary[Any, dict[tuple[str, tuple[str, ...]], _Prepared]] = (
    weakref.WeakKeyDictionary())


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


def send(conn: psycopg.Connection[Any], statements: list[Statement]) -> list[Read]:
    """Run ``statements`` on ``conn`` as one text, in one round trip; what each read, in
    order. The first that fails raises (those after it do not run)."""
    # Only on the store's own connections, whose ROLLBACKs forget what was prepared.
    ours = getattr(conn, "prepares", False)
    with _prepared_lock:
        prepared = _prepared.get(conn.pgconn)
        if prepared is None:
            prepared = _prepared[conn.pgconn] = {}
    binder: psycopg.ClientCursor[Any] | None = None
    # The text's statements, each with whether its result is one of ``statements``'
    # (not a PREPARE or a DEALLOCATE added here).
    parts: list[tuple[str, bool]] = []
    made: dict[tuple[str, tuple[str, ...]], _Prepared] = {}
    for sql, params in statements:
        if params is None:
            parts.append((sql, True))
            continue
        if isinstance(params, Mapping) and ours:
            names = _parameters(sql)
            # Prepared again for other types: an int too large for the type it had first.
            key = (sql, tuple(_type_of(params[name]) for name in names))
            found = prepared.pop(key, None) or made.get(key)
            if found is None:
                if len(prepared) >= PREPARED:  # the statement used longest ago goes
                    parts.append((f"DEALLOCATE {prepared.pop(next(iter(prepared)))[0]}", False))
                found, prepare = _prepare(*key, names)
                parts.append((prepare, False))
                made[key] = found
            else:
                prepared[key] = found  # (the last used go last)
            sql = found[1]
        binder = binder or psycopg.ClientCursor(conn)
        parts.append((binder.mogrify(sql, params), True))
    # No parameters, never prepared by psycopg: the simple query protocol, one message.
    cursor = conn.execute("; ".join(text for text, _ in parts), prepare=False)
    prepared.update(made)
    reads = []
    for _, answers in parts:  # one result per statement, in order
        result = cursor.pgresult
        if answers:
            rows = cursor.fetchall() if result is not None and result.status == _ROWS else []
            reads.append(Read(result, cursor.rowcount, rows))
        cursor.nextset()
    return reads


def forget(conn: psycopg.Connection[Any]) -> None:
    """Every statement prepared on ``conn`` is deallocated (with a ``ROLLBACK``)."""
    with _prepared_lock:
        _prepared.pop(conn.pgconn, None)


def rows_of(cursor: psycopg.Cursor[Any]) -> list[Any]:
    """The rows of the statement ``cursor`` is at: none for one that reads none."""
    # (Asked of the result, not of ``description``: that builds every column's record.)
    result = cursor.pgresult
    return cursor.fetchall() if result is not None and result.status == _ROWS else []


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


def _prepare(sql: str, types: tuple[str, ...], names: tuple[str, ...]) -> tuple[
        _Prepared, str]:
    """``sql`` prepared under a new name (its name and ``EXECUTE``, its parameters
    ``names`` as arguments), and its ``PREPARE``, with those ``types``.

    >>> (name, call), prepare = _prepare(
    ...     "SELECT %(a)s, %(b)s, %(a)s, 5 %% 2", ("smallint", "unknown"), ("a", "b"))
    >>> call == f"EXECUTE {name}(%(a)s, %(b)s)"
    True
    >>> prepare == f"PREPARE {name} (smallint, unknown) AS SELECT $1, $2, $1, 5 % 2"
    True
    """
    number = {name: f"${i}" for i, name in enumerate(names, 1)}
    body = _PARAMETER.sub(lambda found: number[found[1]], sql).replace("%%", "%")
    name = f"memable_{next(_NAMES)}"
    if not names:
        return (name, f"EXECUTE {name}"), f"PREPARE {name} AS {body}"
    arguments = ", ".join(f"%({key})s" for key in names)
    return ((name, f"EXECUTE {name}({arguments})"),
            f"PREPARE {name} ({', '.join(types)}) AS {body}")


def _type_of(value: Any) -> str:
    """The type a parameter of this value is prepared with: as psycopg sends it (an int
    as the smallest integer type that holds it)."""
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        for bound, name in _INTEGERS:
            if -bound <= value < bound:
                return name
        return "numeric"
    if isinstance(value, float):
        return "double precision"
    return "unknown"  # a string, None, a list (cast where it is used): as the server infers


#: The integer types, each with the bound of the values it holds.
_INTEGERS = ((1 << 15, "smallint"), (1 << 31, "integer"), (1 << 63, "bigint"))
