"""A SQLite store in the application's own database file (SPEC Part 3, "Sharing a database").

memable's tables are ``memable_*`` and its schema version lives in ``memable_schema``: the
application's tables, their rows, their schema and its ``PRAGMA user_version`` stay as the
application left them through every memable operation. A file an earlier memable made
(unprefixed tables, the version in ``user_version``) is migrated by renaming its tables."""

from __future__ import annotations

import hashlib
import logging
import sqlite3
from collections.abc import Callable
from contextlib import closing
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conftest import POSTGRES_URL
from helpers import earlier_sqlite_store

from memable import Completed, Context, Engine, StorageError, Suspended
from memable._sqlite.schema import SCHEMA_VERSION

DJANGO = """
CREATE TABLE "django_migrations" ("id" integer NOT NULL PRIMARY KEY AUTOINCREMENT,
    "app" varchar(255) NOT NULL, "name" varchar(255) NOT NULL, "applied" datetime NOT NULL);
CREATE TABLE "auth_user" ("id" integer NOT NULL PRIMARY KEY AUTOINCREMENT,
    "password" varchar(128) NOT NULL, "last_login" datetime NULL, "is_superuser" bool NOT NULL,
    "username" varchar(150) NOT NULL UNIQUE, "email" varchar(254) NOT NULL,
    "is_staff" bool NOT NULL, "is_active" bool NOT NULL, "date_joined" datetime NOT NULL);
CREATE TABLE "django_session" ("session_key" varchar(40) NOT NULL PRIMARY KEY,
    "session_data" text NOT NULL, "expire_date" datetime NOT NULL);
CREATE INDEX "django_session_expire_date_a5c62663" ON "django_session" ("expire_date");
INSERT INTO django_migrations (app, name, applied) VALUES
    ('contenttypes', '0001_initial', '2026-01-01 00:00:00'),
    ('auth', '0001_initial', '2026-01-01 00:00:01'),
    ('sessions', '0001_initial', '2026-01-01 00:00:02');
INSERT INTO auth_user (password, is_superuser, username, email, is_staff, is_active,
    date_joined) VALUES
    ('pbkdf2_sha256$x', 1, 'admin', 'admin@example.com', 1, 1, '2026-01-01 00:00:00'),
    ('pbkdf2_sha256$y', 0, 'ada', 'ada@example.com', 0, 1, '2026-01-02 00:00:00');
INSERT INTO django_session VALUES ('k1', 'e30:1', '2026-02-01 00:00:00');
PRAGMA user_version = 7;
"""
FLASK = """
CREATE TABLE user (id INTEGER NOT NULL, name VARCHAR(80) NOT NULL, PRIMARY KEY (id),
    UNIQUE (name));
CREATE TABLE "order" (id INTEGER NOT NULL, user_id INTEGER NOT NULL, total NUMERIC(10, 2),
    PRIMARY KEY (id), FOREIGN KEY(user_id) REFERENCES user (id));
CREATE INDEX ix_order_user_id ON "order" (user_id);
INSERT INTO user (name) VALUES ('ada'), ('grace');
INSERT INTO "order" (user_id, total) VALUES (1, 9.5), (1, 12), (2, 3.25);
"""
APPS = {"django": DJANGO, "flask": FLASK}


def make_app(path: Path, script: str) -> None:
    """The application creates its tables (and rows, and maybe its user_version) in ``path``."""
    with closing(sqlite3.connect(path)) as conn:
        conn.executescript(script)
        conn.commit()


def app_state(path: Path, skip: frozenset[str] = frozenset()
              ) -> tuple[int, list[tuple[Any, ...]], dict[str, list[Any]]]:
    """What the application sees of the file: its ``user_version``, its schema (every
    ``sqlite_master`` row not of a ``memable_*`` table, nor of a table in ``skip``) and every
    row of its tables."""
    with closing(sqlite3.connect(path)) as conn:
        schema = [row for row in conn.execute(
            "SELECT type, name, tbl_name, sql FROM sqlite_master "
            "WHERE tbl_name NOT LIKE 'memable!_%' ESCAPE '!' ORDER BY type, name")
            if row[2] not in skip]
        rows = {name: sorted(conn.execute(f'SELECT * FROM "{name}"').fetchall(), key=repr)
                for kind, name, _, _ in schema if kind == "table"}
        return int(conn.execute("PRAGMA user_version").fetchone()[0]), schema, rows


def memable_tables(path: Path) -> set[str]:
    with closing(sqlite3.connect(path)) as conn:
        return {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name LIKE 'memable%'")}


def order(ctx: Context, n: int) -> dict[str, Any]:
    """A workflow with a step, a timer and a signal."""
    priced = ctx.step("price").run(lambda: n * 2)
    ctx.timer("cool-off", 0.01)
    return {"priced": priced, "approved": ctx.suspend("approve")}


def exercise(path: Path, check: Callable[[], None]) -> None:
    """Every memable operation on ``path``, calling ``check`` before and after each."""
    check()
    engine = Engine.open(path, retention=timedelta(days=1))
    check()
    engine.register("order", order)
    try:
        with engine:
            done = engine.invoke("order", 1, instance_id="a")
            check()
            engine.signal("order", "a", "approve", True)
            assert done.result(timeout=10) == {"priced": 2, "approved": True}
            check()
            dropped = engine.invoke("order", 2, instance_id="b")
            assert isinstance(dropped.wait(timeout=10), Suspended)
            engine.cancel("order", "b")
            check()
            assert engine.purge(older_than=0) == 2
            check()
    finally:
        engine.close()
    check()
    again = Engine.open(path)
    try:
        check()
        assert again.list_instances("order") == []
    finally:
        again.close()
    check()


@pytest.mark.parametrize("app", sorted(APPS))
def test_an_app_database_made_before_keeps_its_tables_through_every_operation(
    tmp_path: Path, app: str
) -> None:
    """An application's database (made before memable first opens it) is opened, memable's
    tables are made beside the application's, and open, invoke, a step, a timer, a signal, a
    cancel, a purge, closing and reopening leave the application's schema, rows and
    user_version as they were."""
    path = tmp_path / "app.db"
    make_app(path, APPS[app])
    before = app_state(path)

    exercise(path, lambda: assert_unchanged(path, before))

    assert "memable_instances" in memable_tables(path)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT version FROM memable_schema").fetchall() == [
            (SCHEMA_VERSION,)]
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)


def assert_unchanged(path: Path, before: tuple[Any, ...]) -> None:
    assert app_state(path) == before


@pytest.mark.parametrize("app", sorted(APPS))
def test_an_app_that_makes_its_tables_in_a_memable_file_keeps_them(
    tmp_path: Path, app: str
) -> None:
    """The application creates its tables (and sets its user_version) in a file memable made;
    every memable operation afterwards leaves them, their rows and user_version as they
    were."""
    path = tmp_path / "app.db"
    Engine.open(path).close()
    make_app(path, APPS[app])
    before = app_state(path)
    assert before[0] == (7 if app == "django" else 0)

    exercise(path, lambda: assert_unchanged(path, before))


def test_an_app_table_named_like_an_old_memable_table_is_the_apps(tmp_path: Path) -> None:
    """Tables ``instances`` and ``steps`` of the application's own (not memable's columns),
    with a user_version of 3, are not taken for an earlier memable's store: they stay as they
    are, and memable's tables are made beside them."""
    path = tmp_path / "app.db"
    make_app(path, """
        CREATE TABLE instances (id INTEGER PRIMARY KEY, host TEXT);
        CREATE TABLE steps (id INTEGER PRIMARY KEY, instance INTEGER, what TEXT);
        INSERT INTO instances (host) VALUES ('web-1');
        INSERT INTO steps (instance, what) VALUES (1, 'deploy');
        PRAGMA user_version = 3;
    """)
    before = app_state(path)
    exercise(path, lambda: assert_unchanged(path, before))
    assert {"memable_instances", "memable_steps"} <= memable_tables(path)


def _as_version_15(path: Path) -> None:
    """Leave the (closed) store at ``path`` as memable's schema 15 had it: the same tables
    unprefixed, the version in ``user_version``, no ``memable_schema``."""
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("DROP TABLE memable_schema")
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                    "AND name LIKE 'memable!_%' ESCAPE '!'").fetchall():
            conn.execute(f"ALTER TABLE {name} RENAME TO {name.removeprefix('memable_')}")
        conn.execute("PRAGMA user_version = 15")


def test_a_file_of_schema_15_is_migrated_by_renaming_and_its_instances_go_on(
    tmp_path: Path,
) -> None:
    """A store an earlier memable made (schema 15: unprefixed tables, the version in
    user_version) opens with its tables renamed ``memable_*``, the version in
    ``memable_schema`` and user_version back to 0; a suspended instance keeps its completed
    step (not run again) and completes when signalled."""
    path = tmp_path / "v15.db"
    calls: list[int] = []

    def priced(ctx: Context, n: int) -> dict[str, Any]:
        price = ctx.step("price").run(lambda: calls.append(n) or n * 2)
        return {"priced": price, "approved": ctx.suspend("approve")}

    engine = Engine.open(path)
    engine.register("priced", priced)
    with engine:
        assert isinstance(engine.invoke("priced", 4, instance_id="old").wait(timeout=10),
                          Suspended)
    engine.close()
    _as_version_15(path)
    assert memable_tables(path) == set()

    engine = Engine.open(path)
    engine.register("priced", priced)
    try:
        [price, *_] = engine.steps("priced", "old")
        assert (price.key, price.state, price.result) == ("price", "completed", 8)
        with engine:
            engine.signal("priced", "old", "approve", "yes")
            assert engine.invocation("priced", "old").result(timeout=10) == {
                "priced": 8, "approved": "yes"}
    finally:
        engine.close()
    assert calls == [4]
    assert memable_tables(path) == {
        "memable_instances", "memable_steps", "memable_timers", "memable_owners",
        "memable_queue_starts", "memable_schedules", "memable_queue_states", "memable_schema"}
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone() == (0,)
        assert conn.execute("SELECT version FROM memable_schema").fetchall() == [
            (SCHEMA_VERSION,)]
        tables = {name for (name,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert tables == memable_tables(path)


def test_an_old_file_holding_app_tables_is_migrated_but_never_vacuumed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A file of schema 11 (no incremental auto-vacuum yet) to which the application added its
    tables is migrated, but not switched by a VACUUM, which would rewrite the application's
    tables too: an INFO says so, once, and the application's tables and rows stay."""
    path = tmp_path / "v11.db"
    with closing(sqlite3.connect(path, isolation_level=None)) as conn:
        earlier_sqlite_store(conn, 11)
    make_app(path, FLASK)
    old = frozenset(("instances", "steps", "timers", "owners", "queue_starts", "schedules",
                     "queue_states"))
    user_version, schema, rows = app_state(path, skip=old)
    assert user_version == 11  # memable's, not the application's
    assert sorted(rows) == ["order", "user"]

    caplog.set_level(logging.INFO, logger="memable")
    engine = Engine.open(path)
    engine.register("order", order)
    try:
        with engine:
            engine.signal("order", engine.invoke("order", 3).instance_id, "approve", False)
    finally:
        engine.close()
    Engine.open(path).close()

    assert app_state(path) == (0, schema, rows)
    skipped = [r.getMessage() for r in caplog.records if "not switching" in r.getMessage()]
    assert len(skipped) == 1
    assert "order, user" in skipped[0]
    assert not any("VACUUM took" in r.getMessage() for r in caplog.records)
    with closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA auto_vacuum").fetchone() == (0,)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_newer_store_in_an_app_database_is_refused_and_left_byte_for_byte(
    tmp_path: Path,
) -> None:
    """A file whose memable tables have a newer schema version than this memable is refused
    with StorageError naming the file, and neither it nor its directory changes."""
    path = tmp_path / "app.db"
    make_app(path, DJANGO)
    Engine.open(path).close()
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("UPDATE memable_schema SET version = ?", (SCHEMA_VERSION + 1,))
        conn.commit()
    digest, files = _digest(path), sorted(p.name for p in tmp_path.iterdir())

    with pytest.raises(StorageError, match="newer than this memable") as refused:
        Engine.open(path)

    assert str(path) in str(refused.value)
    assert _digest(path) == digest
    assert sorted(p.name for p in tmp_path.iterdir()) == files


def test_a_postgres_store_in_a_schema_with_app_tables_leaves_them_alone(pg_schema: str) -> None:
    """In a schema already holding the application's ``instances`` and ``schema_version``
    tables, memable makes its ``memable_*`` tables beside them (not taking them for an
    earlier store's) and runs a workflow; the application's rows stay."""
    import psycopg

    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{pg_schema}"')
        conn.execute(f'SET search_path TO "{pg_schema}"')
        conn.execute("CREATE TABLE instances (id serial PRIMARY KEY, host text)")
        conn.execute("CREATE TABLE schema_version (version integer NOT NULL)")
        conn.execute("INSERT INTO instances (host) VALUES ('web-1')")
        conn.execute("INSERT INTO schema_version VALUES (42)")
    engine = Engine.open(POSTGRES_URL, schema=pg_schema)
    engine.register("one", lambda ctx, n: ctx.step("s").run(lambda: n + 1))
    try:
        with engine:
            assert engine.invoke("one", 1).wait(timeout=10) == Completed()
    finally:
        engine.close()
    with psycopg.connect(POSTGRES_URL) as conn:
        conn.execute(f'SET search_path TO "{pg_schema}"')
        assert conn.execute("SELECT id, host FROM instances").fetchall() == [(1, "web-1")]
        assert conn.execute("SELECT version FROM schema_version").fetchall() == [(42,)]
        assert conn.execute("SELECT count(*) FROM memable_instances").fetchone() == (1,)
