"""A PostgreSQL store's target, connections and tables: what opening one does.

The target is a libpq URL, named in messages by ``describe`` (never the password). Opening
connects at once (failing within the connect timeout), creates the schema and tables if
missing, and migrates an older store, all under a transaction-scoped advisory lock, so many
processes opening one new database run one migration between them. Every table is named
``memable_*``; the version lives in ``memable_schema`` (before version 11, unprefixed tables and
``schema_version``: renamed by the migration); a newer one is refused."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from .._errors import StorageError
from .._store.protocol import Synchronous
from .._store.sql.instances import CONCURRENCY_KEY_INDEX, TIMEOUTS_INDEX

#: The schema version this code writes. Older versions created PL/pgSQL functions
#: (``memable_claim``, ...); a store keeps them, unused.
SCHEMA_VERSION = 11
CONNECT_TIMEOUT = 10  # seconds, unless the URL's ``connect_timeout`` says
SCHEMES = ("postgresql://", "postgres://")
#: What a schema name may be: an identifier that needs no quoting but for its case.
_SCHEMA_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,62}")

#: Version 2 (SQLite 7): child instances know their parent; a parent counts its children.
_V2 = """
ALTER TABLE memable_instances ADD COLUMN IF NOT EXISTS parent_workflow text,
    ADD COLUMN IF NOT EXISTS parent_id text, ADD COLUMN IF NOT EXISTS parent_key text,
    ADD COLUMN IF NOT EXISTS parent_group text,
    ADD COLUMN IF NOT EXISTS children_pending integer;
CREATE INDEX IF NOT EXISTS instances_by_parent ON memable_instances (parent_workflow, parent_id)
    WHERE parent_id IS NOT NULL;
"""
#: Version 3 (SQLite 8): queues.
_V3 = """
ALTER TABLE memable_instances ADD COLUMN IF NOT EXISTS queue text,
    ADD COLUMN IF NOT EXISTS priority integer, ADD COLUMN IF NOT EXISTS queued_at text;
CREATE INDEX IF NOT EXISTS instances_by_queue
    ON memable_instances (queue, status, priority, queued_at) WHERE queue IS NOT NULL;
CREATE TABLE IF NOT EXISTS memable_queue_starts (
    queue text NOT NULL, at double precision NOT NULL);
CREATE INDEX IF NOT EXISTS queue_starts_by_queue ON memable_queue_starts (queue, at);
"""
#: Version 4 (SQLite 9): recoveries; what each engine declares it runs.
_V4 = """
ALTER TABLE memable_instances ADD COLUMN IF NOT EXISTS recoveries integer,
    ADD COLUMN IF NOT EXISTS lost_owner text, ADD COLUMN IF NOT EXISTS lost_step text;
ALTER TABLE memable_owners ADD COLUMN IF NOT EXISTS declares text;
"""
#: Version 5 (SQLite 10): schedules.
_V5 = """
ALTER TABLE memable_instances ADD COLUMN IF NOT EXISTS schedule text;
CREATE INDEX IF NOT EXISTS instances_by_schedule ON memable_instances (schedule, status)
    WHERE schedule IS NOT NULL;
CREATE TABLE IF NOT EXISTS memable_schedules (
    name text PRIMARY KEY, cron text NOT NULL, timezone text NOT NULL, workflow text NOT NULL,
    last_tick text, since text, skipped integer NOT NULL DEFAULT 0,
    missed integer NOT NULL DEFAULT 0);
"""
#: Version 6 (SQLite 11): trace context, and why an instance was claimed.
_V6 = """
ALTER TABLE memable_instances ADD COLUMN IF NOT EXISTS traceparent text,
    ADD COLUMN IF NOT EXISTS run_reason text;
"""
#: Version 7 (SQLite 12): indexes in a page's whole order, retention's index, queue states.
_V7 = """
CREATE INDEX IF NOT EXISTS instances_by_time
    ON memable_instances (created_at, workflow, instance_id);
CREATE INDEX IF NOT EXISTS instances_by_status_time
    ON memable_instances (status, created_at, workflow, instance_id);
CREATE INDEX IF NOT EXISTS instances_by_workflow_time
    ON memable_instances (workflow, created_at, instance_id);
CREATE INDEX IF NOT EXISTS instances_by_workflow_status
    ON memable_instances (workflow, status, created_at, instance_id);
DROP INDEX IF EXISTS instances_by_status;
DROP INDEX IF EXISTS instances_by_workflow;
CREATE INDEX IF NOT EXISTS instances_by_completed ON memable_instances (status, completed_at);
CREATE TABLE IF NOT EXISTS memable_queue_states (
    queue text PRIMARY KEY, paused integer NOT NULL DEFAULT 0, paused_at text);
"""
#: Version 8 (SQLite 13): workflow timeouts and per-key concurrency.
_V8 = f"""
ALTER TABLE memable_instances ADD COLUMN IF NOT EXISTS timeout double precision,
    ADD COLUMN IF NOT EXISTS timeout_at double precision,
    ADD COLUMN IF NOT EXISTS concurrency_key text;
{TIMEOUTS_INDEX};
{CONCURRENCY_KEY_INDEX};
"""
#: Version 9 (SQLite 14): whom the last recovery took an instance from.
_V9 = """
ALTER TABLE memable_instances ADD COLUMN IF NOT EXISTS lost_by text;
"""
#: Version 10 (SQLite 15): the creating call's token, by which a creation retried after its
#: answer was lost recognises its row.
_V10 = """
ALTER TABLE memable_instances ADD COLUMN IF NOT EXISTS created_by text;
"""
#: Version 11 (SQLite 16): every table ``memable_*``, the schema version's too (a store in a
#: schema the application shares). Run first on an older store: each table since its version.
_V11 = {"instances": 1, "steps": 1, "timers": 1, "owners": 1, "schema_version": 1,
        "queue_starts": 3, "schedules": 5, "queue_states": 7}
_TABLES = f"""
CREATE TABLE IF NOT EXISTS memable_instances (
    workflow text NOT NULL, instance_id text NOT NULL, status text NOT NULL, message text,
    input text NOT NULL, input_type text, output text, output_type text,
    created_at text NOT NULL, updated_at text NOT NULL, completed_at text,
    waiting_for text, owner text, status_message text, step_key text, step_started text,
    traceback text,
    PRIMARY KEY (workflow, instance_id));
{_V2}
{_V3}
CREATE INDEX IF NOT EXISTS instances_by_owner ON memable_instances (owner)
    WHERE owner IS NOT NULL;
CREATE TABLE IF NOT EXISTS memable_steps (
    workflow text NOT NULL, instance_id text NOT NULL, key text NOT NULL,
    seq integer NOT NULL, kind text NOT NULL, state text NOT NULL, result text,
    result_type text, status text, error text, attempts integer NOT NULL,
    completed_at text, started_at text, traceback text,
    PRIMARY KEY (workflow, instance_id, key));
CREATE TABLE IF NOT EXISTS memable_timers (
    workflow text NOT NULL, instance_id text NOT NULL, key text NOT NULL,
    deadline double precision NOT NULL,
    PRIMARY KEY (workflow, instance_id, key));
CREATE INDEX IF NOT EXISTS timers_by_deadline ON memable_timers (deadline);
CREATE TABLE IF NOT EXISTS memable_owners (
    id text PRIMARY KEY, host text NOT NULL, pid integer NOT NULL,
    heartbeat double precision NOT NULL, lease double precision NOT NULL,
    started_at text, boot_id text, pid_ns text, proc_start text);
CREATE TABLE IF NOT EXISTS memable_schema (version integer NOT NULL);
{_V4}
{_V5}
{_V6}
{_V7}
{_V8}
{_V9}
{_V10}
"""


def is_url(target: object) -> bool:
    """Whether ``target`` names a PostgreSQL server rather than a SQLite file.

    >>> is_url("postgresql://localhost/app"), is_url("postgres://h/db"), is_url("app.db")
    (True, True, False)
    """
    return isinstance(target, str) and target.startswith(SCHEMES)


def parse(url: str) -> dict[str, str]:
    """The URL's connection parameters; StorageError (naming no password) if malformed."""
    from psycopg.conninfo import conninfo_to_dict

    try:
        return {k: str(v) for k, v in conninfo_to_dict(url).items() if v is not None}
    except Exception as exc:  # psycopg.ProgrammingError: not a valid conninfo
        raise StorageError(f"not a valid PostgreSQL URL: {redact(str(exc), url)}") from None


def describe(params: dict[str, str]) -> str:
    """How messages name a server: the URL without its password.

    >>> describe({"user": "app", "password": "s3cret", "host": "db", "port": "5433",
    ...           "dbname": "prod"})
    'postgresql://app@db:5433/prod'
    >>> describe({"dbname": "test"})
    'postgresql://localhost:5432/test'
    """
    user = params.get("user")
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    return f"postgresql://{user + '@' if user else ''}{host}:{port}/{params.get('dbname', '')}"


def redact(text: str, url: str, params: dict[str, str] | None = None) -> str:
    """``text`` with the URL and its password blanked out.

    >>> redact("failed: postgresql://u:pw@h/d (pw)", "postgresql://u:pw@h/d",
    ...        {"password": "pw"})
    'failed: <url> (***)'
    """
    text = text.replace(url, "<url>")
    password = (params or {}).get("password")
    return text.replace(password, "***") if password else text


def channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel of the store in ``schema`` (an identifier, at most 63 bytes).

    >>> channel("memable")
    'memable_memable'
    >>> channel("x" * 63)
    'memable_75220b47218278e656f2013bb8f0c455'
    """
    name = f"memable_{schema}"
    if len(name.encode()) <= 63 and name.isidentifier() and name.isascii():
        return name
    return f"memable_{hashlib.sha256(schema.encode()).hexdigest()[:32]}"


def connect_kwargs(
    params: dict[str, str], synchronous: Synchronous, schema: str
) -> dict[str, Any]:
    """What every connection of the store is opened with (beyond the URL).

    No option names the schema (libpq reads ``options``' backslashes and spaces):
    ``session_sql`` sets it.

    >>> sorted(connect_kwargs({"dbname": "test"}, "full", "memable"))
    ['application_name', 'autocommit', 'connect_timeout']
    """
    kwargs: dict[str, Any] = {"autocommit": True}
    if "connect_timeout" not in params:
        kwargs["connect_timeout"] = CONNECT_TIMEOUT
    if "application_name" not in params:
        kwargs["application_name"] = "memable"
    return kwargs


def session_sql(synchronous: Synchronous, schema: str) -> str:
    """What each new connection of the store runs first, in autocommit mode: the schema, the
    durability, and READ COMMITTED whatever the defaults, which the store's statements
    assume (a queue's claim reads the queue after taking its lock, and must see a pause
    committed meanwhile).

    >>> for statement in session_sql("full", "Jobs_1").split("; "):
    ...     print(statement)
    SET search_path TO "Jobs_1"
    SET synchronous_commit TO on
    SET default_transaction_isolation TO 'read committed'
    >>> session_sql("normal", "memable").split("; ")[1]
    'SET synchronous_commit TO off'
    """
    level = "on" if synchronous == "full" else "off"
    return (f"SET search_path TO {quote_ident(schema)}; SET synchronous_commit TO {level}; "
            "SET default_transaction_isolation TO 'read committed'")


def quote_ident(name: str) -> str:
    """``name`` as a quoted SQL identifier.

    >>> quote_ident('my "odd" schema')
    '"my ""odd"" schema"'
    """
    return '"' + name.replace('"', '""') + '"'


def check_schema_name(schema: object) -> str:
    """A schema name: 1 to 63 ASCII letters, digits and ``_``, not starting with a digit, so
    two names are always two schemas; else ``ValueError`` (a non-str: ``TypeError``).

    >>> check_schema_name("Mixed_Case_1")
    'Mixed_Case_1'
    >>> check_schema_name("a b")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: schema must be 1 to 63 ASCII letters, digits and _, ..., not 'a b'
    """
    if not isinstance(schema, str):
        raise TypeError(f"schema must be a str, not {schema!r}")
    if _SCHEMA_NAME.fullmatch(schema) is None:
        raise ValueError("schema must be 1 to 63 ASCII letters, digits and _, not starting "
                         f"with a digit, not {schema!r}")
    return schema


def prepare(conn: Any, schema: str, where: str, *, create: bool) -> None:
    """Create or migrate the store's tables under an advisory lock; check its version.
    ``create=False``: a schema without a store is refused, nothing created."""
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
            (f"memable:{schema}",))
        first = [table for table, since in _V11.items() if since == 1]  # version 1's tables
        found = {name for (name,) in conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = %s AND tablename = ANY(%s)",
            (schema, ["memable_schema", *first]))}
        old = "memable_schema" not in found and set(first) <= found
        if "memable_schema" not in found and not old:
            if not create:
                raise StorageError(f"{where} has no memable store in schema {schema!r}")
            conn.execute(f"CREATE SCHEMA IF NOT EXISTS {quote_ident(schema)}")
            conn.execute(_TABLES)
            conn.execute("INSERT INTO memable_schema (version) VALUES (%s)", (SCHEMA_VERSION,))
            return
        row = conn.execute(
            f"SELECT max(version) FROM {'schema_version' if old else 'memable_schema'}").fetchone()
        version = int(row[0] or 0)
        if version > SCHEMA_VERSION:
            raise StorageError(
                f"{where} schema {schema!r} has memable schema version {version}, newer than "
                f"this memable understands ({SCHEMA_VERSION}); upgrade memable to open it")
        if version < SCHEMA_VERSION:  # migrate
            for table, since in _V11.items() if old else ():
                if version >= since:
                    new = "memable_schema" if table == "schema_version" else f"memable_{table}"
                    conn.execute(f"ALTER TABLE {table} RENAME TO {new}")
            for sql in (_V2, _V3, _V4, _V5, _V6, _V7, _V8, _V9, _V10):
                conn.execute(sql)
            conn.execute("UPDATE memable_schema SET version = %s", (SCHEMA_VERSION,))
