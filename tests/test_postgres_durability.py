"""With ``synchronous="full"`` no PostgreSQL server crash undoes an acknowledged call.

Each test runs a server of its own (``_pg_server``), never the shared one, and
crashes it (``pg_ctl stop -m immediate``) right after a call returned. The
server flushes asynchronous commits only every ``wal_writer_delay`` (10 s here),
and nothing else writes WAL out meanwhile, so a commit made with
``synchronous_commit`` off is lost by the crash; one made durably is replayed
on restart. The engine rides through the restart (``Connections.run`` retries
for ``RETRY_FOR`` seconds).
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from _pg_server import PgServer, bindir_or_skip
from helpers import build

from memable import Completed, Context, Engine, Failed, Suspended

#: What makes an asynchronous commit stay in the server's memory until the crash.
_SETTINGS = {
    "wal_writer_delay": "10000ms",  # the longest: async commits wait up to 10 s for a flush
    "fsync": "on",
    "bgwriter_lru_maxpages": "0",  # no buffer writes (each would flush WAL first)
    "autovacuum": "off",
    "checkpoint_timeout": "1d",
}
#: Seconds any one wait of these tests may take before it fails.
WAIT = 60.0


@pytest.fixture(scope="module")
def server() -> Iterator[PgServer]:
    """A server of this module's own, started; stopped and removed afterwards, always."""
    found = PgServer(bindir_or_skip(), _SETTINGS)
    try:
        found.start()
        yield found
    finally:
        found.close()


def _crash_and_restart(server: PgServer) -> None:
    server.crash()
    server.start()


def _stored(server: PgServer, schema: str, sql: str, params: tuple[Any, ...]) -> list[Any]:
    """Rows of one read on the restarted server, on a connection of the test's own."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        return [tuple(row) for row in conn.execute(sql, params).fetchall()]


def _status(server: PgServer, schema: str, workflow: str, instance_id: str) -> str | None:
    rows = _stored(server, schema,
                   "SELECT status FROM memable_instances WHERE workflow = %s AND instance_id = %s",
                   (workflow, instance_id))
    return None if not rows else str(rows[0][0])


def _schema() -> str:
    return f"d_{uuid.uuid4().hex[:12]}"


def test_an_acknowledged_resume_is_not_undone_by_a_server_crash(server: PgServer) -> None:
    """The instance fails once; resume() returns and the resumed step starts (so the
    resume's claim is made); the server crashes and restarts; the step ends. The instance
    completes: the claim was durable. (When the claim committed asynchronously the crash
    undid it: the instance was Failed again, the step's write refused, nobody ran it.)"""
    schema = _schema()
    attempts: list[int] = []
    entered, release = threading.Event(), threading.Event()

    def call() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("the first attempt fails")
        entered.set()
        if not release.wait(WAIT):
            raise TimeoutError("the test never released the step")
        return "ok"

    def wf(ctx: Context) -> str:
        return ctx.step("call").run(call)

    # A long lease: no heartbeat (a durable write that would flush the claim) meanwhile.
    engine = Engine.open(server.url, schema=schema, synchronous="full", lease=600)
    engine.register("wf", wf)
    with engine:
        try:
            failed = engine.invoke("wf", instance_id="one").wait(timeout=WAIT)
            assert isinstance(failed, Failed), failed
            resumed = engine.resume("wf", "one")
            assert entered.wait(WAIT), "the resumed step never started"
            _crash_and_restart(server)
            status = _status(server, schema, "wf", "one")
            assert status == "running", f"the crash undid the resume's claim: {status}"
            release.set()
            state = resumed.wait(timeout=WAIT)
            assert isinstance(state, Completed), state
            assert resumed.result(timeout=WAIT) == "ok"
        finally:
            release.set()  # before the engine stops: it waits for the step
    assert _status(server, schema, "wf", "one") == "completed"
    assert len(attempts) == 2


def test_invoke_a_step_signal_an_end_and_cancel_are_not_undone_by_a_server_crash(
    server: PgServer,
) -> None:
    """After each call returns (and before anything else writes durably), the server
    crashes and restarts, and the store still holds what the call did."""
    schema = _schema()
    gates = {name: threading.Event() for name in ("first", "second", "after")}
    entered = {name: threading.Event() for name in gates}

    def gate(name: str) -> str:
        entered[name].set()
        if not gates[name].wait(WAIT):
            raise TimeoutError(f"the test never released step {name!r}")
        return name

    def wf(ctx: Context) -> str:
        ctx.step("first").run(lambda: gate("first"))
        ctx.step("second").run(lambda: gate("second"))
        payload = ctx.suspend("go")
        ctx.step("after").run(lambda: gate("after"))
        return f"got {payload}"

    def waits(ctx: Context) -> object:
        return ctx.suspend("never")

    engine = Engine.open(server.url, schema=schema, synchronous="full", lease=600,
                         poll_interval=0.5)
    engine.register("wf", wf)
    engine.register("waits", waits)
    with engine:
        try:
            # invoke: the instance is stored before it returns.
            inv = engine.invoke("wf", instance_id="one")
            assert entered["first"].wait(WAIT)
            _crash_and_restart(server)
            assert _status(server, schema, "wf", "one") == "running"
            # A completed step: stored before the workflow goes on to the next.
            gates["first"].set()
            assert entered["second"].wait(WAIT)
            _crash_and_restart(server)
            steps = _stored(server, schema, "SELECT key, state FROM memable_steps WHERE "
                            "instance_id = 'one' ORDER BY seq", ())
            assert steps == [("first", "completed")]
            gates["second"].set()
            assert isinstance(inv.wait(timeout=WAIT), Suspended)
            # signal: stored before it returns (its wake-up may be lost: the poll wakes).
            engine.signal("wf", "one", "go", "yes")
            assert entered["after"].wait(WAIT)
            _crash_and_restart(server)
            go = _stored(server, schema, "SELECT state, result FROM memable_steps WHERE "
                         "instance_id = 'one' AND key = 'go'", ())
            assert go == [("completed", '"yes"')]
            gates["after"].set()
            assert engine.invocation("wf", "one").result(timeout=WAIT) == "got yes"
            # The run's end: stored before its result is given.
            _crash_and_restart(server)
            assert _status(server, schema, "wf", "one") == "completed"
            # cancel: stored before it returns.
            other = engine.invoke("waits", instance_id="two")
            assert isinstance(other.wait(timeout=WAIT), Suspended)
            engine.cancel("waits", "two")
            _crash_and_restart(server)
            assert _status(server, schema, "waits", "two") == "cancelled"
        finally:
            for event in gates.values():  # before the engine stops: it waits for the steps
                event.set()
    assert _status(server, schema, "wf", "one") == "completed"


def test_a_claim_a_run_acts_on_is_not_undone_by_a_server_crash(server: PgServer) -> None:
    """A queue's claim (``concurrency=1``), then a signal's wake-up, each start a run whose
    first step starts; the server crashes and restarts while that step runs. Each claim
    stands: the instance is still running and this engine's, no other run of it starts,
    and each step runs once. (When claims committed with ``synchronous_commit`` off, the
    crash put the instance back, queued or suspended and ready, and it was run again
    beside the step still running: two at once in the queue, and the step twice.)"""
    schema = _schema()
    entered = {name: threading.Event() for name in ("queued", "woken")}
    release = threading.Event()
    calls: list[str] = []

    def gate(name: str) -> str:
        calls.append(name)
        entered[name].set()
        if not release.wait(WAIT):
            raise TimeoutError(f"the test never released step {name!r}")
        return name

    def queued(ctx: Context) -> str:
        return ctx.step("first").run(lambda: gate("queued"))

    def woken(ctx: Context) -> str:
        ctx.suspend("go")
        return ctx.step("first").run(lambda: gate("woken"))

    def stored(instance_id: str) -> tuple[Any, ...]:
        rows = _stored(server, schema, "SELECT status, owner FROM memable_instances "
                       "WHERE instance_id = %s", (instance_id,))
        return tuple(rows[0])

    # A long lease: no heartbeat (a durable write that would flush the claim) meanwhile.
    engine, store = build(server.url, schema=schema, synchronous="full", lease=600,
                          poll_interval=0.1)
    engine.queue("q", concurrency=1)
    engine.register("queued", queued, queue="q")
    engine.register("woken", woken)
    owner = store.owner  # type: ignore[attr-defined]
    with engine:
        try:
            waiting = engine.invoke("woken", instance_id="w")
            assert isinstance(waiting.wait(timeout=WAIT), Suspended)
            # The queue's claim is the last commit before the crash.
            first = engine.invoke("queued", instance_id="q1")
            second = engine.invoke("queued", instance_id="q2")
            assert entered["queued"].wait(WAIT), "the queue's first run never started"
            _crash_and_restart(server)
            assert stored("q1") == ("running", owner), "the crash undid the queue's claim"
            assert stored("q2") == ("queued", None)
            # The wake-up's claim is the last commit before the crash (after the signal's).
            engine.signal("woken", "w", "go", None)
            assert entered["woken"].wait(WAIT), "the woken run never started"
            _crash_and_restart(server)
            assert stored("w") == ("running", owner), "the crash undid the wake-up's claim"
            release.set()
            assert first.result(timeout=WAIT) == "queued"
            assert second.result(timeout=WAIT) == "queued"
            assert waiting.result(timeout=WAIT) == "woken"
        finally:
            release.set()  # before the engine stops: it waits for the steps
    assert sorted(calls) == ["queued", "queued", "woken"]
