"""``python -m benchmarks.w2_probe``: what bounds many workflows at once (W2, FULL).

Runs W2's shape (500 three-step workflows invoked at once on 8 workers) and
prints its wall time, the process's CPU time per workflow (all threads,
user and system), and how many writes each group commit carried. It
explains ``docs/performance.md``'s reading of W2; it checks only results.
"""

from __future__ import annotations

import resource
import tempfile
import time
from pathlib import Path
from typing import Any

from memable import Context, Engine
from memable._sqlite.store import SQLiteStore

WORKFLOWS = 500


def main() -> None:
    batches: list[int] = []
    commit = SQLiteStore._commit

    def counted(self: SQLiteStore, batch: list[Any]) -> None:
        batches.append(len(batch))  # called by one leader at a time
        commit(self, batch)

    SQLiteStore._commit = counted  # type: ignore[method-assign]

    def three(ctx: Context, j: int) -> int:
        return sum(ctx.step(f"s{k}").run(lambda: 1) for k in range(3))

    with tempfile.TemporaryDirectory(prefix="memable-probe-") as tmp:
        engine = Engine.open(Path(tmp) / "w2.db", max_workers=8)
        engine.register("three", three)
        with engine:
            engine.invoke("three", -1).result(timeout=60)
            batches.clear()
            before = resource.getrusage(resource.RUSAGE_SELF)
            start = time.perf_counter()
            invocations = [engine.invoke("three", j) for j in range(WORKFLOWS)]
            results = [inv.result(timeout=600) for inv in invocations]
            wall = time.perf_counter() - start
            after = resource.getrusage(resource.RUSAGE_SELF)
    if results != [3] * WORKFLOWS:
        raise SystemExit("a workflow returned a wrong result")
    user = after.ru_utime - before.ru_utime
    system = after.ru_stime - before.ru_stime
    writes = sum(batches)
    print(f"{WORKFLOWS} workflows, {writes} durable writes, {len(batches)} commits")
    print(f"wall per step:          {wall / (3 * WORKFLOWS) * 1e6:7.1f} µs")
    print(f"CPU per workflow:       {(user + system) / WORKFLOWS * 1e6:7.1f} µs "
          f"(user {user / WORKFLOWS * 1e6:.0f}, system {system / WORKFLOWS * 1e6:.0f})")
    print(f"writes per commit:      {writes / len(batches):7.2f}")


if __name__ == "__main__":
    main()
