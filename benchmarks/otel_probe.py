"""``python -m benchmarks.otel_probe [rounds] [steps]``: the CPU that telemetry adds to a step.

The table's "W1 otel" rows time W1 with its commits, whose latency on a
noisy machine moves by more than the 3 % they compare. This probe takes the
commit out: one workflow of ``steps`` steps (default 10,000, after 2,000 to
warm up) on a SQLite store whose ``save_step`` writes nothing, so what is
timed is the engine's own Python per step. Each variant (``none``: the no-op
``Telemetry``; ``api``: the OpenTelemetry API, no SDK; ``sdk``: the SDK
recording every span and metric, as the table's rows configure it) runs in a
fresh process, in rounds that take turns (default 3). Prints each run and
the medians. It checks nothing and is not part of the benchmark table.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from ._workloads_otel import _configure_sdk, _use_no_telemetry

VARIANTS = ("none", "api", "sdk")


def _one(otel: str, steps: int) -> dict[str, float]:
    """In this process: µs of wall and of CPU per step, with a store that writes nothing."""
    from memable import Context, Engine
    from memable._run.options import Options
    from memable._sqlite.store import SQLiteStore
    from memable._store.rows import StepWrite

    class NoWrites(SQLiteStore):
        def save_step(self, write: StepWrite) -> None:
            return None

    if otel == "none":
        _use_no_telemetry()
    elif otel == "sdk":
        _configure_sdk()

    def small(i: int) -> dict[str, Any]:
        return {"i": i, "s": "x" * 32}

    def steps_of(ctx: Context, n: int) -> int:
        return sum(ctx.step(f"s{i}").run(small, i)["i"] for i in range(n))

    with tempfile.TemporaryDirectory(prefix="memable-probe-") as tmp:
        engine = Engine(NoWrites(Path(tmp) / "probe.db", "normal"), Options())
        engine.register("steps", steps_of)
        with engine:
            engine.invoke("steps", 2000, instance_id="warm").result(timeout=600)
            wall, cpu = time.perf_counter(), time.process_time()
            engine.invoke("steps", steps, instance_id="probe").result(timeout=600)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"wall_us": wall / steps * 1e6, "cpu_us": cpu / steps * 1e6}


def main(argv: list[str]) -> None:
    if argv[:1] == ["--one"]:
        print(json.dumps(_one(argv[1], int(argv[2]))))
        return
    rounds = int(argv[0]) if argv else 3
    steps = int(argv[1]) if len(argv) > 1 else 10_000
    runs: dict[str, list[dict[str, float]]] = {otel: [] for otel in VARIANTS}
    for round_ in range(1, rounds + 1):
        for otel in VARIANTS:
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.otel_probe", "--one", otel, str(steps)],
                cwd=Path(__file__).resolve().parent.parent, capture_output=True, text=True,
                check=True,
            ).stdout
            run = json.loads(out.splitlines()[-1])
            runs[otel].append(run)
            print(f"round {round_} {otel:4}: {run['wall_us']:6.2f} µs wall, "
                  f"{run['cpu_us']:6.2f} µs CPU per step", flush=True)
    none = statistics.median(run["wall_us"] for run in runs["none"])
    print(f"engine Python per step, {steps} steps, median of {rounds} rounds:")
    for otel in VARIANTS:
        median = statistics.median(run["wall_us"] for run in runs[otel])
        print(f"  {otel:4}: {median:6.2f} µs ({median - none:+.2f} µs beside none)")


if __name__ == "__main__":
    main(sys.argv[1:])
