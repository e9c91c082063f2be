"""Queue limits across processes: four worker processes consume one queue, on a file and
on PostgreSQL, while a monitor samples the store; an enqueue-only engine runs nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import POSTGRES_URL
from helpers import build, query

TESTS = Path(__file__).resolve().parent
INSTANCES = 200
WORKERS = 4


@pytest.fixture(params=["file", "postgres"])
def queue_store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The environment that points ``_queue_app`` at a file or a PostgreSQL schema."""
    if request.param == "file":
        return {"MEMABLE_QUEUE_DB": str(tmp_path / "db"), "MEMABLE_QUEUE_SCHEMA": ""}
    return {"MEMABLE_QUEUE_DB": POSTGRES_URL,
            "MEMABLE_QUEUE_SCHEMA": request.getfixturevalue("pg_schema")}


@pytest.mark.heavy
def test_four_processes_never_pass_the_queues_limits_and_run_everything_once(
    queue_store: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """concurrency=3 and rate=(20, 1 s), 200 instances, 4 worker processes: the monitor
    never sees more than 3 running nor 21 starts within a second; every instance
    completes; each step ran once, in a worker, never in the enqueueing process."""
    log = tmp_path / "log"
    env = {**os.environ, **queue_store, "MEMABLE_QUEUE_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    sys.path.insert(0, str(TESTS))
    from _queue_app import make

    web = make(lambda *args, **o: build(*args, **o).engine, queues=())  # enqueues only
    web.start()
    workers: list[subprocess.Popen[bytes]] = []
    most_running, starts, done = 0, {}, 0
    try:
        for i in range(INSTANCES):
            web.invoke("job", i, instance_id=f"j{i:03d}")
        workers = [
            subprocess.Popen([sys.executable, "-m", "memable", "worker", "_queue_app:engine",
                              "--queues", "jobs"], cwd=TESTS, env=env,
                             stderr=subprocess.DEVNULL)
            for _ in range(WORKERS)
        ]
        pause, deadline = threading.Event(), time.monotonic() + 120
        while done < INSTANCES and time.monotonic() < deadline:
            [(running,)] = query(web, "SELECT count(*) FROM memable_instances "
                                 "WHERE queue = 'jobs' AND status = 'running'")
            most_running = max(most_running, int(running))
            for at, n in query(web, "SELECT at, count(*) FROM memable_queue_starts GROUP BY at"):
                starts[at] = max(starts.get(at, 0), n)
            [(completed,)] = query(web, "SELECT count(*) FROM memable_instances "
                                   "WHERE status = 'completed'")
            done = int(completed)
            pause.wait(0.02)  # a sample every 20 ms: each start stays stored for a second
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            proc.wait(timeout=60)
        web.close()
    assert done == INSTANCES
    assert most_running <= 3
    times: list[Any] = sorted(at for at, n in starts.items() for _ in range(n))
    assert len(times) == INSTANCES
    assert all(times[i + 20] - times[i] >= 1.0 for i in range(len(times) - 20))
    lines = log.read_text().splitlines()
    ran = sorted(line.split()[1] for line in lines)
    assert ran == [f"j{i:03d}" for i in range(INSTANCES)]
    pids = {int(line.split()[0]) for line in lines}
    assert pids <= {proc.pid for proc in workers}
    assert os.getpid() not in pids
    assert len(pids) >= 2
