"""The memable workloads. Each runs in a fresh process on a fresh store: a file, or a
PostgreSQL schema of its own (``--store URL``).

Every workload checks its own results (values, how many times each step body
ran, what the store holds) and raises ``BenchFailure`` when one is wrong.
"""

from __future__ import annotations

import resource
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from memable import Completed, Context, Engine, MetadataStatus, Suspended
from memable._engine import access

from ._stats import latencies


class BenchFailure(Exception):
    """A workload produced a wrong result."""


def check(ok: bool, message: str) -> None:
    if not ok:
        raise BenchFailure(message)


class Bodies:
    """Step bodies that count their executions (they run on worker threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards calls
        self.calls: Counter[Any] = Counter()

    def small(self, i: int) -> dict[str, Any]:
        with self._lock:
            self.calls[i] += 1
        return {"i": i, "s": "x" * 32}

    def tagged(self, key: Any) -> int:
        with self._lock:
            self.calls[key] += 1
        return 1


def _engine(tmp: Path, name: str, p: dict[str, Any]) -> Engine:
    """A fresh engine: on a file in ``tmp``, or in the PostgreSQL schema the worker made."""
    options: dict[str, Any] = {"synchronous": p["synchronous"], "max_workers": p["threads"]}
    if p.get("store"):
        return Engine.open(p["store"], schema=p["schema"], **options)
    return Engine.open(tmp / f"{name}.db", **options)


def _sequential(bodies: Bodies) -> Any:
    def steps(ctx: Context, n: int) -> int:
        total = 0
        for i in range(n):
            total += ctx.step(f"s{i}").run(bodies.small, i)["i"]
        return total

    return steps


def step_throughput(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """W1: one workflow of N sequential steps; microseconds per step."""
    n = p["n"]
    bodies = Bodies()
    engine = _engine(tmp, "w1", p)
    engine.register("steps", _sequential(bodies))
    with engine:
        # Warm the store as the floor warms its file: as many rows first, so
        # that both are timed with the WAL at its working size.
        engine.invoke("steps", p["warm"], instance_id="warm-up").result(timeout=600)
        bodies.calls.clear()
        start = time.perf_counter()
        total = engine.invoke("steps", n, instance_id="w1").result(timeout=600)
        seconds = time.perf_counter() - start
        stored = engine.steps("steps", "w1")
    check(total == sum(range(n)), f"W1 result {total} != {sum(range(n))}")
    check(bodies.calls == Counter(range(n)), "W1 a step body ran other than once")
    check(len(stored) == n and all(s.state == "completed" for s in stored), "W1 rows")
    return {"per_op_us": seconds / n * 1e6, "seconds": seconds, "n": n}


def workflow_throughput(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """W2: M three-step workflows invoked at once; wall microseconds per step."""
    m = p["m"]
    bodies = Bodies()

    def three(ctx: Context, j: int) -> int:
        return sum(ctx.step(f"s{k}").run(bodies.tagged, (j, k)) for k in range(3))

    engine = _engine(tmp, "w2", p)
    engine.register("three", three)
    with engine:
        engine.invoke("three", -1).result(timeout=60)  # warm-up
        bodies.calls.clear()
        start = time.perf_counter()
        invocations = [engine.invoke("three", j) for j in range(m)]
        results = [inv.result(timeout=600) for inv in invocations]
        seconds = time.perf_counter() - start
        statuses = {meta.status for _, meta in engine.list_instances("three")}
    check(results == [3] * m, "W2 a workflow returned a wrong result")
    check(bodies.calls == Counter({(j, k): 1 for j in range(m) for k in range(3)}), "W2 runs")
    check(statuses == {MetadataStatus.Completed()}, f"W2 statuses {statuses}")
    return {
        "per_op_us": seconds / (3 * m) * 1e6,
        "seconds": seconds,
        "n": m,
        "workflows_per_s": m / seconds,
    }


def _replays(tmp: Path, p: dict[str, Any], sizes: list[int]) -> dict[int, float]:
    """Seconds per replayed step for instances of each size, on one engine.

    One instance per size; each is resumed three times, the sizes taking
    turns, so that every size sees the same moments of this noisy machine
    (whose CPU speed can change by 1.7x within a minute). The first resume
    continues the failed instance, the next two replay the completed one;
    each times the replayed steps only. Return the median of the three.
    """
    bodies = Bodies()
    fail = [True]
    marks: dict[str, float] = {}

    def last() -> str:
        if fail[0]:
            raise RuntimeError("fails the first run")
        return "done"

    def wf(ctx: Context, n: int) -> str:
        marks["start"] = time.perf_counter()
        for i in range(n):
            ctx.step(f"s{i}").run(bodies.small, i)
        marks["end"] = time.perf_counter()
        return ctx.step("last").run(last)

    engine = _engine(tmp, "w3", p)
    engine.register("replay", wf)
    times: dict[int, list[float]] = {n: [] for n in sizes}
    with engine:
        for n in sizes:
            first = engine.invoke("replay", n, instance_id=f"w3-{n}")
            check(first.wait(timeout=600) != Completed(), "W3 the first run did not fail")
        fail[0] = False
        for _ in range(3):
            for n in sizes:
                result = engine.resume("replay", f"w3-{n}").result(timeout=600)
                check(result == "done", f"W3 result {result!r}")
                times[n].append((marks["end"] - marks["start"]) / n)
    expected = Counter(i for n in sizes for i in range(n))
    check(bodies.calls == expected, "W3 a stored step body ran again")
    return {n: sorted(t)[1] for n, t in times.items()}


def replay(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """W3: resume an instance with N stored steps; microseconds per replayed step."""
    per_step = _replays(tmp, p, [p["n"]])[p["n"]]
    return {"per_op_us": per_step * 1e6, "n": p["n"]}


def replay_growth(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """W6 W3: W3 at each size of ``sizes``, in one process; microseconds per step by size."""
    per_step = _replays(tmp, p, p["sizes"])
    return {"per_op_us_by_n": {str(n): t * 1e6 for n, t in per_step.items()}}


def timer_latency(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """W4: a zero timer then one step, invoke to result; median and p95."""
    bodies = Bodies()

    def wf(ctx: Context, j: int) -> int:
        ctx.timer("zero", 0)
        return ctx.step("after").run(bodies.tagged, j)

    engine = _engine(tmp, "w4", p)
    engine.register("timer", wf)
    samples = []
    with engine:
        engine.invoke("timer", -1).result(timeout=60)
        for j in range(p["reps"]):
            start = time.perf_counter()
            result = engine.invoke("timer", j).result(timeout=60)
            samples.append(time.perf_counter() - start)
            check(result == 1, "W4 wrong result")
    check(all(bodies.calls[j] == 1 for j in range(p["reps"])), "W4 a step ran other than once")
    return latencies(samples)


def signal_roundtrip(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """W5: signal to a parked instance, to its result; median and p95."""

    def wf(ctx: Context) -> int:
        payload = int(ctx.suspend("go"))
        return ctx.step("after").run(lambda: payload + 1)

    engine = _engine(tmp, "w5", p)
    engine.register("signal", wf)
    samples = []
    with engine:
        for j in range(-1, p["reps"]):
            inv = engine.invoke("signal")
            check(inv.wait(timeout=60) == Suspended("go"), "W5 did not suspend")
            start = time.perf_counter()
            result = engine.signal("signal", inv.instance_id, "go", j).result(timeout=60)
            if j >= 0:
                samples.append(time.perf_counter() - start)
            check(result == j + 1, "W5 wrong result")
    return latencies(samples)


_SIGNALLER = """
import sys, time
from memable import Engine
engine = Engine.open(sys.argv[1], schema=sys.argv[2] or None, poll_interval=60)
with engine:  # no workflow registered: it only stores signals
    print("ready", flush=True)
    for line in sys.stdin:
        instance_id, value = line.split()
        sent = time.monotonic()
        engine.signal("signal", instance_id, "go", int(value))
        print(sent, flush=True)
"""


def signal_remote(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """W5 across processes: another engine process signals a parked instance; from the
    moment it sends to the result here (one clock: CLOCK_MONOTONIC is system-wide)."""

    def wf(ctx: Context) -> int:
        payload = int(ctx.suspend("go"))
        return ctx.step("after").run(lambda: payload + 1)

    engine = _engine(tmp, "w5x", p)
    engine.register("signal", wf)
    target = p["store"] or str(tmp / "w5x.db")
    child = subprocess.Popen(
        [sys.executable, "-c", _SIGNALLER, target, p.get("schema") or ""],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )
    assert child.stdin is not None
    assert child.stdout is not None
    samples = []
    try:
        with engine:
            check(child.stdout.readline() == "ready\n", "W5x the signalling process failed")
            for j in range(-1, p["reps"]):
                inv = engine.invoke("signal")
                check(inv.wait(timeout=60) == Suspended("go"), "W5x did not suspend")
                child.stdin.write(f"{inv.instance_id} {j}\n")
                child.stdin.flush()
                result = inv.result(timeout=60)
                done = time.monotonic()
                sent = float(child.stdout.readline())
                if j >= 0:
                    samples.append(done - sent)
                check(result == j + 1, "W5x wrong result")
    finally:
        child.stdin.close()
        child.wait(timeout=60)
    return latencies(samples)


def suspended(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """Many suspended instances hold no thread; peak RSS of the process."""
    count = p["count"]
    engine = _engine(tmp, "suspended", p)
    engine.register("parked", lambda ctx: ctx.suspend("go"))
    engine.register("quick", lambda ctx: ctx.step("q").run(lambda: "quick"))
    threads_before = threading.active_count()
    with engine:
        for start in range(0, count, 1000):
            batch = [engine.invoke("parked") for _ in range(start, min(count, start + 1000))]
            for inv in batch:
                check(inv.wait(timeout=120) == Suspended("go"), "a parked instance ran on")
        quick_start = time.perf_counter()
        check(engine.invoke("quick").result(timeout=60) == "quick", "a new workflow failed")
        quick_ms = (time.perf_counter() - quick_start) * 1e3
        busy = len(access.in_flight(engine))
        threads = threading.active_count() - threads_before
        parked = sum(
            meta.status == MetadataStatus.Suspended("go")
            for _, meta in engine.list_instances("parked")
        )
    check(parked == count, f"{parked} of {count} instances are suspended")
    check(busy == 0, f"{busy} runs still hold a worker")
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {
        "per_op_us": rss_mb,
        "rss_mb": rss_mb,
        "n": count,
        "threads": threads,
        "quick_ms": quick_ms,
    }


WORKLOADS = {
    "step_throughput": step_throughput,
    "workflow_throughput": workflow_throughput,
    "replay": replay,
    "replay_growth": replay_growth,
    "timer_latency": timer_latency,
    "signal_roundtrip": signal_roundtrip,
    "signal_remote": signal_remote,
    "suspended": suspended,
}
