"""``python -m benchmarks.throughput_probe [w2|w8] [full|normal]``: what bounds many runs at once.

Runs one workload's shape in this process, on a fresh file store (or, with
``--store URL``, in a fresh PostgreSQL schema, dropped afterwards):

- ``w2``: 500 three-step workflows invoked at once on 8 worker threads (W2);
- ``w8``: 2,000 one-step workflows invoked at once onto a queue of
  concurrency 8 (W8);

and prints its wall time, the process's CPU time per workflow (every thread,
user and system, from ``getrusage``; the interpreter lock lets one thread run
Python at a time, so user time near the wall time means the run is bound by
its own Python), the same split by thread (the thread that invokes and waits
for the results, the worker threads, the queue thread, the rest; read from
``/proc``, so on Linux only), the voluntary context switches per workflow
(each a thread that waited: for the lock, a commit, a wake-up), and, on a
file, how many durable writes each group commit carried. It explains ``docs/performance.md``'s
readings of W2 and W8; it checks their results and is not part of the
benchmark table.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from memable import Context, Engine
from memable._sqlite.group_commit import GroupCommit

#: shape: (workflows, steps each, through a queue of concurrency 8).
SHAPES = {"w2": (500, 3, False), "w8": (2000, 1, True)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.throughput_probe",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("shape", nargs="?", choices=sorted(SHAPES), default="w2")
    parser.add_argument("synchronous", nargs="?", choices=("full", "normal"), default="full")
    parser.add_argument("--store", metavar="URL", help="a PostgreSQL server instead of a file")
    parser.add_argument("--workflows", type=int, help="how many (default: the shape's)")
    args = parser.parse_intermixed_args(argv)
    count, steps, queued = SHAPES[args.shape]
    count = args.workflows or count
    print(probe(count, steps, queued, args.synchronous, args.store))


def probe(count: int, steps: int, queued: bool, synchronous: str, store: str | None) -> str:
    """Run ``count`` workflows of ``steps`` steps at once; what they cost, as text."""
    batches: list[int] = []
    commit = GroupCommit._commit

    def counted(self: GroupCommit, batch: list[Any]) -> None:
        batches.append(len(batch))  # called by one leader at a time
        commit(self, batch)

    GroupCommit._commit = counted  # type: ignore[method-assign]

    def body(ctx: Context, j: int) -> int:
        return sum(ctx.step(f"s{k}").run(lambda: 1) for k in range(steps))

    schema = f"memable_probe_{os.getpid()}"
    with tempfile.TemporaryDirectory(prefix="memable-probe-") as tmp:
        engine = (Engine.open(store, schema=schema, max_workers=8, synchronous=synchronous)
                  if store else Engine.open(Path(tmp) / "probe.db", max_workers=8,
                                            synchronous=synchronous))
        try:
            if queued:
                engine.queue("probe", concurrency=8)
            engine.register("probe", body, queue="probe" if queued else None)
            with engine:
                engine.invoke("probe", -1).result(timeout=60)
                batches.clear()
                threads_before = _thread_times()
                before = resource.getrusage(resource.RUSAGE_SELF)
                start = time.perf_counter()
                invocations = [engine.invoke("probe", j) for j in range(count)]
                results = [inv.result(timeout=600) for inv in invocations]
                wall = time.perf_counter() - start
                after = resource.getrusage(resource.RUSAGE_SELF)
                threads_after = _thread_times()
        finally:
            GroupCommit._commit = commit  # type: ignore[method-assign]
            if store:
                _drop(store, schema)
    if results != [steps] * count:
        raise SystemExit("a workflow returned a wrong result")
    user = (after.ru_utime - before.ru_utime) / count * 1e6
    system = (after.ru_stime - before.ru_stime) / count * 1e6
    switches = (after.ru_nvcsw - before.ru_nvcsw) / count
    lines = [
        f"{count} workflows of {steps} step(s){' through a queue' if queued else ''}, "
        f"synchronous={synchronous}, {'PostgreSQL' if store else 'a file'}",
        f"wall per workflow:       {wall / count * 1e6:7.1f} µs ({count / wall:,.0f} a second)",
        f"CPU per workflow:        {user + system:7.1f} µs (user {user:.0f}, system "
        f"{system:.0f})",
        f"waits per workflow:      {switches:7.1f} voluntary context switches",
    ]
    for group, (user_s, system_s) in _by_group(threads_before, threads_after).items():
        lines.append(f"  {group + ':':22s} {(user_s + system_s) / count * 1e6:7.1f} µs "
                     f"(user {user_s / count * 1e6:.0f}, system {system_s / count * 1e6:.0f})")
    if batches:
        writes = sum(batches)
        lines.append(f"commits per workflow:    {len(batches) / count:7.2f} "
                     f"({writes} writes in {len(batches)} commits, "
                     f"{writes / len(batches):.2f} a commit)")
    return "\n".join(lines)


#: How the split names each thread: by the start of its name.
GROUPS = (("MainThread", "invoking thread"), ("memable-worker", "worker threads"),
          ("memable-queues", "queue thread"))


def _thread_times() -> dict[int, tuple[str, float, float]]:
    """Each live thread's name and CPU seconds (user, system), from ``/proc`` (empty
    where there is none)."""
    tick = os.sysconf("SC_CLK_TCK")
    times = {}
    for thread in threading.enumerate():
        try:
            with open(f"/proc/self/task/{thread.native_id}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:  # not Linux, or the thread ended
            continue
        times[thread.native_id] = (thread.name, int(fields[11]) / tick, int(fields[12]) / tick)
    return times


def _by_group(
    before: dict[int, tuple[str, float, float]], after: dict[int, tuple[str, float, float]]
) -> dict[str, tuple[float, float]]:
    """CPU seconds (user, system) each group of threads spent between the two readings."""
    groups: dict[str, tuple[float, float]] = {}
    for native_id, (name, user, system) in after.items():
        _, user0, system0 = before.get(native_id, (name, 0.0, 0.0))
        group = next((label for prefix, label in GROUPS if name.startswith(prefix)),
                     "other threads")
        total = groups.get(group, (0.0, 0.0))
        groups[group] = (total[0] + user - user0, total[1] + system - system0)
    order = [label for _, label in GROUPS] + ["other threads"]
    return {group: groups[group] for group in order if group in groups}


def _drop(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


if __name__ == "__main__":
    main()
