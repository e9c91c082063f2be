"""The benchmark runs, so it cannot rot: a smoke run of `python -m benchmarks --quick`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_quick_benchmark_checks_its_results_and_exits_zero() -> None:
    """Every workload of the quick run completes and passes its own correctness checks.

    No time is asserted: speed goals are read from the table, not tested.
    """
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    labels = {record["label"] for record in records}
    assert {"floor full", "W1 full", "W2 full", "W3 full", "W4 full", "W5 full", "W7 full",
            "W8 full", "W10 full"} <= labels
    assert [record["label"] for record in records if not record["ok"]] == []
