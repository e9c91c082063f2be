"""How a PostgreSQL store's statements reach the server (``memable._postgres.batch``):
several in one text, answered in order, their parameters arriving as sent, each
prepared once per connection, and no more kept prepared than ``PREPARED``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from conftest import POSTGRES_URL, postgres_or_skip

from memable._postgres import batch
from memable._postgres.connections import Connection, _roll_back


@pytest.fixture
def conn() -> Iterator[psycopg.Connection[Any]]:
    """A connection as the store opens its own (``connections.Connection``): autocommit,
    the store preparing its statements on it."""
    postgres_or_skip()
    with Connection.connect(POSTGRES_URL, autocommit=True) as conn:
        yield conn


def _prepared(conn: psycopg.Connection[Any]) -> list[str]:
    """What the statements prepared on ``conn`` run (the server keeps the whole text
    each was prepared by)."""
    rows = conn.execute("SELECT name, statement FROM pg_prepared_statements")
    return sorted(re.search(rf"PREPARE {name} \([^)]*\) AS (.*?)(?:; EXECUTE|$)", text)[1]
                  for name, text in rows)


def test_a_text_of_several_statements_answers_each_in_order(
    conn: psycopg.Connection[Any],
) -> None:
    """Each statement's rows (none for one that reads none) and count, in order; the
    statements the text adds to prepare them answer nothing."""
    conn.execute("CREATE TEMP TABLE t (id int PRIMARY KEY)")
    reads = batch.send(conn, [
        ("BEGIN", None),
        ("INSERT INTO t SELECT generate_series(1, %(n)s)", {"n": 3}),
        ("SELECT id FROM t WHERE id >= %(low)s ORDER BY id", {"low": 2}),
        ("SELECT %s::text", ("positional",)),
        ("COMMIT", None),
    ])
    assert [read.rows for read in reads] == [[], [], [(2,), (3,)], [("positional",)], []]
    assert reads[1].rowcount == 3
    assert reads[1].description is None
    assert reads[2].description == [("id",)]
    assert reads[2].fetchone() == (2,)


@pytest.mark.parametrize("value", [
    "it's", "back\\slash", "x'); DROP TABLE t; --", "100%", "%(n)s", "naïve ✓", "", None,
    "line\nbreak",
])
def test_a_string_parameter_arrives_as_sent(conn: psycopg.Connection[Any], value: Any) -> None:
    """Bound into the text, a string arrives unchanged, whatever it holds: quotes,
    backslashes, statement separators, placeholders, anything but a NUL."""
    for _ in range(2):  # prepared, then run by name
        assert batch.send(conn, [("SELECT %(v)s::text", {"v": value})])[0].rows == [(value,)]


def test_numbers_and_lists_arrive_as_sent(conn: psycopg.Connection[Any]) -> None:
    """A number keeps its type where the statement gives it none; a list arrives as an
    array; a parameter prepared from a None takes a value the next time."""
    sql = "SELECT %(i)s, %(f)s, %(b)s, %(items)s::text[], %(maybe)s::bigint"
    first = {"i": 7, "f": 0.5, "b": True, "items": ["a", "b'c"], "maybe": None}
    then = {"i": -(2**40), "f": -1e-9, "b": False, "items": [], "maybe": 3}
    last = {"i": 2**70, "f": float("-inf"), "b": True, "items": ["\\"], "maybe": -1}
    assert batch.send(conn, [(sql, first)])[0].rows == [(7, 0.5, True, ["a", "b'c"], None)]
    assert batch.send(conn, [(sql, then)])[0].rows == [(-(2**40), -1e-9, False, [], 3)]
    assert batch.send(conn, [(sql, last)])[0].rows == [
        (2**70, float("-inf"), True, ["\\"], -1)]


def test_a_statement_is_prepared_once_per_connection(conn: psycopg.Connection[Any]) -> None:
    """Sent again (alone, or twice in one text), it runs by name: the server plans it
    once. A ROLLBACK the server sees alone leaves it prepared."""
    sql = "SELECT %(a)s::int + 1"
    assert batch.send(conn, [(sql, {"a": 1}), (sql, {"a": 2})])[1].rows == [(3,)]
    batch.send(conn, [("BEGIN", None), (sql, {"a": 3}), ("ROLLBACK", None)])
    assert batch.send(conn, [(sql, {"a": 4})])[0].rows == [(5,)]
    assert _prepared(conn) == ["SELECT $1::int + 1"]


def test_on_a_connection_not_the_stores_nothing_is_prepared() -> None:
    """On a connection of another (an application's: its ROLLBACKs are not the store's
    to see) each statement is bound and planned each time."""
    postgres_or_skip()
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        for a in range(3):
            assert batch.send(conn, [("SELECT %(a)s::int", {"a": a})])[0].rows == [(a,)]
        assert _prepared(conn) == []


def test_on_a_connection_not_in_autocommit_a_statement_is_in_its_transaction() -> None:
    """As psycopg does, a statement sent on an idle connection that is not in autocommit
    begins a transaction, which the connection's holder ends: rolled back, its write is
    gone; a second statement runs in the same transaction."""
    postgres_or_skip()
    with psycopg.connect(POSTGRES_URL) as conn:
        batch.send(conn, [("CREATE TEMP TABLE kept (id int)", None)])
        conn.commit()
        batch.send(conn, [("INSERT INTO kept VALUES (%(a)s)", {"a": 1})])
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        assert batch.send(conn, [("SELECT count(*) FROM kept", None)])[0].rows == [(1,)]
        conn.rollback()
        assert batch.send(conn, [("SELECT count(*) FROM kept", None)])[0].rows == [(0,)]


def test_a_rollback_deallocates_and_forgets_what_was_prepared(
    conn: psycopg.Connection[Any],
) -> None:
    """psycopg deallocates every prepared statement of a connection after a ROLLBACK,
    once it prepared any itself: the store's rollback deallocates them all, and the
    next text prepares its statements again."""
    for _ in range(6):  # psycopg prepares a statement it ran 5 times
        conn.execute("SELECT %s::int", (1,))
    sql = "SELECT %(a)s::int * 2"
    batch.send(conn, [("BEGIN", None), (sql, {"a": 1})])
    _roll_back(conn)  # type: ignore[arg-type]
    assert _prepared(conn) == []
    assert batch.send(conn, [(sql, {"a": 4})])[0].rows == [(8,)]


def test_the_statements_used_longest_ago_are_deallocated(
    conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past ``PREPARED`` statements, the one used longest ago goes; sent again, it is
    prepared again."""
    monkeypatch.setattr(batch, "PREPARED", 2)
    one, two, three = "SELECT 1 + %(a)s::int", "SELECT 2 + %(a)s::int", "SELECT 3 + %(a)s::int"
    for sql in (one, two, one, three):  # two is used longest ago when three comes
        batch.send(conn, [(sql, {"a": 0})])
    assert _prepared(conn) == ["SELECT 1 + $1::int", "SELECT 3 + $1::int"]
    assert batch.send(conn, [(two, {"a": 10})])[0].rows == [(12,)]
    assert _prepared(conn) == ["SELECT 2 + $1::int", "SELECT 3 + $1::int"]


def test_a_text_that_fails_prepares_its_statements_again(
    conn: psycopg.Connection[Any],
) -> None:
    """A statement prepared by a text that then failed is prepared anew (under another
    name) the next time: nothing refers to a name that may not exist."""
    sql = "SELECT 10 / %(d)s::int"
    with pytest.raises(psycopg.errors.DivisionByZero):
        batch.send(conn, [(sql, {"d": 0})])
    assert batch.send(conn, [(sql, {"d": 5})])[0].rows == [(2,)]
    with pytest.raises(psycopg.errors.UndefinedTable):  # (its PREPARE never ran)
        batch.send(conn, [("SELECT * FROM nowhere", None), ("SELECT 20 / %(d)s::int", {"d": 1})])
    assert batch.send(conn, [("SELECT 20 / %(d)s::int", {"d": 4})])[0].rows == [(5,)]
