"""Summaries shared by the memable and DBOS workloads (no memable import here)."""

from __future__ import annotations

import statistics
from typing import Any


def latencies(samples: list[float]) -> dict[str, Any]:
    """Median (as ``per_op_us`` too) and p95 of latency samples in seconds."""
    ordered = sorted(samples)
    return {
        "per_op_us": statistics.median(ordered) * 1e6,
        "median_ms": statistics.median(ordered) * 1e3,
        "p95_ms": ordered[max(0, round(0.95 * len(ordered)) - 1)] * 1e3,
        "n": len(ordered),
    }
