"""W7 and W8, the memable side (the DBOS side: ``_dbos_queues``): a queue of concurrency 8.

W7 ``children_queue``: one parent starts ``n`` one-step children through the
queue (``ctx.children(..., queue=)``) and sums their outputs; seconds from
the invoke until the parent's result, per child. W8 ``queue_throughput``:
``m`` one-step workflows are invoked onto the queue at once; seconds from the
first invoke to the last result, per workflow. Each checks its results and
that every step ran once.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from memable import Context

from ._workloads import Bodies, _engine, check


def _one_step(bodies: Bodies) -> Any:
    def one(ctx: Context, i: int) -> int:
        return int(ctx.step("small").run(bodies.small, i)["i"])

    return one


def children_queue(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """W7: a parent with ``n`` children through a queue of concurrency 8."""
    n = p["n"]
    bodies = Bodies()
    engine = _engine(tmp, "w7", p)
    engine.queue("w7", concurrency=p.get("concurrency", 8))
    engine.register("child", _one_step(bodies), queue="w7")

    def parent(ctx: Context, count: int) -> int:
        return sum(ctx.children("kids", "child", range(count)))

    engine.register("parent", parent)
    with engine:
        engine.invoke("parent", 8, instance_id="warm-up").result(timeout=600)
        bodies.calls.clear()
        start = time.perf_counter()
        total = engine.invoke("parent", n, instance_id="w7").result(timeout=1800)
        seconds = time.perf_counter() - start
        check(total == sum(range(n)), "W7 wrong sum")
        check(sorted(bodies.calls) == list(range(n)), "W7 not every child ran")
        check(set(bodies.calls.values()) == {1}, "W7 a child's step ran twice")
    return {"per_op_us": seconds / n * 1e6, "seconds": seconds, "n": n}


def queue_throughput(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """W8: ``m`` one-step workflows invoked onto a queue of concurrency 8 at once."""
    m = p["m"]
    bodies = Bodies()
    engine = _engine(tmp, "w8", p)
    engine.queue("w8", concurrency=p.get("concurrency", 8))
    engine.register("one", _one_step(bodies), queue="w8")
    with engine:
        engine.invoke("one", 10**6, instance_id="warm-up").result(timeout=600)
        bodies.calls.clear()
        start = time.perf_counter()
        invocations = [engine.invoke("one", i) for i in range(m)]
        results = [inv.result(timeout=1800) for inv in invocations]
        seconds = time.perf_counter() - start
        check(results == list(range(m)), "W8 wrong results")
        check(set(bodies.calls.values()) == {1} and len(bodies.calls) == m, "W8 step count")
    return {"per_op_us": seconds / m * 1e6, "seconds": seconds, "n": m,
            "throughput_per_s": m / seconds}


#: W7 and W8, by the name the worker runs them under.
QUEUE_WORKLOADS = {"children_queue": children_queue, "queue_throughput": queue_throughput}
