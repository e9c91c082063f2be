"""Faults on the real PostgreSQL server: a network partition, connections killed by the server.

Each test drives real engines against the server ``conftest.POSTGRES_URL``
names; the partition is a TCP proxy (``_tcp_proxy``) between one engine and
the server that the test cuts and heals.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
from _tcp_proxy import Proxy
from conftest import POSTGRES_URL
from helpers import build, query, queued_row, statements_of, store_of

from memable import Context, Engine
from memable._postgres.schema import parse

#: Each fault test runs this many times in a row (MEMABLE_FAULT_ROUNDS=10 for the
#: acceptance run; the suite runs each once).
ROUNDS = pytest.mark.parametrize(
    "fault_round", range(int(os.environ.get("MEMABLE_FAULT_ROUNDS", "1")))
)


@pytest.fixture
def proxy() -> Iterator[Proxy]:
    params = parse(POSTGRES_URL)
    found = Proxy((params.get("host", "127.0.0.1"), int(params.get("port", "5432"))))
    yield found
    found.close()


def _through(proxy: Proxy) -> str:
    params = parse(POSTGRES_URL)
    user = params.get("user", "postgres")
    return f"postgresql://{user}@127.0.0.1:{proxy.port}/{params.get('dbname', 'test')}"


@ROUNDS
def test_a_partitioned_engine_loses_its_instance_and_its_late_writes_are_refused(
    pg_schema: str, proxy: Proxy, fault_round: int
) -> None:
    """A reaches the server through a proxy; the test cuts it while A is inside step s2.
    A's lease runs out by the server's clock; B takes the instance over and enters s2.
    The proxy heals: A's late write of s2 reaches the server before B's, and is refused
    (B owns the instance now); A's run stops. B completes: the store holds one result
    per key, B's for s2."""
    ran: list[tuple[str, str]] = []
    in_a, release_a, in_b, release_b = (threading.Event() for _ in range(4))

    def workflow(engine_name: str) -> Any:
        def wf(ctx: Context) -> str:
            results = []
            for key in ("s1", "s2", "s3"):
                def body(key: str = key) -> str:
                    ran.append((engine_name, key))
                    if key == "s2":
                        inside, release = (in_a, release_a) if engine_name == "a" else (
                            in_b, release_b)
                        inside.set()
                        assert release.wait(60)
                    return f"{key} by {engine_name}"
                results.append(ctx.step(key).run(body))
            return ", ".join(results)
        return wf

    a = Engine.open(_through(proxy), schema=pg_schema, lease=2.0, poll_interval=0.2)
    b = Engine.open(POSTGRES_URL, schema=pg_schema, poll_interval=0.1)
    a.register("p", workflow("a"))
    b.register("p", workflow("b"))
    try:
        a.start()
        b.start()
        a.invoke("p", instance_id="x")
        assert in_a.wait(30)
        proxy.cut()
        assert in_b.wait(60)  # B recovered the instance once A's lease ran out
        release_a.set()  # A's write of s2 waits in the cut network...
        proxy.heal()  # ...and reaches the server now, before B's
        a.stop()  # A's run has ended: its write was refused
        release_b.set()
        assert b.invocation("p", "x").result(timeout=60) == "s1 by a, s2 by b, s3 by b"
    finally:
        release_a.set()
        release_b.set()
        proxy.heal()
        a.close()
        b.close()
    assert ran == [("a", "s1"), ("a", "s2"), ("b", "s2"), ("b", "s3")]
    reader = build(POSTGRES_URL, schema=pg_schema).engine
    try:
        rows = query(reader, "SELECT key, state, result, attempts FROM memable_steps ORDER BY seq")
        status = query(reader, "SELECT status, owner FROM memable_instances")
    finally:
        reader.close()
    assert rows == [
        ("s1", "completed", '"s1 by a"', 1),
        ("s2", "completed", '"s2 by b"', 1),
        ("s3", "completed", '"s3 by b"', 1),
    ]
    assert status == [("completed", None)]


def _terminate(application_name: str) -> int:
    """Terminate every connection with that name; how many. Right after a kill the engine
    may hold none for a moment (it reconnects as it needs): then ask again. There is no
    event to wait on across the server, so this polls it, for up to 30 s."""
    deadline = time.monotonic() + 30
    with psycopg.connect(POSTGRES_URL, autocommit=True) as admin:
        while True:
            found = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s", (application_name,),
            ).fetchone()
            ended = 0 if found is None else int(found[0])
            if ended or time.monotonic() > deadline:
                return ended
            time.sleep(0.01)


@pytest.mark.heavy
@ROUNDS
def test_connections_killed_by_the_server_mid_workload_lose_nothing(
    pg_schema: str, fault_round: int
) -> None:
    """pg_terminate_backend on every memable connection, three times while 40 instances
    run their steps: the engine reconnects; every instance completes, every step once."""
    calls: dict[tuple[int, int], int] = {}
    lock = threading.Lock()
    progress = threading.Semaphore(0)

    def wf(ctx: Context, n: int) -> int:
        total = 0
        for k in range(5):
            def body(k: int = k) -> int:
                with lock:
                    calls[(n, k)] = calls.get((n, k), 0) + 1
                progress.release()
                return k
            total += ctx.step(f"s{k}").run(body)
        return total

    # Its own application_name: the kills reach this engine's connections only.
    name = f"memable-{pg_schema}"
    url = POSTGRES_URL + ("&" if "?" in POSTGRES_URL else "?") + f"application_name={name}"
    engine = Engine.open(url, schema=pg_schema, max_workers=8, poll_interval=0.2)
    engine.register("w", wf)
    with engine:
        invocations = [engine.invoke("w", n, instance_id=f"i{n}") for n in range(40)]
        for _ in range(3):
            for _ in range(20):  # some steps ran since the last kill
                assert progress.acquire(timeout=60)
            assert _terminate(name) >= 1
        results = [inv.result(timeout=120) for inv in invocations]
    assert results == [10] * 40
    # Each write cut by a kill was tried again (read back first): no body ran twice.
    assert calls == {(n, k): 1 for n in range(40) for k in range(5)}
    reader = build(POSTGRES_URL, schema=pg_schema).engine
    try:
        stored = query(reader, "SELECT count(*), min(attempts), max(attempts) FROM memable_steps")
    finally:
        reader.close()
    assert stored == [(200, 1, 1)]


PG_CHILD = str(Path(__file__).with_name("_pg_procs.py"))


@pytest.mark.heavy
@ROUNDS
def test_four_processes_on_one_database_and_a_kill_lose_nothing(
    pg_schema: str, tmp_path: Path, fault_round: int
) -> None:
    """4 processes x 100 instances (a step, a 0.2 s timer, a signal from the next process,
    a step). One is SIGKILLed once it is under way and started again: every instance ends
    completed with its signal's value; no step body ran twice but those in flight at the
    kill (at most the killed engine's 8 workers)."""
    log = tmp_path / "effects.log"
    names = ["p0", "p1", "p2", "p3"]

    def spawn(k: int) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, PG_CHILD, POSTGRES_URL, pg_schema, str(log), names[k],
             names[(k + 1) % 4], "100"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )

    def invoked(proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "invoked\n"

    def go(proc: subprocess.Popen[str]) -> None:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()

    def end(proc: subprocess.Popen[str]) -> None:
        if proc.poll() is None:
            proc.kill()
        proc.wait(60)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()

    procs = [spawn(k) for k in range(4)]
    started = list(procs)
    try:
        # A process signals its neighbour's instances once told to go: only once
        # every process has stored its own (a go sent as each reported in let p1
        # signal p2-70 before p2 had stored it).
        for proc in procs:
            invoked(proc)
        for proc in procs:
            go(proc)
        end(procs[0])  # under way: signalling, running its instances and others'
        procs[0] = spawn(0)
        started.append(procs[0])
        invoked(procs[0])
        go(procs[0])
        outputs = [json.loads(proc.communicate(timeout=300)[0]) for proc in procs]
    finally:
        for proc in started:
            end(proc)
    assert outputs == [
        [f"{i}:from {names[(k - 1) % 4]}" for i in range(100)] for k in range(4)
    ]
    runs = Counter(log.read_text().splitlines())
    assert set(runs) == {f"{name}-{i} {key}" for name in names for i in range(100)
                         for key in ("s1", "s2")}
    assert sum(count - 1 for count in runs.values()) <= 8
    reader = build(POSTGRES_URL, schema=pg_schema).engine
    try:
        assert query(reader, "SELECT status, count(*) FROM memable_instances GROUP BY 1") == [
            ("completed", 400)
        ]
        assert query(reader, "SELECT kind, state, count(*) FROM memable_steps GROUP BY 1, 2 "
                     "ORDER BY 1") == [
            ("signal", "completed", 400), ("step", "completed", 800), ("timer", "completed", 400)
        ]
        assert query(reader, "SELECT count(*) FROM memable_timers") == [(0,)]
    finally:
        reader.close()


def _after_heartbeats(engine: Engine) -> threading.Event:
    """An event set each time the engine's heartbeat commits (the test clears it)."""
    beat = threading.Event()
    store = store_of(engine)
    renew = store.heartbeat

    def heartbeat(now: float) -> None:
        renew(now)
        beat.set()

    store.heartbeat = heartbeat  # type: ignore[method-assign]
    return beat


def test_an_outage_shorter_than_the_lease_costs_no_run(
    pg_schema: str, proxy: Proxy, caplog: pytest.LogCaptureFixture,
) -> None:
    """A's server goes away (every connection reset, new ones refused) for 3.5 s of its
    6 s lease, right after A's heartbeat, while three runs are inside a step; the steps
    end and their writes meet the outage. B, on the server directly, recovers any
    instance whose lease runs out. Each write retries until the proxy lets traffic
    through again: every run completes in A, no step executes twice, B recovers
    nothing; the outage is one WARNING, and psycopg's pool logs none (its reconnects,
    on their own backoff, came back after the lease: B took the runs over)."""
    ran: Counter[tuple[str, str]] = Counter()
    inside = threading.Semaphore(0)
    go = threading.Event()

    def wf(ctx: Context) -> str:
        for key in ("s1", "s2", "s3"):
            def body(key: str = key) -> str:
                ran[(ctx.instance_id, key)] += 1
                if key == "s2" and ctx.instance_id.startswith("i"):
                    inside.release()
                    assert go.wait(60)
                return key
            ctx.step(key).run(body)
        return "done"

    a = build(_through(proxy), schema=pg_schema, lease=6.0, poll_interval=0.2).engine
    b = Engine.open(POSTGRES_URL, schema=pg_schema, poll_interval=0.1)
    a.register("wf", wf)
    b.register("wf", wf)
    beat = _after_heartbeats(a)
    outage = threading.Event()
    try:
        with caplog.at_level(logging.INFO):
            a.start()
            b.start()
            invs = [a.invoke("wf", instance_id=f"i{n}") for n in range(3)]
            for _ in invs:
                assert inside.acquire(timeout=30)
            beat.clear()
            assert beat.wait(30)  # the lease was just renewed: 6 s from now
            proxy.drop()
            go.set()  # the steps end; their writes meet the outage
            outage.wait(3.5)  # the outage's length: nothing to wait for but time
            proxy.heal()
            assert [inv.result(timeout=60) for inv in invs] == ["done"] * 3
    finally:
        go.set()
        proxy.heal()
        a.close()
        b.close()
    assert ran == {(f"i{n}", key): 1 for n in range(3) for key in ("s1", "s2", "s3")}
    reader = build(POSTGRES_URL, schema=pg_schema).engine
    try:
        assert query(
            reader, "SELECT count(*) FROM memable_instances WHERE recoveries > 0") == [(0,)]
    finally:
        reader.close()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.name for r in warnings if r.name == "psycopg.pool"] == []
    lost = [r for r in warnings if r.getMessage().startswith("lost the connection to")]
    assert len(lost) == 1
    assert "\n" not in lost[0].getMessage()
    assert not [r for r in warnings if "run stopped" in r.getMessage()
                or "could not be recorded" in r.getMessage()]


def test_an_operation_after_an_outage_past_the_lease_gets_a_connection(
    pg_schema: str, proxy: Proxy,
) -> None:
    """The server was unreachable past the engine's lease, and answers again; until the
    next heartbeat commits, the lease is known lost. An operation outside a run still
    gets a connection, though each new one takes 0.2 s to open (a loaded server): it
    used to try once, for 0.05 s, and fail ("couldn't get a connection")."""
    from memable._postgres.store import PostgresStore

    store = PostgresStore(_through(proxy), "full", schema=pg_schema)
    try:
        store._db.renewed(time.monotonic() - 60.0, 15.0)  # known lost 46.5 s ago
        proxy.drop()  # every connection goes...
        proxy.connect_delay = 0.2
        proxy.heal()  # ...and the server is back, slow to connect to
        _running_instance(store)  # (it asserts the creation went through)
    finally:
        store.close()


def test_stop_with_the_server_unreachable_returns_within_the_lease(
    pg_schema: str, proxy: Proxy, caplog: pytest.LogCaptureFixture,
) -> None:
    """A run's step ends while A's server refuses every connection, and A is stopped:
    the run retries its write until A's lease (3 s) is known lost, then stops without
    writing; stop() returns within the lease, logs one line for the owner row left to
    expire, and no traceback. The instance is left A's and running: B, on the
    server, recovers it once A's lease has run out; the step stored before the
    outage does not run again (the one whose write was lost does)."""
    ran: Counter[str] = Counter()
    inside, go = threading.Event(), threading.Event()

    def wf(ctx: Context) -> str:
        def first() -> str:
            ran["s1"] += 1
            return "s1"

        def second() -> str:
            ran["s2"] += 1
            if ran["s2"] == 1:
                inside.set()
                assert go.wait(60)
            return "s2"

        return ctx.step("s1").run(first) + ctx.step("s2").run(second)

    a = Engine.open(_through(proxy), schema=pg_schema, lease=3.0, poll_interval=0.2)
    a.register("wf", wf)
    stopped = None
    try:
        with caplog.at_level(logging.INFO):
            a.start()
            a.invoke("wf", instance_id="x")
            assert inside.wait(30)
            proxy.drop()
            go.set()
            began = time.monotonic()
            a.stop()
            stopped = time.monotonic() - began
    finally:
        go.set()
        proxy.heal()
        a.close()
    assert stopped is not None
    assert stopped < 3.0, stopped
    assert not [r for r in caplog.records if r.exc_info]
    left = [r for r in caplog.records if "owner row stays" in r.getMessage()]
    assert len(left) == 1
    assert left[0].levelno == logging.WARNING
    assert [r.name for r in caplog.records
            if r.levelno >= logging.WARNING and r.name == "psycopg.pool"] == []
    b = Engine.open(POSTGRES_URL, schema=pg_schema, poll_interval=0.1)
    b.register("wf", wf)
    with b:  # A's lease has run out: B recovers the instance
        assert b.invocation("wf", "x").result(timeout=60) == "s1s2"
    assert ran == {"s1": 1, "s2": 2}


class _CommitLost:
    """A pooled connection whose next ``COMMIT`` loses its answer: the connection closes
    as the answer would come, after the server committed (``after=True``) or before the
    COMMIT was sent (``after=False``). Everything else goes to the real connection.

    A write run as one statement, outside a transaction the store opened, whose text
    starts with ``plan["one"]`` (a step's, unless told) loses its answer as a COMMIT's
    would."""

    def __init__(self, conn: Any, plan: dict[str, Any]) -> None:
        self._conn, self._plan = conn, plan

    def execute(self, sql: str, *args: Any, **kwargs: Any) -> Any:
        return self._lost(sql, lambda: self._conn.execute(sql, *args, **kwargs))

    def send_text(self, text: bytes) -> Any:  # a text of several (memable._postgres.batch)
        return self._lost(text.decode(), lambda: self._conn.send_text(text))

    def _lost(self, sql: str, run: Callable[[], Any]) -> Any:
        self._plan.setdefault("sent", []).append(sql)
        prefix = self._plan.get("one", "INSERT INTO memable_steps")
        one_statement = (isinstance(sql, str) and getattr(self, "opening", None) is None
                         and any(statement.lstrip().startswith(prefix)
                                 for statement in statements_of(sql, self._conn)))
        # (A transaction's last statements go with its COMMIT, as one text.)
        commit = isinstance(sql, str) and (sql == "COMMIT" or sql.endswith("; COMMIT"))
        if (commit or one_statement) and self._plan["left"]:
            self._plan["left"] -= 1
            if self._plan["after"]:
                run()  # the server commits...
            self._conn.close()  # ...and the answer never arrives: the connection is gone
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return run()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)


class _LosingPool:
    def __init__(self, pool: Any, plan: dict[str, Any]) -> None:
        self._pool, self._plan = pool, plan

    @contextlib.contextmanager
    def connection(self, timeout: float | None = None) -> Iterator[Any]:
        with self._pool.connection(timeout) as conn:
            yield _CommitLost(conn, self._plan)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pool, name)


def _running_instance(store: Any) -> Any:
    """A running instance ("wf", "i") created on ``store``, and so its own; its row."""
    from memable._store.rows import InstanceRow

    now = "2026-12-07T00:00:00+00:00"
    row = InstanceRow(workflow="wf", instance_id="i", status="running", message=None,
                      input="null", input_type=None, output=None, output_type=None,
                      created_at=now, updated_at=now, completed_at=None)
    assert store.create_instance(row) is True
    return row


def test_a_failed_attempt_whose_answer_is_lost_counts_once(pg_schema: str) -> None:
    """The connection goes as the answer to the write of a failed attempt would come,
    after the server stored it: the attempt counts once (run again as one statement, the
    write counted it twice)."""
    from memable._postgres.store import PostgresStore
    from memable._store.rows import StepWrite

    store = PostgresStore(POSTGRES_URL, "full", schema=pg_schema)
    try:
        _running_instance(store)
        plan = {"left": 1, "after": True}
        store._db._pool = _LosingPool(store._db._pool, plan)  # type: ignore[assignment]
        store.save_step(StepWrite(
            workflow="wf", instance_id="i", key="k", seq=0, kind="step", state="failed",
            result=None, result_type=None, status=None, error="boom", at=1796601600.0,
            started=1796601600.0))
        assert plan["left"] == 0  # the answer was lost once
        stored = store.read_step("wf", "i", "k")
        assert stored is not None
        assert (stored.state, stored.attempts) == ("failed", 1)
    finally:
        store.close()


def test_a_queued_creation_and_its_notice_are_one_text_and_one_transaction(
    pg_schema: str,
) -> None:
    """An instance created queued tells the queue's consumers in the text of its insert, so
    the notice commits with the row (one implicit transaction) in one round trip; a listener
    hears it once the row is there. An id taken writes nothing (the notice is a look that
    finds nothing new)."""
    import psycopg

    from memable._postgres.store import PostgresStore

    store = PostgresStore(POSTGRES_URL, "full", schema=pg_schema)
    try:
        plan = {"left": 0, "after": True}
        store._db._pool = _LosingPool(store._db._pool, plan)  # type: ignore[assignment]
        row = queued_row("q0")
        with psycopg.connect(POSTGRES_URL, autocommit=True) as listener:
            listener.execute(f'LISTEN "{store.channel}"')
            assert store.create_instance(row) is True
            [text] = plan["sent"]
            assert text.index("pg_notify") < text.index("INSERT INTO memable_instances")
            [notice] = listener.notifies(timeout=10, stop_after=1)
            assert "q0" in notice.payload
            assert store.get_instance("wf", "q0") is not None
            assert store.create_instance(attrs.evolve(row, message="again")) is False
        stored = store.get_instance("wf", "q0")
        assert stored is not None
        assert stored.message is None
    finally:
        store.close()


def test_a_queue_claim_takes_what_it_found_in_one_round_trip(pg_schema: str) -> None:
    """A claim of eight queued instances is five round trips, however many it takes: the
    lock with the pause and the clock, the slots held, the next ones, their takes with
    their steps, the ``COMMIT`` (one take each was a round trip each). Each taken once."""
    from memable._postgres.store import PostgresStore

    store = PostgresStore(POSTGRES_URL, "full", schema=pg_schema)
    try:
        for i in range(8):
            assert store.create_instance(queued_row(f"q{i}")) is True
        plan = {"left": 0, "after": True}
        store._db._pool = _LosingPool(store._db._pool, plan)  # type: ignore[assignment]
        claimed = store.claim_queued("q", ["wf"], concurrency=8, per_process=None, rate=None,
                                     clock=time.time, at=1796601600.0, batch=8)
        assert sorted(s.instance.instance_id for s in claimed.snapshots) == [
            f"q{i}" for i in range(8)]
        assert {s.instance.status for s in claimed.snapshots} == {"running"}
        assert len(plan["sent"]) == 1 + 5  # the look at the queue, then the claim
    finally:
        store.close()


@pytest.mark.parametrize("after", [True, False], ids=["committed", "not-committed"])
def test_a_run_end_without_a_parent_commits_in_its_one_round_trip_and_runs_again_if_lost(
    pg_schema: str, after: bool
) -> None:
    """A run that read its row without a parent ends in one text: the BEGIN, the end, the
    NOTIFY its queue's consumers wait for and the COMMIT. Its answer lost after the server
    committed, the end runs again and finds it recorded (``recorded=False``: the runner
    then reads the stored state, the one it recorded); lost before, it records it then.
    Either way the store holds the end once."""
    from memable._postgres.store import PostgresStore
    from memable._store.rows import RunEnd

    store = PostgresStore(POSTGRES_URL, "full", schema=pg_schema)
    try:
        row = attrs.evolve(_running_instance(store), queue="q")
        plan = {"left": 0, "after": after}
        store._db._pool = _LosingPool(store._db._pool, plan)  # type: ignore[assignment]

        def end(read: Any) -> RunEnd:
            return RunEnd("completed", 1796601600.0, output=("7", None), read=read)

        assert store.finish("wf", "i", end(row)).recorded
        [text] = plan["sent"]
        assert text.startswith("BEGIN;")
        assert text.endswith("; COMMIT")
        assert "pg_notify" in text
        assert store.create_instance(attrs.evolve(row, instance_id="j")) is True
        plan.update(left=1, sent=[])
        ended = store.finish("wf", "j", end(attrs.evolve(row, instance_id="j")))
        assert plan["left"] == 0  # the answer was lost once
        assert ended.recorded is not after
        for instance_id in ("i", "j"):
            stored = store.get_instance("wf", instance_id)
            assert stored is not None
            assert (stored.status, stored.output, stored.owner) == ("completed", "7", None)
    finally:
        store.close()


@pytest.mark.parametrize("after", [True, False], ids=["committed", "not-committed"])
def test_a_suspension_that_goes_on_commits_with_its_reads_and_runs_again_if_that_is_lost(
    pg_schema: str, after: bool
) -> None:
    """A timer due at once goes on (its run stays running and ours, no owner or status
    changed): the commit goes with the snapshot's reads, two round trips in all. Its
    answer lost, whether or not the server committed, the suspension runs again and
    answers alike: ready, the timer fired (completed) once, with the same snapshot."""
    from memable._postgres.store import PostgresStore
    from memable._store.rows import StepWrite

    store = PostgresStore(POSTGRES_URL, "full", schema=pg_schema)
    try:
        row = _running_instance(store)
        plan = {"left": 0, "after": after}
        store._db._pool = _LosingPool(store._db._pool, plan)  # type: ignore[assignment]

        def zero(instance_id: str) -> StepWrite:
            return StepWrite(workflow="wf", instance_id=instance_id, key="zero", seq=0,
                             kind="timer", state="waiting", result=None, result_type=None,
                             status=None, error=None, at=1796601600.0)

        first = store.suspend(zero("i"), "waiting for zero", 1796601600.0, 1796601600.0)
        assert len(plan["sent"]) == 2  # BEGIN and its reads; the writes, reads and COMMIT
        assert plan["sent"][-1].endswith("; COMMIT")
        assert store.create_instance(attrs.evolve(row, instance_id="j")) is True
        plan.update(left=1, sent=[])
        again = store.suspend(zero("j"), "waiting for zero", 1796601600.0, 1796601600.0)
        assert plan["left"] == 0  # the answer was lost once
        for suspended, instance_id in ((first, "i"), (again, "j")):
            assert suspended.outcome == "ready"
            assert suspended.snapshot is not None
            assert suspended.snapshot.instance.instance_id == instance_id
            assert suspended.snapshot.instance.status == "running"
            steps = suspended.snapshot.steps
            assert {k: (s.kind, s.state) for k, s in steps.items()} == {
                "zero": ("timer", "completed")}
        stored = store.read_step("wf", "j", "zero")
        assert stored is not None
        assert (stored.state, stored.kind) == ("completed", "timer")
    finally:
        store.close()


@pytest.mark.parametrize("after", [True, False], ids=["committed", "not-committed"])
@pytest.mark.parametrize("start_at", [None, 1796601600.0], ids=["one-statement", "delayed"])
def test_a_creation_whose_answer_is_lost_answers_as_made(
    pg_schema: str, after: bool, start_at: float | None
) -> None:
    """The connection goes as the answer to an instance's creation would come (a write
    whose answer a second run would change: "made it" the first time, "it was there"
    after). Stored before the connection went: the creation answers True, as made (run
    again blindly, it answered False, and the invoke took its own instance for
    another's). A delayed start, a transaction, is decided by the server and not run
    again; a plain creation, one statement, runs again and recognises its own row by
    its call's token. Not stored: it runs again and makes the instance. One row either
    way, and a second creation of the id, another call, still finds it taken."""
    from memable._postgres.store import PostgresStore

    store = PostgresStore(POSTGRES_URL, "full", schema=pg_schema)
    try:
        plan = {"left": 1, "after": after, "one": "INSERT INTO memable_instances"}
        store._db._pool = _LosingPool(store._db._pool, plan)  # type: ignore[assignment]
        row = queued_row("i")
        assert store.create_instance(row, start_at) is True
        assert plan["left"] == 0  # the answer was lost once
        assert store.create_instance(row, start_at) is False
        with psycopg.connect(POSTGRES_URL) as conn:
            rows = conn.execute(
                f'SELECT count(*) FROM "{pg_schema}".memable_instances WHERE instance_id = %s',
                ("i",),
            ).fetchone()
        assert rows == (1,)
    finally:
        store.close()


def test_a_lost_commit_still_in_progress_ends_only_the_process_that_holds_it() -> None:
    """The server has not seen the lost connection go (its transaction is still in
    progress): deciding the commit ends that process, then finds the transaction aborted.
    A process named by the pid that holds another transaction (the pid reused after the
    first ended) is never ended."""
    from memable._postgres.connections import _END_HOLDER, _committed, _LostCommit

    alive = "SELECT count(*) FROM pg_stat_activity WHERE pid = %s"
    holder = psycopg.connect(POSTGRES_URL)  # ended by the test: closed, not committed
    with contextlib.closing(holder), psycopg.connect(POSTGRES_URL) as other, \
            psycopg.connect(POSTGRES_URL, autocommit=True) as asker:
        xid, pid = holder.execute(
            "SELECT txid_current(), pg_backend_pid()").fetchone()  # type: ignore[misc]
        other_pid = other.execute(
            "SELECT pg_backend_pid() FROM (SELECT txid_current()) AS its_own").fetchone()[0]  # type: ignore[index]
        assert asker.execute("SELECT txid_status(%s)", (xid,)).fetchone() == ("in progress",)
        asker.execute(_END_HOLDER, (other_pid, str(xid % (1 << 32))))  # not its transaction
        assert asker.execute(alive, (other_pid,)).fetchone() == (1,)
        lost = psycopg.OperationalError("server closed the connection unexpectedly")
        assert _committed(asker, _LostCommit(xid, pid, True, lost)) is False
        assert asker.execute(alive, (pid,)).fetchone() == (0,)
        assert asker.execute(alive, (other_pid,)).fetchone() == (1,)
