"""The same workloads on DBOS Transact, for the comparison column: on a SQLite file, or
with ``--store URL`` on the same PostgreSQL server (a database of its own per
workload, dropped afterwards; DBOS wakes ``recv`` by LISTEN/NOTIFY there).

Imported only in a worker process whose Python has ``dbos`` installed
(``python -m benchmarks --dbos PYTHON``); DBOS is never a dependency of
memable. Definitions follow the memable workloads: W1 per sequential step,
W2 per step of M three-step workflows started at once, W3 per replayed step
(``DBOS.rewind_workflow``; DBOS's ``resume_workflow`` skips failed ones), W4
a zero sleep then one step (DBOS writes no checkpoint for ``sleep(0)``), W5
``DBOS.send`` to a workflow parked in ``DBOS.recv``, sent at a random phase
of the default 1 s notification poll on SQLite (at once on PostgreSQL).
"""

from __future__ import annotations

import random
import sqlite3
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dbos import DBOS, SetWorkflowID

from ._stats import latencies

COUNTS: Counter[str] = Counter()
STATE: dict[str, Any] = {}
READY: dict[str, threading.Event] = {}


class Wrong(Exception):
    """A DBOS workload produced a wrong result."""


def check(ok: bool, message: str) -> None:
    if not ok:
        raise Wrong(message)


@DBOS.step()
def small(i: int) -> dict[str, Any]:
    COUNTS["small"] += 1
    return {"i": i, "s": "x" * 32}


@DBOS.workflow()
def steps(n: int) -> int:
    return sum(small(i)["i"] for i in range(n))


@DBOS.workflow()
def three(j: int) -> int:
    return sum(small(3 * j + k)["i"] for k in range(3))


@DBOS.step()
def last(n: int) -> str:
    if STATE.get("fail"):
        raise RuntimeError("fails the first run")
    STATE["end"] = time.perf_counter()
    return "done"


@DBOS.workflow()
def replay(n: int) -> str:
    STATE["start"] = time.perf_counter()
    for i in range(n):
        small(i)
    result = last(n)
    STATE["done"].set()
    return result


@DBOS.workflow()
def timer(k: int) -> int:
    DBOS.sleep(0)
    return small(k)["i"]


@DBOS.workflow()
def parked() -> Any:
    workflow_id = DBOS.workflow_id
    assert workflow_id is not None
    READY[workflow_id].set()
    return DBOS.recv("bench", timeout_seconds=60)


def _launch(tmp: Path, p: dict[str, Any]) -> None:
    url = f"sqlite:///{tmp / 'dbos.sqlite'}"
    if p.get("store"):
        _admin(p["store"], f'CREATE DATABASE "{p["schema"]}"')
        url = _database_url(p)
    DBOS(config={"name": "memable-bench", "system_database_url": url, "log_level": "WARNING"})
    DBOS.launch()


def _destroy(p: dict[str, Any]) -> None:
    DBOS.destroy()
    if p.get("store"):
        _admin(p["store"], f'DROP DATABASE IF EXISTS "{p["schema"]}" WITH (FORCE)')


def _database_url(p: dict[str, Any]) -> str:
    """The server's URL with the workload's own database (named like its schema)."""
    from sqlalchemy.engine import make_url  # DBOS's own dependency

    url = make_url(p["store"]).set(drivername="postgresql", database=p["schema"])
    return url.render_as_string(hide_password=False)


def _admin(url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(statement)


def step_throughput(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    n = p["n"]
    _launch(tmp, p)
    try:
        with SetWorkflowID("warm-up"):
            steps(10)
        COUNTS.clear()
        start = time.perf_counter()
        with SetWorkflowID("w1"):
            total = steps(n)
        seconds = time.perf_counter() - start
        check(total == sum(range(n)) and COUNTS["small"] == n, "DBOS W1 wrong")
    finally:
        _destroy(p)
    return {"per_op_us": seconds / n * 1e6, "seconds": seconds, "n": n}


def workflow_throughput(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    m = p["m"]
    _launch(tmp, p)
    try:
        DBOS.start_workflow(three, 10**6).get_result()
        COUNTS.clear()
        start = time.perf_counter()
        handles = [DBOS.start_workflow(three, j) for j in range(m)]
        results = [h.get_result() for h in handles]
        seconds = time.perf_counter() - start
        check(results == [9 * j + 3 for j in range(m)], "DBOS W2 wrong results")
        check(COUNTS["small"] == 3 * m, "DBOS W2 step count")
    finally:
        _destroy(p)
    return {"per_op_us": seconds / (3 * m) * 1e6, "seconds": seconds, "n": m}


def replay_workload(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    n = p["n"]
    _launch(tmp, p)
    try:
        STATE.update(fail=True, done=threading.Event())
        try:
            with SetWorkflowID("w3"):
                replay(n)
            raise Wrong("DBOS W3 first run did not fail")
        except RuntimeError:
            pass
        COUNTS.clear()
        STATE.update(fail=False, done=threading.Event())
        handle = DBOS.rewind_workflow("w3", start_step=n + 1)
        check(STATE["done"].wait(120), "DBOS W3 rewind did not finish")
        check(handle.get_result(polling_interval_sec=0.005) == "done", "DBOS W3 result")
        check(COUNTS["small"] == 0, "DBOS W3 a stored step ran again")
    finally:
        _destroy(p)
    seconds = STATE["end"] - STATE["start"]
    return {"per_op_us": seconds / n * 1e6, "seconds": seconds, "n": n}


def timer_latency(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    _launch(tmp, p)
    samples = []
    try:
        for k in range(-1, p["reps"]):
            start = time.perf_counter()
            result = DBOS.start_workflow(timer, k).get_result()
            if k >= 0:
                samples.append(time.perf_counter() - start)
            check(result == k, "DBOS W4 wrong result")
    finally:
        _destroy(p)
    return latencies(samples)


def signal_roundtrip(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    _launch(tmp, p)
    rng = random.Random(12345)
    samples = []
    try:
        for k in range(-1, p["reps"]):
            workflow_id = f"w5-{k}"
            READY[workflow_id] = threading.Event()
            with SetWorkflowID(workflow_id):
                handle = DBOS.start_workflow(parked)
            check(READY[workflow_id].wait(30), "DBOS W5 never reached recv")
            # recv is parked once it has checkpointed its timeout as a sleep row.
            while not _parked(tmp, p, workflow_id):
                time.sleep(0.001)  # polling DBOS's own table: it offers no event
            if not p.get("store"):  # a random phase of DBOS's 1 s poll (SQLite only)
                time.sleep(rng.uniform(0, 1.0))
            start = time.perf_counter()
            DBOS.send(workflow_id, k, topic="bench")
            result = handle.get_result()
            if k >= 0:
                samples.append(time.perf_counter() - start)
            check(result == k, "DBOS W5 wrong payload")
    finally:
        _destroy(p)
    return latencies(samples)


def _parked(tmp: Path, p: dict[str, Any], workflow_id: str) -> bool:
    if p.get("store"):
        import psycopg

        with psycopg.connect(_database_url(p), autocommit=True) as pg:
            found = pg.execute(
                "SELECT count(*) FROM dbos.operation_outputs WHERE workflow_uuid = %s "
                "AND function_name = 'DBOS.sleep'",
                (workflow_id,),
            ).fetchone()
            return bool(found and found[0])
    conn = sqlite3.connect(f"file:{tmp / 'dbos.sqlite'}?mode=ro", uri=True, timeout=30)
    try:
        row = conn.execute(
            "SELECT count(*) FROM operation_outputs WHERE workflow_uuid = ? "
            "AND function_name = 'DBOS.sleep'",
            (workflow_id,),
        ).fetchone()
        return bool(row[0])
    finally:
        conn.close()


WORKLOADS = {
    "step_throughput": step_throughput,
    "workflow_throughput": workflow_throughput,
    "replay": replay_workload,
    "timer_latency": timer_latency,
    "signal_roundtrip": signal_roundtrip,
}
