"""An instance recovered from a dead engine: a queued one keeps its place in its queue (the
time it first became runnable); the engine that takes it logs one WARNING naming the dead
owner by host and pid, whether it died or stalled past its lease, and the step in flight;
that step's ``attempts`` counts the execution lost with the owner, and ``memable show`` and
the dashboard say so (``executed 2x: engine host:pid died during it``).

A real process runs the instance and is SIGKILLed (or SIGSTOPped) inside a step.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from helpers import PROCS, cli, query, until, write
from werkzeug.test import Client

from memable import Completed, Context, Engine, Queued
from memable.web import app

WAIT = 30.0


@pytest.fixture(params=["file", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """How to reach the store: a file, or a PostgreSQL schema of its own."""
    if request.param == "file":
        return {"target": str(tmp_path / "store.db")}
    from conftest import POSTGRES_URL

    return {"target": POSTGRES_URL, "schema": request.getfixturevalue("pg_schema")}


def _show(store: dict[str, Any], *args: str) -> Result:
    schema = ["--schema", store["schema"]] if "schema" in store else []
    return cli("show", store["target"], "ten", "crash", *args, *schema)


def _in_flight(store: dict[str, Any]) -> str | None:
    result = _show(store, "--json")
    if result.exit_code != 0:
        return None
    flight = json.loads(result.stdout)["in_flight"]
    return None if flight is None else str(flight["key"])


def test_a_recovered_queued_instance_keeps_its_place_and_is_logged_once(
    store: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A queued instance whose engine process is SIGKILLed inside step 3, while newer
    instances queue behind it, is recovered by the next engine ahead of them, logged as
    recovered once, and ``memable show`` says step s3 was in flight and executed twice
    because the engine died."""
    log = tmp_path / "log"
    env = {**os.environ, "MEMABLE_PROC_SCHEMA": store.get("schema", "")}
    child = subprocess.Popen(
        [sys.executable, PROCS, "queued", store["target"], str(log), "3"],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "in step 3\n"
        # Newer jobs queue behind it while it holds the queue's one slot.
        web = Engine.open(**store, queues=())
        web.queue("q", concurrency=1)
        web.register("ten", lambda ctx: None, queue="q")
        with web:
            for i in range(3):
                assert web.invoke("ten", instance_id=f"newer-{i}").state == Queued()
        until(lambda: _in_flight(store) == "s3", WAIT)  # the child's heartbeat noted it
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        if child.stdout is not None:
            child.stdout.close()

    started: list[str] = []

    def ten(ctx: Context) -> int:
        started.append(ctx.instance_id)
        return sum(ctx.step(f"s{i}").run(lambda i=i: i) for i in range(1, 11))

    worker = Engine.open(**store, poll_interval=0.05)
    worker.queue("q", concurrency=1)
    worker.register("ten", ten, queue="q")
    with caplog.at_level(logging.WARNING, logger="memable"), worker:
        assert worker.invocation("ten", "crash").result(timeout=WAIT) == 55
        for i in range(3):
            worker.invocation("ten", f"newer-{i}").result(timeout=WAIT)
    # It was runnable first: it starts first, ahead of the newer ones.
    assert started == ["crash", "newer-0", "newer-1", "newer-2"]
    recoveries = [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()]
    assert len(recoveries) == 1, recoveries
    assert "which died; step 's3' was in flight and runs again" in recoveries[0]
    lines = _show(store).stdout.splitlines()
    assert "recovered  1, step s3 was in flight" in lines
    view = json.loads(_show(store, "--json").stdout)
    dead = f"{socket.gethostname()}:{child.pid} died"
    assert view["recovered"] == {
        "times": 1, "step_in_flight": "s3", "lost_by": dead,
        "executed": {"key": "s3", "times": 2, "why": f"engine {dead} during it"},
    }


def _crashing_child(store: dict[str, Any], log: Path) -> subprocess.Popen[str]:
    """A process that runs ten/crash and hangs inside step s3, once its body ran (the
    charge happened) and its heartbeat stored s3 as the step in flight."""
    env = {**os.environ, "MEMABLE_PROC_SCHEMA": store.get("schema", "")}
    child = subprocess.Popen(
        [sys.executable, PROCS, "crash", store["target"], str(log), "3"],
        stdout=subprocess.PIPE, text=True, env=env,
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "in step 3\n"
    until(lambda: _in_flight(store) == "s3", WAIT)
    return child


def _recover(store: dict[str, Any], log: Path, caplog: pytest.LogCaptureFixture) -> list[str]:
    """Another engine takes ten/crash over and completes it; the recovery WARNINGs."""
    def body(i: int) -> int:
        with log.open("a") as file:
            file.write(f"s{i}\n")
        return i

    worker = Engine.open(**store, poll_interval=0.05)
    worker.register("ten", lambda ctx: sum(
        ctx.step(f"s{i}").run(body, i) for i in range(1, 11)))
    with caplog.at_level(logging.WARNING, logger="memable"), worker:
        assert worker.invocation("ten", "crash").result(timeout=WAIT) == 55
        attempts = {step.key: step.attempts for step in worker.steps("ten", "crash")}
    # s3's body ran twice (once in each engine); its record counts both executions.
    assert log.read_text().splitlines().count("s3") == 2
    assert attempts == {f"s{i}": 2 if i == 3 else 1 for i in range(1, 11)}
    return [r.getMessage() for r in caplog.records if "recovered" in r.getMessage()]


def _shown(store: dict[str, Any], line: str) -> None:
    """``memable show`` and the dashboard's instance page both show ``line``."""
    assert line in _show(store).stdout
    served = app(store["target"], schema=store.get("schema"))
    try:
        page = Client(served).get("/instance?workflow=ten&id=crash")
    finally:
        served.close()  # it opened the store: its connection is closed here, not by GC
    assert page.status_code == 200
    assert line in page.text


def test_a_step_executed_twice_by_an_engine_that_died_counts_and_says_so(
    store: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """An engine SIGKILLed inside a step after its side effect: once another engine
    recovers and completes the instance, the step's ``attempts`` is 2, the WARNING names
    the dead engine by host and pid and says it died, and ``memable show`` and the
    dashboard print ``executed 2x: engine host:pid died during it``."""
    log = tmp_path / "log"
    child = _crashing_child(store, log)
    os.kill(child.pid, signal.SIGKILL)
    child.wait(timeout=60)
    assert child.stdout is not None
    child.stdout.close()
    dead = f"{socket.gethostname()}:{child.pid}"
    recoveries = _recover(store, log, caplog)
    assert len(recoveries) == 1, recoveries
    assert (f"recovered the instance from engine {dead}, which died; step 's3' was in "
            "flight and runs again") in recoveries[0]
    _shown(store, f"step s3 executed 2x: engine {dead} died during it")


def test_an_engine_stalled_past_its_lease_is_said_to_have_stalled(
    store: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """An engine SIGSTOPped inside a step (its process lives on) loses the instance when
    its lease runs out: the engine that takes it over says it stalled, not that it died,
    and the step's lost execution is counted all the same."""
    log = tmp_path / "log"
    child = _crashing_child(store, log)
    os.kill(child.pid, signal.SIGSTOP)
    try:
        stalled = f"{socket.gethostname()}:{child.pid}"
        recoveries = _recover(store, log, caplog)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        if child.stdout is not None:
            child.stdout.close()
    assert len(recoveries) == 1, recoveries
    assert (f"recovered the instance from engine {stalled}, which stalled past its lease; "
            "step 's3' was in flight and runs again") in recoveries[0]
    _shown(store, f"step s3 executed 2x: engine {stalled} stalled past its lease during it")


def test_a_recovery_counts_only_the_attempt_whose_end_was_never_stored(
    make_engine: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """The step a dead owner's heartbeat named in flight counts as lost only if that
    attempt's end was never stored: an attempt that failed, was stored, and was followed
    by the owner's death (during a backoff, say) is not counted twice."""
    calls: list[str] = []

    def flaky(instance_id: str) -> str:
        calls.append(instance_id)
        if calls.count(instance_id) == 1:
            raise ValueError("first call fails")
        return "ok"

    engine = make_engine(poll_interval=0.05)
    engine.register("wf", lambda ctx: ctx.step("s1").run(flaky, ctx.instance_id))
    ghost = "ghost-host:99:0123456789ab"  # an owner whose row is gone: it died
    with caplog.at_level(logging.WARNING, logger="memable"), engine:
        for instance_id in ("stored", "lost"):
            engine.invoke("wf", instance_id=instance_id).wait(timeout=WAIT)
            [(started,)] = query(engine,
                                 "SELECT started_at FROM memable_steps WHERE instance_id = ?",
                                 (instance_id,))
            # The ghost's heartbeat named s1 in flight: the attempt stored ("stored"), or
            # a later one it never stored ("lost").
            later = datetime.fromisoformat(started) + timedelta(seconds=1)
            in_flight = started if instance_id == "stored" else later.isoformat()
            write(engine, "UPDATE memable_instances SET status = 'running', owner = ?, "
                  "step_key = 's1', step_started = ?, completed_at = NULL WHERE instance_id = ?",
                  (ghost, in_flight, instance_id))
        for instance_id in ("stored", "lost"):
            until(lambda i=instance_id: engine.invocation("wf", i).state == Completed(), WAIT)
        attempts = {i: [s.attempts for s in engine.steps("wf", i)] for i in ("stored", "lost")}
    assert attempts == {"stored": [2], "lost": [3]}
    recoveries = sorted(r.getMessage() for r in caplog.records if "recovered" in r.getMessage())
    assert recoveries == [
        "wf/lost [s1]: recovered the instance from engine ghost-host:99, which died; "
        "step 's1' was in flight and runs again",
        "wf/stored: recovered the instance from engine ghost-host:99, which died",
    ]


def test_a_recovery_counts_a_lost_step_after_a_signal_not_reached_yet(
    open_shared: Any,
) -> None:
    """A step lost in flight with no row yet gets its counted row at the run's next place,
    not after a signal stored early for a key the run has not reached (``UNREACHED``,
    after every step): on PostgreSQL the claim's ``MAX(seq) + 1`` overflowed the column
    and the instance could never be recovered."""
    calls: list[str] = []
    blocked, go = threading.Event(), threading.Event()

    def first_blocks() -> str:
        calls.append("s1")
        if len(calls) == 1:
            blocked.set()
            go.wait(WAIT)
        return "ok"

    def wf(ctx: Context) -> str:
        ctx.step("s0").run(lambda: "zero")
        ctx.step("s1").run(first_blocks)
        return str(ctx.suspend("approve"))

    first, second = open_shared(poll_interval=0.05), open_shared(poll_interval=0.05)
    for engine in (first, second):
        engine.register("wf", wf)
    ghost = "ghost-host:99:0123456789ab"  # an owner whose row is gone: it died
    try:
        with first:
            first.invoke("wf", instance_id="i")
            assert blocked.wait(WAIT)
            first.signal("wf", "i", "approve", "yes")  # stored before the run reaches it
            # The ghost had s1 in flight when it died; the second engine recovers it.
            write(first, "UPDATE memable_instances SET owner = ?, step_key = 's1', "
                  "step_started = ? WHERE instance_id = 'i'",
                  (ghost, datetime.now().isoformat()))
            with second:
                assert second.invocation("wf", "i").result(WAIT) == "yes"
                steps = [(s.key, s.attempts) for s in second.steps("wf", "i")]
            go.set()
    finally:
        go.set()
    assert steps == [("s0", 1), ("s1", 2), ("approve", 1)]
    assert calls == ["s1", "s1"]
