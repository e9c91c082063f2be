"""``python -m benchmarks.w1_probe [full|normal]``: where a sequential step's time goes (W1).

Prints, from one process and one minute of this machine:

- the engine's own Python per step, with a store that writes nothing;
- the step with its real write, and the upsert timed around the call;
- the same upsert in a tight loop, on a store opened the same way;
- the floor: the benchmark's raw INSERT + COMMIT of a step-sized row.

It explains ``docs/performance.md``'s reading of W1; it checks nothing and is
not part of the benchmark table.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from memable import Context, Engine
from memable._run.options import Options
from memable._sqlite.schema import open_store
from memable._sqlite.store import SQLiteStore
from memable._store.protocol import Synchronous
from memable._store.rows import StepWrite, step_params
from memable._store.sql.steps import UPSERT_STEP
from memable._store.transaction import SQLITE

from ._floor import insert_commit_us

STEPS = 20_000 if sys.argv[1:2] != ["full"] else 5_000
PAYLOAD = '{"i":0,"s":"' + "x" * 32 + '"}'
AT = "2026-12-02T19:00:00.000000+00:00"


class _ProbeStore(SQLiteStore):
    """Writes nothing (``write=False``), or writes and times each upsert."""

    def __init__(self, path: Path, write: bool, synchronous: Synchronous) -> None:
        super().__init__(path, synchronous)
        self.write = write
        self.seconds = 0.0
        self.calls = 0

    def save_step(self, write: StepWrite) -> None:
        if not self.write:
            return
        params = step_params(write, self.owner)
        start = time.perf_counter()
        with self._lock:
            self._conn.execute(SQLITE.spell(UPSERT_STEP), params)
        self.seconds += time.perf_counter() - start
        self.calls += 1


def _engine_per_step(
    directory: Path, write: bool, synchronous: Synchronous
) -> tuple[float, float]:
    """(µs per step, µs per upsert) for one workflow of STEPS steps."""
    store = _ProbeStore(directory / f"engine-{write}.db", write, synchronous)
    engine = Engine(store, Options())

    def small(i: int) -> dict[str, Any]:
        return {"i": i, "s": "x" * 32}

    def steps(ctx: Context, n: int) -> int:
        return sum(ctx.step(f"s{i}").run(small, i)["i"] for i in range(n))

    engine.register("steps", steps)
    with engine:
        engine.invoke("steps", 2000, instance_id="warm").result(timeout=600)
        store.seconds, store.calls = 0.0, 0
        start = time.perf_counter()
        engine.invoke("steps", STEPS, instance_id="probe").result(timeout=600)
        per_step = (time.perf_counter() - start) / STEPS * 1e6
    per_upsert = store.seconds / store.calls * 1e6 if store.calls else 0.0
    return per_step, per_upsert


def _loop_per_upsert(directory: Path, synchronous: Synchronous) -> float:
    """µs per upsert of a step-sized row, in a loop, on a store opened as the engine does."""
    conn, _, _ = open_store(directory / "loop.db", synchronous)
    try:
        conn.execute(
            "INSERT INTO memable_instances (workflow, instance_id, status, input, created_at, "
            "updated_at, owner) VALUES ('w', 'i', 'running', 'null', ?, ?, 'me')",
            (AT, AT),
        )

        def upsert(first: int, count: int) -> None:
            for seq in range(first, first + count):
                conn.execute(SQLITE.spell(UPSERT_STEP), {
                    "workflow": "w", "instance_id": "i", "key": f"s{seq}", "seq": seq,
                    "kind": "step", "state": "completed", "result": PAYLOAD,
                    "result_type": None, "status": None, "error": None,
                    "completed_at": AT, "started_at": AT, "traceback": None, "me": "me",
                })

        upsert(0, 2000)
        start = time.perf_counter()
        upsert(2000, STEPS)
        return (time.perf_counter() - start) / STEPS * 1e6
    finally:
        conn.close()


def main(argv: list[str]) -> None:
    synchronous: Synchronous = "full" if argv[:1] == ["full"] else "normal"
    with tempfile.TemporaryDirectory(prefix="memable-probe-") as tmp:
        directory = Path(tmp)
        python_only, _ = _engine_per_step(directory, False, synchronous)
        with_write, upsert_inside = _engine_per_step(directory, True, synchronous)
        upsert_loop = _loop_per_upsert(directory, synchronous)
        floor = insert_commit_us(directory, synchronous, STEPS)
    print(f"synchronous={synchronous}, {STEPS} steps")
    print(f"engine Python per step (store writes nothing): {python_only:6.1f} µs")
    print(f"engine step with its write:                   {with_write:6.1f} µs")
    print(f"  of which the upsert call:                   {upsert_inside:6.1f} µs")
    print(f"the same upsert in a loop:                    {upsert_loop:6.1f} µs")
    print(f"floor: raw INSERT + COMMIT:                   {floor:6.1f} µs")


if __name__ == "__main__":
    main(sys.argv[1:])
