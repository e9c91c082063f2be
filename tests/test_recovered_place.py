"""A queued instance recovered from a dead engine keeps its place in its queue (the time it
first became runnable), is logged at WARNING once by the engine that takes it, naming the
dead owner and the step in flight, and ``memable show`` counts the execution lost with it.

A real process runs the instance through the queue and is SIGKILLed inside a step.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import Result
from helpers import PROCS, cli, until

from memable import Context, Engine, Queued

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
    assert view["recovered"] == {"times": 1, "step_in_flight": "s3"}
