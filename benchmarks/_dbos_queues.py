"""W7 and W8 on DBOS Transact queues, for the comparison column (see ``_dbos``).

W7 ``children_queue``: one parent workflow enqueues ``n`` one-step child
workflows on a queue of concurrency 8 and sums their results; seconds from
starting the parent until its result is back, per child. W8
``queue_throughput``: the main thread enqueues ``m`` one-step workflows on
such a queue at once, then waits on every handle; seconds from the first
enqueue to the last result, per workflow.

DBOS is run with its defaults, as users run it. In DBOS 3.4.0 a queue is a
row in the system database: ``Queue(...)`` refuses to be built, and
``DBOS.register_queue(name, global_concurrency=8)`` (``concurrency`` is its
deprecated alias) needs a launched DBOS, so the queues are registered after
``DBOS.launch()``. The queue manager thread looks for new queues every 1 s,
and each queue's worker thread wakes every ``polling_interval_sec``, 1.0 s
by default (``DEFAULT_QUEUE_POLLING_INTERVAL_SEC`` in ``dbos/_queue.py``,
jittered by 5 %, doubled up to 120 s after a serialization conflict). An
enqueue does not wake it. Each wake-up claims at most the concurrency
limit minus the queue's running workflows, so one-step workflows run at
about 8 per second whatever the store. The handles ``enqueue`` returns poll
the workflow's status every 1.0 s (``DEFAULT_POLLING_INTERVAL`` in
``dbos/_core.py``) until it is done. Each workload first runs one queued
workflow, untimed, so its queue's worker thread is running when timing
starts.

The worker (``benchmarks.__main__``) runs them from ``QUEUE_WORKLOADS`` beside
``_dbos.WORKLOADS``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from dbos import DBOS, Queue, SetWorkflowID

from ._dbos import _destroy, _launch, check

CONCURRENCY = 8
COUNTS: Counter[str] = Counter()
QUEUES: dict[str, Queue] = {}
STATE: dict[str, float] = {}
_counts_lock = threading.Lock()  # eight children run their steps at once


@DBOS.step()
def tick(i: int) -> dict[str, Any]:
    with _counts_lock:
        COUNTS["tick"] += 1
    return {"i": i, "s": "x" * 32}


@DBOS.workflow()
def one_step(i: int) -> int:
    return int(tick(i)["i"])


@DBOS.workflow()
def fan_out(n: int) -> int:
    handles = [QUEUES["w7"].enqueue(one_step, i) for i in range(n)]
    STATE["enqueued"] = time.perf_counter()
    return sum(handle.get_result() for handle in handles)


def _queue(tmp: Path, p: dict[str, Any], name: str) -> Queue:
    """Launch DBOS, register the queue, and run one workflow through it, untimed."""
    _launch(tmp, p)
    queue = DBOS.register_queue(name, global_concurrency=p.get("concurrency", CONCURRENCY))
    QUEUES[name] = queue
    check(queue.enqueue(one_step, -1).get_result() == -1, f"DBOS {name} warm-up wrong")
    return queue


def children_queue(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    n = p.get("n", 1000)
    _queue(tmp, p, "w7")
    try:
        COUNTS.clear()
        start = time.perf_counter()
        with SetWorkflowID("w7"):
            handle = DBOS.start_workflow(fan_out, n)
        total = handle.get_result()
        seconds = time.perf_counter() - start
        check(total == sum(range(n)), "DBOS W7 wrong sum")
        check(COUNTS["tick"] == n, f"DBOS W7 step ran {COUNTS['tick']} times, not {n}")
    finally:
        _destroy(p)
    return {
        "seconds": seconds,
        "per_op_us": seconds / n * 1e6,
        "n": n,
        "enqueue_seconds": STATE["enqueued"] - start,
    }


def queue_throughput(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    m = p.get("m", 2000)
    queue = _queue(tmp, p, "w8")
    try:
        COUNTS.clear()
        start = time.perf_counter()
        handles = [queue.enqueue(one_step, j) for j in range(m)]
        enqueued = time.perf_counter()
        results = [handle.get_result() for handle in handles]
        seconds = time.perf_counter() - start
        check(results == list(range(m)), "DBOS W8 wrong results")
        check(COUNTS["tick"] == m, f"DBOS W8 step ran {COUNTS['tick']} times, not {m}")
    finally:
        _destroy(p)
    return {
        "seconds": seconds,
        "per_op_us": seconds / m * 1e6,
        "throughput_per_s": m / seconds,
        "n": m,
        "enqueue_seconds": enqueued - start,
    }


#: W7 and W8 on DBOS, by the name the worker runs them under.
QUEUE_WORKLOADS = {"children_queue": children_queue, "queue_throughput": queue_throughput}
