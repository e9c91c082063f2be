"""The benchmark runs, so it cannot rot: a smoke run of `python -m benchmarks --quick`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

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
            "W8 full", "W10 full", "W11 full"} <= labels
    assert [record["label"] for record in records if not record["ok"]] == []


def _scale_record(growth: float) -> dict[str, Any]:
    """A W11 record of two sizes whose cost per unit grows ``growth`` times between them."""
    units = {"list failed": "returned row", "overview": "instance counted",
             "overview page": "instance counted", "purge hundredth": "purged instance",
             "purge": "purged instance"}

    def size(n: int, per_unit_us: float) -> dict[str, Any]:
        counts = {"list failed": n // 30, "overview": n, "overview page": n,
                  "purge hundredth": n // 100, "purge": n // 10}
        return {op: {"ms": per_unit_us * count / 1e3, "count": count,
                     "per_unit_us": per_unit_us,
                     **({} if op.startswith("purge") else {"p95_ms": 1.0})}
                for op, count in counts.items()}

    large = size(10000, 10.0 * growth)
    # The purge is judged in the largest store: the tenth against the hundredth before it.
    large["purge hundredth"] = size(10000, 10.0)["purge hundredth"]
    bases = {op: [1000, op] for op in units}
    bases["purge"] = [10000, "purge hundredth"]
    return {"ok": True, "sizes": [1000, 10000], "reps": 5, "units": units,
            "by_size": {"1000": size(1000, 10.0), "10000": large}, "bases": bases,
            "growth": dict.fromkeys(units, growth)}


def test_scale_rows_judge_growth_per_unit(monkeypatch: pytest.MonkeyPatch) -> None:
    """W11's rows: the figure at the largest store, the smallest as the detail, and the goal
    met while the cost per unit grows at most 1.5x; one FAILED row for a failed run."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks.__main__ import QUICK_SIZES, _scale_rows, report

    met = _scale_rows(_scale_record(1.4))
    assert [row[0] for row in met] == ["W11 list failed", "W11 overview", "W11 overview page",
                                       "W11 purge"]
    assert all(row[-1] is True for row in met)
    purge = met[-1]
    assert purge[2] == "14.00 ms, 1,000 purged of 10,000 (14.0 µs each)"
    assert purge[3] == "1.00 ms, 100 purged of 10,000 (10.0 µs each)"
    assert met[1][2] == "140.00 ms, 10,000 counted (14.0 µs each)"
    assert purge[4] == "1.40x per purged instance (goal ≤ 1.5x)"
    assert "median of 5" in met[0][1]
    assert "median" not in purge[1]

    missed = _scale_rows(_scale_record(1.6))
    assert [row[-1] for row in missed] == [False] * 4
    assert missed[0][4] == "1.60x per returned row (goal ≤ 1.5x)"

    assert _scale_rows({"ok": False, "error": "W11 1000: purge returned 99"}) == [
        ("W11 full", "store scale", "FAILED", "", "", False)]
    assert _scale_rows({}) == [("W11 full", "store scale", "FAILED", "", "", False)]

    table, _ = report({"W11 full": _scale_record(1.0)}, QUICK_SIZES)
    assert "| W11 overview | store.status_counts(), the overview's counts, median of 5 |" in table
    assert table.count("| W11 ") == 4


def test_queue_rows_judge_w7_and_w8_against_their_raw_commits(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """W7 and W8 each get a ratio to the raw commits an instance needs (measured with the
    floor), W8 a goal of 2x that and a goal of instances a second per store."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmarks.__main__ import QUICK_SIZES, dbos_report, report

    floor = {"ok": True, "insert_commit_us": 150.0, "pk_read_us": 3.0,
             "queue_instance_us": 600.0, "queue_child_us": 450.0}

    def records(w8_seconds: float) -> dict[str, dict[str, Any]]:
        n = QUICK_SIZES["w8"]
        return {"floor full": floor,
                "W7 full": {"ok": True, "seconds": 0.09, "per_op_us": 900.0, "n": 100},
                "W8 full": {"ok": True, "seconds": w8_seconds, "n": n,
                            "per_op_us": w8_seconds / n * 1e6}}

    def rows(table: str, what: str) -> list[str]:
        return [line for line in table.splitlines() if what in line]

    # 200 instances in 0.2 s: 1,000 µs each, 1.67x the floor; 1,000 a second.
    table, _ = report(records(0.2), QUICK_SIZES)
    [w7] = rows(table, "vs the raw commits a child needs")
    assert "| 900.0 µs | 450.0 µs raw commits of a child" in w7
    assert "| 2.00x |" in w7
    [w8] = rows(table, "vs the raw commits an instance needs")
    assert w8.endswith(
        "| 1.00 ms | 600.0 µs raw commits of an instance (4) (full) | 1.67x (goal ≤ 2.0x) | yes |")
    [rate] = rows(table, "instances a second")
    assert rate.endswith("| 1,000/s | 1,667/s raw commits, one connection | goal ≥ 2,500/s | NO |")
    table, _ = report(records(0.2), QUICK_SIZES, "postgres")
    assert rows(table, "instances a second")[0].endswith("| goal ≥ 1,000/s | yes |")

    # 200 in 0.3 s: 2.5x the floor, missed.
    table, _ = report(records(0.3), QUICK_SIZES)
    assert rows(table, "vs the raw commits an instance needs")[0].endswith("| NO |")
    table, _ = report({"floor full": floor}, QUICK_SIZES)
    assert "| W8 full | instances a second | FAILED |" in table
    # Beside DBOS, each figure says what it is per.
    beside = dbos_report({"W8 full": records(0.2)["W8 full"],
                          "dbos W8 full": {"ok": True, "per_op_us": 100_000.0}})
    assert "| W8 full | 1.00 ms per workflow | 100.00 ms per workflow | 0.010 |" in beside


def test_throughput_probe_accounts_for_a_queue_run() -> None:
    """The probe docs/performance.md quotes runs (so it cannot rot): its account of a few
    queued workflows on a file names each figure it prints."""
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.throughput_probe", "w8", "normal",
         "--workflows", "20"], cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0] == "20 workflows of 1 step(s) through a queue, synchronous=normal, a file"
    assert [line.split(":")[0].strip() for line in lines[1:]] == [
        "wall per workflow", "CPU per workflow", "waits per workflow", "invoking thread",
        "worker threads", "queue thread", "other threads", "commits per workflow"]
