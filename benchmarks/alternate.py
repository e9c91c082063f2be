"""``python -m benchmarks.alternate BEFORE AFTER ROUNDS [postgresql://...]``: the W rows of
two checkouts, taking turns.

Each run is ``python -m benchmarks --worker NAME --params JSON`` in a fresh process
from that checkout (its ``memable`` and its ``benchmarks``: ``PYTHONPATH`` is the
checkout), BEFORE and AFTER alternating, ROUNDS runs of each; it prints, per row, the
median of each side, every run, and after / before. ``ONLY="W1 full,W5 full"`` runs
those rows alone. How a change is held to "no slower" on the same machine.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from typing import Any

ROWS: list[tuple[str, str, dict[str, Any]]] = [
    ("W1 full", "step_throughput", {"synchronous": "full", "n": 1000, "warm": 2000}),
    ("W1 normal", "step_throughput", {"synchronous": "normal", "n": 1000, "warm": 2000}),
    ("W2 full", "workflow_throughput", {"synchronous": "full", "m": 500}),
    ("W3 full", "replay", {"synchronous": "full", "n": 1000}),
    ("W4 full", "timer_latency", {"synchronous": "full", "reps": 50}),
    ("W5 full", "signal_roundtrip", {"synchronous": "full", "reps": 50}),
    ("W7 full", "children_queue", {"synchronous": "full", "n": 1000, "concurrency": 8}),
    ("W8 full", "queue_throughput", {"synchronous": "full", "m": 2000, "concurrency": 8}),
]
#: The figures a row's record may hold, compared where both sides have them.
FIGURES = ("per_op_us", "median_ms", "p95_ms", "throughput_per_s")


def run(root: str, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """One run of workload ``name`` from checkout ``root``; its record, or None."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--worker", name, "--params", json.dumps(params)],
        cwd=root, env=dict(os.environ, PYTHONPATH=root), capture_output=True, text=True,
        timeout=1800,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode or not lines:
        print(f"FAILED {root} {name}: {proc.stderr[-2000:]}", flush=True)
        return None
    record: dict[str, Any] = json.loads(lines[-1])
    return record


def main(argv: list[str]) -> int:
    before, after, rounds = argv[0], argv[1], int(argv[2])
    store = argv[3] if len(argv) > 3 else None
    only = os.environ.get("ONLY")
    for label, name, params in ROWS:
        if only and label not in only.split(","):
            continue
        params = {**params, "threads": 8, "store": store}
        got: dict[str, list[dict[str, Any]]] = {before: [], after: []}
        for turn in range(rounds):
            for root in (before, after) if turn % 2 == 0 else (after, before):
                record = run(root, name, params)
                if record is not None:
                    got[root].append(record)
        print(f"== {label}", flush=True)
        for figure in FIGURES:
            old = [r[figure] for r in got[before] if figure in r]
            new = [r[figure] for r in got[after] if figure in r]
            if old and new:
                a, b = statistics.median(old), statistics.median(new)
                print(f"   {figure}: before {a:.3f} {[round(x, 1) for x in old]}  "
                      f"after {b:.3f} {[round(x, 1) for x in new]}  after/before {b / a:.3f}",
                      flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
