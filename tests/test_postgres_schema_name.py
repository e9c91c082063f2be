"""A PostgreSQL store's schema name: an identifier, checked at open, never a connection option.

The schema used to reach the server through libpq ``options``
(``-c search_path=...``), where a backslash is an escape and a space splits
arguments: schema ``a\\b`` was the store of schema ``ab``. Now a name is
ASCII letters, digits and ``_`` (not leading digit, at most 63 bytes), and
each connection sets its ``search_path`` by SQL, quoted as an identifier.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from conftest import POSTGRES_URL, postgres_or_skip
from helpers import build, query, stored_apart

from memable import Engine
from memable._postgres.connections import Connections
from memable._postgres.schema import quote_ident


@pytest.fixture
def schemas() -> Iterator[Callable[[str], str]]:
    """Names schemas for one test: ``base`` with a unique suffix (in place of its ``{u}``,
    else at its end); drops them afterwards (a name refused as it should be made none)."""
    postgres_or_skip()
    made: list[str] = []
    suffix = uuid.uuid4().hex[:10]

    def name(base: str) -> str:
        made.append(base.replace("{u}", suffix) if "{u}" in base else f"{base}{suffix}")
        return made[-1]

    yield name
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        for schema in made:
            if "\0" not in schema:  # the server holds no name with a NUL
                conn.execute(f"DROP SCHEMA IF EXISTS {quote_ident(schema)} CASCADE")


def _namespaces(like: str) -> list[str]:
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s ORDER BY 1", (like,)
        ).fetchall()
    return [row[0] for row in rows]


def _wf(ctx: Any, n: int) -> int:
    return n * 2


@pytest.mark.parametrize("template", [
    "a\\b{u}", "a b{u}", "1abc{u}", "ab-c{u}", "schéma{u}", "x" * 64, "", "a\0b{u}",
    'a"b{u}', "a.b{u}", "ab{u}\n",
])
def test_a_schema_that_is_not_a_plain_identifier_is_refused_at_open(
    template: str, schemas: Callable[[str], str]
) -> None:
    """Each name (made unique by ``{u}``) raises ValueError naming the argument."""
    schema = schemas(template) if "{u}" in template else template
    with pytest.raises(ValueError, match=r"^schema must be"):
        Engine.open(POSTGRES_URL, schema=schema)
    with pytest.raises(ValueError, match=r"^schema must be"):
        Engine.builder().schema(schema).open(POSTGRES_URL).build()


def test_63_bytes_is_the_longest_name(schemas: Callable[[str], str]) -> None:
    """A schema name of 63 bytes, PostgreSQL's limit, is accepted and created under exactly
    that name."""
    name = schemas("s" * 53)
    assert len(name) == 63
    Engine.open(POSTGRES_URL, schema=name).close()
    assert _namespaces(name) == [name]


def test_mixed_case_is_a_store_of_its_own(schemas: Callable[[str], str]) -> None:
    """A mixed-case schema name is quoted, not folded: it and the same name lowercased are
    two separate stores and two schemas."""
    upper = schemas("Mixed_Case_1_")
    lower = upper.lower()
    schemas("mixed_case_1_")  # the same name lowered: dropped afterwards too
    stored_apart(POSTGRES_URL, upper, lower)
    first = Engine.open(POSTGRES_URL, schema=upper)
    with first:
        assert first.get_metadata("double", "b") is None
        assert first.get_metadata("double", "a") is not None
    assert sorted(_namespaces(f"%{upper[-10:]}")) == sorted([upper, lower])


def test_no_connection_carries_the_schema_in_its_options(
    schemas: Callable[[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every connection the store opens (the opener's, the pool's, the listener's) is made
    without ``options`` and then has the schema, quoted, as its ``search_path``."""
    schema = schemas("Opt_")
    made: list[tuple[str, dict[str, Any], str]] = []
    real = psycopg.Connection.connect.__func__  # type: ignore[attr-defined]

    def recording(cls: Any, /, conninfo: str = "", **kwargs: Any) -> psycopg.Connection[Any]:
        conn: psycopg.Connection[Any] = real(cls, conninfo, **kwargs)
        made.append((conninfo, kwargs, conn.info.options))
        return conn

    # The pool connects through the class; the store's own connections through
    # psycopg.connect (bound to the class at import).
    monkeypatch.setattr(psycopg.Connection, "connect", classmethod(recording))
    monkeypatch.setattr(psycopg, "connect", lambda *args, **kwargs: recording(
        psycopg.Connection, *args, **kwargs))
    engine, store = build(POSTGRES_URL, schema=schema, synchronous="normal")
    engine.register("wf", _wf)
    with engine:
        assert engine.invoke("wf", 2).result(timeout=30) == 4
        # The listener's connection is its own: wait until it is made and listening.
        assert store._listener is not None  # type: ignore[attr-defined]
        assert store._listener.heard.wait(30)  # type: ignore[attr-defined]
        assert "options" not in store._db._kwargs  # type: ignore[attr-defined]
        assert "options" not in store._db._pool.kwargs  # type: ignore[attr-defined]
        assert query(engine, "SELECT current_setting('search_path')") == [(f'"{schema}"',)]
        assert query(engine, "SELECT current_setting('synchronous_commit')") == [("off",)]
        own = store._db.connect()  # type: ignore[attr-defined]
        try:
            settings = own.execute(
                "SELECT current_setting('search_path'), current_setting('synchronous_commit')"
            ).fetchone()
            assert settings == (f'"{schema}"', "off")
        finally:
            own.close()
    # The opener's, the test's own, the listener's and at least one of the pool's.
    assert len(made) >= 4
    for conninfo, kwargs, options in made:
        assert "options" not in kwargs
        assert "search_path" not in conninfo
        assert options == ""


def test_a_url_that_sets_a_search_path_does_not_move_the_store(
    schemas: Callable[[str], str],
) -> None:
    """The store's own SET comes after the URL's options: its tables stay in its schema."""
    schema = schemas("Url_")
    url = POSTGRES_URL + ("&" if "?" in POSTGRES_URL else "?") + "options=-csearch_path%3Dpublic"
    engine = Engine.open(url, schema=schema)
    engine.register("wf", _wf)
    with engine:
        assert engine.invoke("wf", 3, instance_id="u").result(timeout=30) == 6
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT status FROM {quote_ident(schema)}.memable_instances WHERE instance_id = 'u'"
        ).fetchone()
    assert row == ("completed",)


def test_ab_and_a_backslash_name_are_two_stores_even_below_the_name_check(
    schemas: Callable[[str], str],
) -> None:
    """``a\\b`` is refused at open; and were it to reach the connections (below the name
    check), its tables would still be its own schema's, not ``ab``'s."""
    plain = schemas("ab_")
    odd = plain.replace("ab_", "a\\b_")
    schemas("a\\b_")  # dropped afterwards too
    with pytest.raises(ValueError, match="schema"):
        Engine.open(POSTGRES_URL, schema=odd)
    engine = Engine.open(POSTGRES_URL, schema=plain)
    engine.register("wf", _wf)
    with engine:
        assert engine.invoke("wf", 5, instance_id="in-ab").result(timeout=30) == 10
    below = Connections(POSTGRES_URL, "full", odd, create=True, pool_size=2)
    try:
        path = below.run(
            "read the search path",
            lambda conn: conn.execute("SELECT current_setting('search_path')").fetchone(),
            transaction=False,
        )
        assert path == (quote_ident(odd),)
        found = below.run(
            "read the instances",
            lambda conn: conn.execute("SELECT instance_id FROM memable_instances").fetchall(),
            transaction=False,
        )
        assert found == []  # not ab's instance
    finally:
        below.close()
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_schema, count(*) FROM information_schema.tables "
            "WHERE table_schema IN (%s, %s) GROUP BY table_schema ORDER BY 1",
            (plain, odd),
        ).fetchall()
        ab_rows = conn.execute(
            f"SELECT instance_id FROM {quote_ident(plain)}.memable_instances"
        ).fetchall()
    assert sorted(tables) == sorted([(plain, 8), (odd, 8)])
    assert ab_rows == [("in-ab",)]
