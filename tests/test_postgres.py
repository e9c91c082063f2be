"""What only the PostgreSQL store has: URLs, schemas, opening, secrets, many openers at once.

The engine's behaviour on PostgreSQL is the whole suite's (``make_engine`` runs
every engine test on it too); these are the store's own rules (SPEC Part 2,
"Stores"). They run against the server ``conftest.POSTGRES_URL`` names.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import psycopg
import pytest
from conftest import POSTGRES_URL
from helpers import Looks, build, cli, engine_on, stored_apart
from psycopg.conninfo import make_conninfo

from memable import Completed, Context, Engine, StorageError
from memable._clock import Clock
from memable._postgres.listener import Listener
from memable._postgres.schema import SCHEMA_VERSION, parse
from memable._postgres.store import PostgresStore
from memable._run.options import Options
from memable._sqlite.store import SQLiteStore
from memable._store.control import LostInstance
from memable._store.protocol import InstanceRow, RunSnapshot, StepWrite
from memable._store.rows import UNREACHED
from memable._store.sql import queues as queue_sql
from memable._store.transaction import POSTGRESQL


def _with_password(url: str, password: str) -> str:
    """``url`` with its user given ``password`` (trust authentication ignores it)."""
    params = parse(url)
    user = params.get("user", "postgres")
    host, port = params.get("host", "127.0.0.1"), params.get("port", "5432")
    return f"postgresql://{user}:{password}@{host}:{port}/{params.get('dbname', 'test')}"


@pytest.fixture
def other_schema() -> Iterator[str]:
    """A second fresh schema, dropped afterwards."""
    name = f"test_other_{time.monotonic_ns()}"
    yield name
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def _application_names() -> set[str]:
    """The application_name of every connection to the test database."""
    with psycopg.connect(POSTGRES_URL) as conn:
        return {name for (name,) in conn.execute(
            "SELECT application_name FROM pg_stat_activity WHERE datname = current_database()"
        )}


def _one_step(ctx: Context, n: int) -> int:
    return ctx.step("double").run(lambda: n * 2)


def test_an_unreachable_server_raises_naming_host_and_port_without_the_password() -> None:
    """Nothing listens on port 1: StorageError at once (well within the connect timeout),
    naming host and port; the password appears nowhere."""
    url = "postgresql://app:s3cr3t-pw@127.0.0.1:1/prod?connect_timeout=5"
    started = time.monotonic()
    with pytest.raises(StorageError) as raised:
        Engine.open(url)
    assert time.monotonic() - started < 5
    message = str(raised.value)
    assert "postgresql://app@127.0.0.1:1/prod" in message
    assert "s3cr3t-pw" not in message
    assert "s3cr3t-pw" not in repr(raised.value)
    # Not chained to the driver's error either (a traceback prints the chain).
    assert raised.value.__cause__ is None
    assert raised.value.__suppress_context__


def test_import_memable_does_not_import_psycopg() -> None:
    """``import memable`` in a fresh interpreter imports neither ``psycopg`` nor
    ``psycopg_pool``: they are needed only for a PostgreSQL store."""
    code = "import sys, memable; print('psycopg' in sys.modules, 'psycopg_pool' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_a_url_without_the_extra_installed_names_the_extra() -> None:
    """psycopg missing (hidden here): StorageError saying which extra to install."""
    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "from memable import Engine, StorageError\n"
        "try:\n"
        "    Engine.open('postgresql://127.0.0.1/test')\n"
        "except StorageError as err:\n"
        "    print(err)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "memable-engine[postgres]" in out.stdout


@pytest.mark.parametrize(("schema", "error"), [
    ("", ValueError), ("x" * 64, ValueError), ("a\0b", ValueError), (7, TypeError),
])
def test_a_bad_schema_name_is_refused_before_connecting(schema: Any, error: type) -> None:
    """An empty, over-long, NUL-holding or non-str schema name is refused before any
    connection is tried (the URL points at a closed port)."""
    with pytest.raises(error, match="schema"):
        Engine.open("postgresql://nobody@127.0.0.1:1/none", schema=schema)


def test_a_schema_with_a_sqlite_target_is_a_value_error(tmp_path: Path) -> None:
    """A ``schema`` given with a SQLite path raises ``ValueError`` and creates no file."""
    with pytest.raises(ValueError, match="schema is for a PostgreSQL URL"):
        Engine.open(tmp_path / "x.db", schema="jobs")
    assert not (tmp_path / "x.db").exists()


def test_two_schemas_are_two_stores(pg_schema: str, other_schema: str) -> None:
    """An instance stored in one schema is not in the other; both live in one database."""
    stored_apart(POSTGRES_URL, pg_schema, other_schema)
    with psycopg.connect(POSTGRES_URL) as conn:
        tables = conn.execute(
            "SELECT table_schema, count(*) FROM information_schema.tables "
            "WHERE table_schema IN (%s, %s) GROUP BY table_schema ORDER BY 1",
            (pg_schema, other_schema),
        ).fetchall()
    assert sorted(tables) == sorted([(pg_schema, 8), (other_schema, 8)])


def test_a_newer_schema_version_is_refused_and_left_as_it_was(pg_schema: str) -> None:
    """A store whose stored schema version is newer than this memable's is refused with
    ``StorageError`` at open and its version row is left unchanged."""
    Engine.open(POSTGRES_URL, schema=pg_schema).close()
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'UPDATE "{pg_schema}".memable_schema SET version = %s',
                     (SCHEMA_VERSION + 1,))
    with pytest.raises(StorageError, match="newer than this memable understands"):
        Engine.open(POSTGRES_URL, schema=pg_schema)
    with psycopg.connect(POSTGRES_URL) as conn:
        rows = conn.execute(f'SELECT version FROM "{pg_schema}".memable_schema').fetchall()
    assert rows == [(SCHEMA_VERSION + 1,)]


def test_a_version_1_schema_is_migrated_in_place_and_keeps_its_rows(pg_schema: str) -> None:
    """A store made before child workflows (version 1: unprefixed tables, the version in
    ``schema_version``) has its tables renamed ``memable_*`` and gains the parent columns when
    opened; its instances stay as they were."""
    engine = Engine.open(POSTGRES_URL, schema=pg_schema)
    engine.register("one", _one_step)
    with engine:
        assert engine.invoke("one", 1, instance_id="old").result(timeout=10) == 2
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{pg_schema}"')
        for column in ("parent_workflow", "parent_id", "parent_key", "parent_group",
                       "children_pending"):
            conn.execute(f"ALTER TABLE memable_instances DROP COLUMN {column}")
        for table in ("queue_starts", "schedules", "queue_states"):  # made by later versions
            conn.execute(f"DROP TABLE memable_{table}")
        for table in ("instances", "steps", "timers", "owners"):
            conn.execute(f"ALTER TABLE memable_{table} RENAME TO {table}")
        conn.execute("ALTER TABLE memable_schema RENAME TO schema_version")
        conn.execute("UPDATE schema_version SET version = 1")
    engine = Engine.open(POSTGRES_URL, schema=pg_schema)
    engine.register("one", _one_step)
    engine.register("parent", lambda ctx: ctx.child("kid", "one", 2))
    with engine:
        assert engine.invocation("one", "old").result(timeout=10) == 2
        assert engine.invoke("parent", instance_id="new").result(timeout=10) == 4
    with psycopg.connect(POSTGRES_URL) as conn:
        rows = conn.execute(f'SELECT version FROM "{pg_schema}".memable_schema').fetchall()
        tables = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s",
                              (pg_schema,)).fetchall()
    assert rows == [(SCHEMA_VERSION,)]
    assert sorted(name for (name,) in tables) == [
        "memable_instances", "memable_owners", "memable_queue_starts", "memable_queue_states",
        "memable_schedules", "memable_schema", "memable_steps", "memable_timers"]


def test_the_password_is_in_no_repr_and_connections_name_themselves(pg_schema: str) -> None:
    """repr of the engine and its store hide the password; the server lists the
    connections under application_name 'memable' unless the URL names them."""
    url = _with_password(POSTGRES_URL, "pw-never-shown")
    engine, store = build(url, schema=pg_schema)
    try:
        assert "pw-never-shown" not in repr(engine) + repr(store)
        names = _application_names()
        assert "memable" in names
    finally:
        engine.close()
    named = Engine.open(url + "?application_name=billing", schema=pg_schema)
    try:
        names = _application_names()
        assert "billing" in names
    finally:
        named.close()


_OPENER = """
import sys
import psycopg, psycopg_pool
from memable import Engine
print("ready", flush=True)
sys.stdin.readline()  # all start opening together
Engine.open(sys.argv[1], schema=sys.argv[2]).close()
print("opened")
"""


@pytest.mark.parametrize(
    "fault_round", range(int(os.environ.get("MEMABLE_FAULT_ROUNDS", "1")))
)
@pytest.mark.heavy
def test_twenty_processes_opening_a_new_schema_at_once_migrate_it_once(
    pg_schema: str, fault_round: int
) -> None:
    """Each opener succeeds; the store has one version row and its tables."""
    procs = [
        subprocess.Popen([sys.executable, "-c", _OPENER, POSTGRES_URL, pg_schema],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
        for _ in range(20)
    ]
    for proc in procs:  # each has imported everything it needs
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outcomes = [proc.communicate(timeout=120) for proc in procs]
    results = [(p.returncode, out, err) for p, (out, err) in zip(procs, outcomes, strict=True)]
    assert results == [(0, "opened\n", "")] * 20
    with psycopg.connect(POSTGRES_URL) as conn:
        versions = conn.execute(f'SELECT version FROM "{pg_schema}".memable_schema').fetchall()
    assert versions == [(SCHEMA_VERSION,)]
    engine = Engine.open(POSTGRES_URL, schema=pg_schema)
    engine.register("double", _one_step)
    with engine:
        assert engine.invoke("double", 2).wait(timeout=10) == Completed()


def test_a_signal_stored_by_another_engine_runs_the_instance_without_waiting_for_a_poll(
    pg_schema: str,
) -> None:
    """Engine B (without the workflow) stores a signal; engine A, polling once a minute,
    runs the instance on B's NOTIFY."""
    slow = {"poll_interval": 60, "lease": 600}
    a = Engine.open(POSTGRES_URL, schema=pg_schema, **slow)  # type: ignore[arg-type]
    a.register("approve", lambda ctx: ctx.suspend("ok") + 1)
    b = Engine.open(POSTGRES_URL, schema=pg_schema, **slow)  # type: ignore[arg-type]
    with a, b:
        waiting = a.invoke("approve", instance_id="x")
        assert str(waiting.wait(timeout=10)) == "suspended: ok"
        b.signal("approve", "x", "ok", 41)
        assert waiting.result(timeout=10) == 42


def test_a_wake_up_or_recovery_skips_an_instance_another_transaction_holds(
    pg_schema: str,
) -> None:
    """Claims other than the user's resume skip a locked row (FOR UPDATE SKIP LOCKED):
    no thread waits behind another engine's claim or a lost owner's open transaction;
    the poll finds the instance again once the row is free."""
    engine = Engine.open(POSTGRES_URL, schema=pg_schema)
    engine.register("wait", lambda ctx: ctx.suspend("go"))
    with engine:
        assert str(engine.invoke("wait", instance_id="w").wait(timeout=10)) == "suspended: go"
    with Engine.open(POSTGRES_URL, schema=pg_schema) as other:  # runs nothing: no workflow
        other.signal("wait", "w", "go", 1)  # ready: a wake-up may claim it
    store = PostgresStore(POSTGRES_URL, "full", schema=pg_schema)
    claims: list[object] = []

    def wake() -> None:
        claims.append(store.begin_run("wait", "w", now=1796256000.0, claim="wake"))

    try:
        with psycopg.connect(POSTGRES_URL, options=f"-c search_path={pg_schema}") as holder:
            holder.execute("SELECT 1 FROM memable_instances WHERE instance_id = 'w' FOR UPDATE")
            waker = threading.Thread(target=wake, name="test-wake")
            waker.start()
            waker.join(10)  # the lock is ours until this block ends: a waiting claim hangs
            assert not waker.is_alive()
        assert claims == [None]
        wake()  # the row is free again
        snapshot = claims[-1]
        assert isinstance(snapshot, RunSnapshot)
        assert snapshot.instance.owner == store.owner
    finally:
        store.close()


def _listened(schema: str, connect: Any | None, hears: bool) -> Listener:
    """Run a listener for a store in ``schema`` (connecting with ``connect``, else the
    store's way) until it heard its probe, or gave up on it (waited 0.5 s); stop it."""
    store = PostgresStore(POSTGRES_URL, "full", schema=schema)
    listener = Listener(connect or store._db.connect, store.channel, store.owner,
                        lambda *_: None, store._probe)
    listener.PROBE_WAIT = 0.5
    try:
        listener.start()
        assert (listener.heard if hears else listener.unheard).wait(10)
    finally:
        listener.stop()
        store.close()
    return listener


def test_a_listener_that_hears_its_own_probe_warns_of_nothing(
    pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """After LISTEN the listener notifies itself through the store's pool, and hears it."""
    listener = _listened(pg_schema, None, hears=True)
    assert not listener.unheard.is_set()
    assert not [r for r in caplog.records if r.levelname == "WARNING"]


def test_notices_that_never_arrive_are_warned_of_once(
    pg_schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    """LISTEN accepted but every notice lost, as behind a transaction-mode pooler
    (PgBouncer): here the listening connection is to another database of the same
    server, which accepts LISTEN and never sees the store's NOTIFYs. One warning."""
    dbname = parse(POSTGRES_URL).get("dbname")
    elsewhere = make_conninfo(
        POSTGRES_URL, dbname="template1" if dbname == "postgres" else "postgres"
    )
    listener = _listened(
        pg_schema, lambda: psycopg.connect(elsewhere, autocommit=True), hears=False
    )
    assert not listener.heard.is_set()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "do not arrive" in warnings[0]
    assert "relying on the poll" in warnings[0]


def test_the_command_line_reads_and_acts_on_a_postgresql_store(pg_schema: str) -> None:
    """list, show, signal, cancel and purge take a URL and --schema; a running engine acts
    on the CLI's signal at once (NOTIFY); no output shows the password."""
    url = _with_password(POSTGRES_URL, "pw-not-printed")
    engine = Engine.open(url, schema=pg_schema, poll_interval=60, lease=600)
    engine.register("approve", lambda ctx: ctx.suspend("ok") + 1)
    with engine:
        waiting = engine.invoke("approve", instance_id="x")
        assert str(waiting.wait(timeout=10)) == "suspended: ok"
        engine.invoke("approve", instance_id="y").wait(timeout=10)
        listed = cli("list", url, "--schema", pg_schema, "--json")
        assert listed.exit_code == 0, listed.stderr
        assert [(i["instance_id"], i["status"]) for i in json.loads(listed.stdout)] == [
            ("x", "suspended"), ("y", "suspended")
        ]
        shown = cli("show", url, "approve", "x", "--schema", pg_schema, "--json")
        assert json.loads(shown.stdout)["awaiting_signals"] == ["ok"]
        signalled = cli("signal", url, "approve", "x", "ok", "41", "--schema", pg_schema)
        assert signalled.exit_code == 0, signalled.stderr
        assert waiting.result(timeout=10) == 42
        cancelled = cli("cancel", url, "approve", "y", "--schema", pg_schema)
        assert cancelled.exit_code == 0, cancelled.stderr
        assert str(engine.invoke("approve", instance_id="y").wait(timeout=10)) == "cancelled"
    purged = cli("purge", url, "--older-than", "0s", "--schema", pg_schema)
    assert (purged.exit_code, purged.stdout) == (0, "purged 2 finished instances\n")
    outputs = [r.stdout + r.stderr for r in (listed, shown, signalled, cancelled, purged)]
    assert all("pw-not-printed" not in text for text in outputs)


def test_the_command_line_on_a_schema_without_a_store_exits_2_and_creates_nothing(
    pg_schema: str,
) -> None:
    """``list``, ``show``, ``cancel`` and ``purge`` on a PostgreSQL schema that holds no
    store exit 2 saying so, and create no schema."""
    for args in (["list"], ["show", "wf", "x"], ["cancel", "wf", "x"], ["purge"]):
        command, *rest = args
        extra = ["--older-than", "1d"] if command == "purge" else []
        result = cli(command, POSTGRES_URL, *rest, *extra, "--schema", pg_schema)
        assert result.exit_code == 2
        assert f"has no memable store in schema {pg_schema!r}" in result.stderr
    with psycopg.connect(POSTGRES_URL) as conn:
        found = conn.execute(
            "SELECT 1 FROM pg_namespace WHERE nspname = %s", (pg_schema,)
        ).fetchall()
    assert found == []


def _waiting_for_a_lock(conn: psycopg.Connection[Any], schema: str) -> None:
    """Return once a claim of the store (application ``memable``) waits for a lock."""
    deadline = time.monotonic() + 30
    while conn.execute(
        "SELECT 1 FROM pg_stat_activity WHERE application_name = 'memable' "
        "AND wait_event_type = 'Lock' AND query LIKE '%%pg_advisory_xact_lock%%'"
    ).fetchone() is None:
        assert time.monotonic() < deadline, "no claim of the queue ever waited for its lock"
        time.sleep(0.01)  # a condition on the server, looked at again


@pytest.mark.parametrize("isolation", ["repeatable read", "serializable"])
def test_a_server_default_isolation_does_not_change_what_a_claim_sees(
    pg_schema: str, isolation: str
) -> None:
    """With ``default_transaction_isolation`` set to ``isolation`` for memable's
    connections (here by the URL's ``options``; a role or database setting acts alike), a
    pause committed while the queue's claim waited for the queue's lock still stops the
    claim. (At that isolation every statement of the claim saw the snapshot taken before
    its lock: the pause was ignored and the instance ran.)"""
    setting = "-c default_transaction_isolation=" + isolation.replace(" ", "\\ ")
    url = f"{POSTGRES_URL}?options={quote(setting)}"
    ran: list[int] = []
    engine = build(url, schema=pg_schema, poll_interval=0.05).engine
    engine.queue("q", concurrency=1)
    engine.register("job", lambda ctx, n: ran.append(n) or n, queue="q")
    looks = Looks(engine)
    lock = f"memable-queue:{pg_schema}:q"
    with engine, psycopg.connect(POSTGRES_URL, autocommit=True) as watcher:
        with psycopg.connect(POSTGRES_URL) as pauser:  # the test's pause, as the store's
            pauser.execute(f'SET search_path TO "{pg_schema}"')
            pauser.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (lock,))
            inv = engine.invoke("job", 1, instance_id="j")
            _waiting_for_a_lock(watcher, pg_schema)
            pauser.execute(POSTGRESQL.spell(queue_sql.PAUSE),
                           {"queue": "q", "at": "2026-12-07T00:00:00"})
            seen = looks.count
        # Committed: the claim that waited goes on, and returns.
        looks.past(seen)
        assert str(inv.state) == "queued"
        assert ran == []
        engine.resume_queue("q")
        assert inv.result(timeout=10) == 1
    assert ran == [1]


def _skews(caplog: pytest.LogCaptureFixture) -> list[float]:
    """The differences the WARNINGs about the wall clock name, in seconds, as logged."""
    found = [re.search(r"wall clock is ([+-][0-9.]+) s from the database server's",
                       r.getMessage()) for r in caplog.records if r.levelno == logging.WARNING]
    return [float(match.group(1)) for match in found if match is not None]


def test_an_engine_whose_clock_is_an_hour_ahead_of_the_server_says_so_once(
    pg_schema: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Timers, timeouts, delayed starts and ticks are judged by the engine's wall clock,
    leases by the server's: an engine an hour ahead cancelled instances an hour early and
    nothing said so. It now logs one WARNING at start naming about +3600 s and that
    deadlines fire early; heartbeats with the same difference (within a second) log
    nothing more; a change by more than a second logs again. SQLite, whose leases use the
    engines' clocks, has no server clock to compare and says nothing."""
    caplog.set_level(logging.WARNING, logger="memable")
    offset = [3600.0]
    clock = Clock(wall=lambda: time.time() + offset[0])
    options = Options(lease=0.9, clock=clock)  # a heartbeat every 0.3 s
    engine = engine_on(PostgresStore(POSTGRES_URL, "full", schema=pg_schema), options)
    beats = Looks(engine, "heartbeat")
    with engine:
        [ahead] = _skews(caplog)  # at start
        assert abs(ahead - 3600) < 1
        # The difference is at least the one measured (the server read its clock after
        # the engine's first reading): 3599.7 when the heartbeat took 0.3 s to get there.
        assert f"fire {ahead:.1f} s early here" in caplog.text
        offset[0] = 3600.6
        # Four more: the judgement of the third is logged before the fourth begins.
        beats.twice_more()
        beats.twice_more()
        assert len(_skews(caplog)) == 1
        offset[0] = 3602.5
        beats.twice_more()
        beats.twice_more()
        [_, changed] = _skews(caplog)
        assert abs(changed - 3602.5) < 1
    on_file = engine_on(SQLiteStore(tmp_path / "db", "full"), options)
    beats = Looks(on_file, "heartbeat")
    with on_file:
        beats.twice_more()
    on_file.close()
    assert len(_skews(caplog)) == 2


def test_placing_a_signal_waits_for_a_takeover_under_way_and_then_is_refused(
    pg_schema: str,
) -> None:
    """Another engine's claim of the instance is in progress (its UPDATE of the owner done,
    not committed): this engine's placement of an early signal waits for it (the owned
    row is share-locked, not read from the snapshot before the takeover) and, once it
    commits, raises LostInstance and leaves the signal where it was. (Without the lock the
    placement wrote beside the takeover: a write of an engine that had lost the run.)"""
    store = PostgresStore(f"{POSTGRES_URL}?application_name=memable", "full", schema=pg_schema)
    try:
        now = "2026-12-07T00:00:00+00:00"
        assert store.create_instance(InstanceRow(
            workflow="wf", instance_id="i", status="running", message=None, input="null",
            input_type=None, output=None, output_type=None, created_at=now, updated_at=now,
            completed_at=None))
        write = StepWrite("wf", "i", "k", UNREACHED, "signal", "completed", '"v"', None,
                          None, None, 1796601600.0, 1796601600.0)  # at, started: now
        store.deliver_signal(write)
        with psycopg.connect(POSTGRES_URL, options=f"-c search_path={pg_schema}") as other:
            other.execute("UPDATE memable_instances SET owner = 'another' WHERE instance_id = 'i'")
            outcome: list[BaseException | None] = []

            def place() -> None:
                try:
                    store.place_signal("wf", "i", "k", 3)
                    outcome.append(None)
                except BaseException as exc:  # what the placement did, whatever it is
                    outcome.append(exc)

            placing = threading.Thread(target=place, name="test-place-signal")
            placing.start()
            with psycopg.connect(POSTGRES_URL, autocommit=True) as watcher:
                deadline = time.monotonic() + 30
                while watcher.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE application_name = 'memable' "
                    "AND wait_event_type = 'Lock' "
                    "AND query LIKE '%%UPDATE memable_steps SET seq%%'"
                ).fetchone() is None:
                    assert not outcome, f"the placement did not wait: {outcome}"
                    assert time.monotonic() < deadline, "the placement never waited"
                    time.sleep(0.01)  # a condition on the server, looked at again
            other.commit()
            placing.join(30)
        assert len(outcome) == 1
        assert isinstance(outcome[0], LostInstance)
        stored = store.read_step("wf", "i", "k")
        assert stored is not None
        assert stored.seq == UNREACHED
    finally:
        store.close()


@pytest.mark.parametrize("other", ["commits", "rolls back"])
def test_a_creation_racing_another_for_its_id_answers_by_what_committed(
    pg_schema: str, other: str
) -> None:
    """Another transaction (a second connection, as another engine's creation) has
    inserted the same instance id and not committed. The creation, one statement, waits
    for it: if it commits, the id is taken (False: the row holds another call's token,
    not this one's); if it rolls back, the creation makes the instance (True). One row
    either way."""
    store = PostgresStore(POSTGRES_URL, "full", schema=pg_schema)
    now = "2026-12-07T00:00:00+00:00"
    row = InstanceRow(workflow="wf", instance_id="i", status="running", message=None,
                      input="null", input_type=None, output=None, output_type=None,
                      created_at=now, updated_at=now, completed_at=None)
    answers: list[bool] = []
    try:
        with psycopg.connect(POSTGRES_URL) as holder:  # a transaction of its own
            holder.execute(
                f'INSERT INTO "{pg_schema}".memable_instances (workflow, instance_id, status, '
                "input, created_at, updated_at, created_by) VALUES ('wf', 'i', 'running', "
                "'null', %s, %s, 'another call')", (now, now))
            blocker = holder.execute("SELECT pg_backend_pid()").fetchone()
            creating = threading.Thread(
                target=lambda: answers.append(store.create_instance(row)), name="creating")
            creating.start()
            with psycopg.connect(POSTGRES_URL, autocommit=True) as watch:
                def waiting() -> bool:  # the creation waits on the holder's row
                    return watch.execute(
                        "SELECT count(*) FROM pg_stat_activity "
                        "WHERE %s = ANY(pg_blocking_pids(pid))", blocker).fetchone() == (1,)
                deadline = time.monotonic() + 30
                while not waiting():
                    assert time.monotonic() < deadline, "the creation never waited"
                    time.sleep(0.01)  # a poll of pg_locks, nothing to wait on
            assert answers == []  # still waiting
            if other == "commits":
                holder.commit()
            else:
                holder.rollback()
        creating.join(30)
        assert answers == [other == "rolls back"]
        with psycopg.connect(POSTGRES_URL) as conn:
            found = conn.execute(
                "SELECT created_by IS NULL OR created_by <> %s "
                f'FROM "{pg_schema}".memable_instances',
                ("another call",)).fetchall()
        assert found == [(other == "rolls back",)]
    finally:
        store.close()
