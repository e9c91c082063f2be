"""``python -m benchmarks [--quick] [--json]``: memable beside the raw SQLite floor.

Runs every workload in a fresh process on a fresh file store in a temporary
directory, measures the floor (raw ``sqlite3`` INSERT+COMMIT per row and a
primary-key read, same journal mode and ``synchronous``) in the same run,
and prints each figure beside its floor, their ratio and the goal. A
workload that gets a wrong result makes the command exit 1; a missed goal
only shows in the table (``--strict`` makes it fail too).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

FULL_SIZES = {
    "floor_rows": 2000,
    "w1": 1000,
    "w2": 500,
    "w3": 1000,
    "reps": 50,
    "w6": [100, 1000, 10000],
    "suspended": 10000,
    "w7": 1000,
    "w8": 2000,
    "w9": 1,
    "otel_rounds": 7,
    "w10": 100_000,
    "w10_reps": 15,
    "w11": [10_000, 100_000],
    "w11_reps": 15,
}
QUICK_SIZES = {
    "floor_rows": 300,
    "w1": 200,
    "w2": 100,
    "w3": 200,
    "reps": 10,
    "w6": [100, 1000],
    "suspended": 1000,
    "w7": 100,
    "w8": 200,
    "w9": 0,  # W9 waits for a real minute boundary: up to a minute, so not in a smoke run
    "otel_rounds": 1,
    "w10": 10_000,
    "w10_reps": 5,
    "w11": [1_000, 10_000],
    "w11_reps": 5,
}


def run_worker(
    name: str, params: dict[str, Any], python: str = sys.executable
) -> dict[str, Any]:
    """Run one workload in a child process; return its record (ok False on failure)."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    proc = subprocess.run(
        [python, "-m", "benchmarks", "--worker", name, "--params", json.dumps(params)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"workload": name, "params": params, "ok": False, "error": proc.stderr[-2000:]}
    record: dict[str, Any] = json.loads(lines[-1])
    return record


def worker(name: str, params: dict[str, Any]) -> int:
    """Child process: run one workload, print its record as one JSON line."""
    system, _, name = name.rpartition(":")
    if system == "dbos":  # a Python with DBOS installed, and maybe no memable
        from ._dbos import WORKLOADS
        from ._dbos import Wrong as BenchFailure
        from ._dbos_queues import QUEUE_WORKLOADS
    else:
        from ._workloads import WORKLOADS, BenchFailure  # type: ignore[assignment]
        from ._workloads_queues import QUEUE_WORKLOADS  # type: ignore[assignment]
    workloads = {**WORKLOADS, **QUEUE_WORKLOADS}
    if system != "dbos":  # W9, W10, W11 and the OpenTelemetry rows have no DBOS side
        from ._workloads_otel import OTEL_WORKLOADS
        from ._workloads_scale import SCALE_WORKLOADS
        from ._workloads_schedules import SCHEDULE_WORKLOADS
        from ._workloads_web import WEB_WORKLOADS

        workloads.update(SCHEDULE_WORKLOADS)
        workloads.update(OTEL_WORKLOADS)
        workloads.update(WEB_WORKLOADS)
        workloads.update(SCALE_WORKLOADS)
    from . import _floor

    if params.get("store"):  # PostgreSQL: a schema of its own, dropped afterwards
        params = {**params, "schema": f"memable_bench_{name}_{os.getpid()}"}
    with tempfile.TemporaryDirectory(prefix="memable-bench-") as tmp:
        try:
            if name == "floor" and params.get("store"):
                from . import _floor_pg

                result = _floor_pg.measure(
                    params["store"], params["schema"], params["synchronous"], params["rows"]
                )
                result.update(_floor_pg.measure_queue(
                    params["store"], params["schema"], params["synchronous"],
                    params["rows"] // 4,
                ))
            elif name == "floor":
                rows = params["rows"]
                result = {
                    "insert_commit_us": _floor.insert_commit_us(
                        Path(tmp), params["synchronous"], rows
                    ),
                    "pk_read_us": _floor.pk_read_us(Path(tmp), rows),
                    # Four commits an instance: a quarter of the rows takes as long.
                    **_floor.queue_instance_us(Path(tmp), params["synchronous"], rows // 4),
                }
            else:
                result = workloads[name](Path(tmp), params)
        except BenchFailure as exc:
            print(json.dumps({"workload": name, "params": params, "ok": False, "error": str(exc)}))
            return 1
        finally:
            if params.get("store") and name != "floor":
                _drop_schema(params["store"], params["schema"])
    print(json.dumps({"workload": name, "params": params, "ok": True, **result}))
    return 0


def _drop_schema(url: str, schema: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


#: W1 with the no-op telemetry (as without OpenTelemetry), with the API and no SDK
#: configured (the default), and with the SDK recording every span.
OTEL_VARIANTS = ("none", "api", "sdk")
#: The API's cost per step, as a ratio of the no-op's (issue 24).
OTEL_API_GOAL = 1.03


def plan(
    sizes: dict[str, Any], threads: int, store: str | None = None
) -> list[tuple[str, str, dict[str, Any]]]:
    """(label, workload, params) of every run, in order."""
    full = {"synchronous": "full", "threads": threads, "store": store}
    normal = {"synchronous": "normal", "threads": threads, "store": store}
    warm = sizes["floor_rows"]  # W1 warms its store with as many rows as the floor
    runs = [
        ("floor full", "floor", {**full, "rows": sizes["floor_rows"]}),
        ("floor normal", "floor", {**normal, "rows": sizes["floor_rows"]}),
        ("W1 full", "step_throughput", {**full, "n": sizes["w1"], "warm": warm}),
        ("W1 normal", "step_throughput", {**normal, "n": sizes["w1"], "warm": warm}),
        ("W2 full", "workflow_throughput", {**full, "m": sizes["w2"]}),
        ("W3 full", "replay", {**full, "n": sizes["w3"]}),
        ("W4 full", "timer_latency", {**full, "reps": sizes["reps"]}),
        ("W5 full", "signal_roundtrip", {**full, "reps": sizes["reps"]}),
        # Across processes only where another process's signal wakes an engine at once.
        *([("W5x full", "signal_remote", {**full, "reps": sizes["reps"]})] if store else []),
        ("suspended", "suspended", {**full, "count": sizes["suspended"]}),
    ]
    # W1 full with no telemetry, the OpenTelemetry API alone and the SDK recording, in
    # rounds that take turns, each run a fresh process. SQLite only: the figure.
    for round_ in range(1, 1 + (0 if store else sizes["otel_rounds"])):
        for otel in OTEL_VARIANTS:
            runs.append((f"otel {otel} #{round_}", "step_throughput_otel",
                         {**full, "n": sizes["w1"], "warm": warm, "otel": otel}))
    for n in sizes["w6"]:
        runs.append((f"W6 W1 n={n}", "step_throughput", {**full, "n": n, "warm": warm}))
    # Every size in one process, taking turns: see _workloads._replays.
    runs.append(("W6 W3", "replay_growth", {**full, "sizes": sizes["w6"]}))
    runs.append(("W7 full", "children_queue", {**full, "n": sizes["w7"], "concurrency": 8}))
    runs.append(("W8 full", "queue_throughput", {**full, "m": sizes["w8"], "concurrency": 8}))
    runs.append(("W10 full", "dashboard", {**full, "n": sizes["w10"], "reps": sizes["w10_reps"]}))
    runs.append(("W11 full", "store_scale",
                 {**full, "sizes": sizes["w11"], "reps": sizes["w11_reps"]}))
    if sizes["w9"]:  # last: it waits for the next minute boundary
        runs.append(("W9 full", "tick_lag", {**full, "ticks": sizes["w9"]}))
    return runs


def _fmt_us(us: float) -> str:
    return f"{us / 1000:.2f} ms" if us >= 1000 else f"{us:.1f} µs"


#: Goals per store (SPEC and the open issues): ratios to the floor, absolute
#: microseconds per replayed step, and latency medians in milliseconds.
GOALS = {
    "sqlite": {"W1 full": 1.3, "W1 normal": 2.0, "W2 full": 1.0, "W3 ratio": 5.0,
               "W3 us": 10.0, "latency ms": 3.0, "W7 floor": None, "W8 floor": 2.0,
               "W8 per s": 2500},
    # W1's goal is set against the durable commit; with synchronous_commit off
    # a step's two round trips (status read, fenced write) are the whole cost.
    "postgres": {"W1 full": 1.5, "W1 normal": None, "W2 full": None, "W3 ratio": None,
                 "W3 us": 20.0, "latency ms": 3.0, "W5x ms": 5.0, "W2 vs DBOS": 0.2,
                 "W7 floor": None, "W8 floor": 2.0, "W8 per s": 1000},
}


#: How the table names each floor. On PostgreSQL "INSERT+COMMIT" is psycopg's
#: default transaction (BEGIN, INSERT, COMMIT), the floor the goals were set
#: against; the autocommit INSERT is the same commit in one round trip.
BASIS_NAMES = {
    "insert_commit_us": "INSERT+COMMIT",
    "queue_instance_us": "raw commits of an instance (4)",
    "queue_child_us": "raw commits of a child (3, and its insert in a shared one)",
    "autocommit_insert_us": "autocommit INSERT",
    "pk_read_us": "PK read",
}


def report(
    records: dict[str, dict[str, Any]], sizes: dict[str, Any], store: str = "sqlite"
) -> tuple[str, bool]:
    """The markdown table, and whether every goal was met."""
    # The last field: whether the goal was met, None for a workload not run.
    rows: list[tuple[str, str, str, str, str, bool | None]] = []
    floor = {sync: records.get(f"floor {sync}", {}) for sync in ("full", "normal")}
    goals: dict[str, Any] = GOALS[store]

    def ratio_row(label: str, what: str, basis: str, sync: str, goal: float | None) -> None:
        rec, base = records.get(label, {}), floor[sync].get(basis)
        if not rec.get("ok") or base is None:
            rows.append((label, what, "FAILED", "", "", False))
            return
        ratio = rec["per_op_us"] / base
        name = BASIS_NAMES[basis]
        rows.append(
            (
                label,
                what,
                _fmt_us(rec["per_op_us"]),
                f"{_fmt_us(base)} {name} ({sync})",
                f"{ratio:.2f}x" + ("" if goal is None else f" (goal ≤ {goal}x)"),
                goal is None or ratio <= goal,
            )
        )

    ratio_row("W1 full", "per step, one workflow", "insert_commit_us", "full", goals["W1 full"])
    ratio_row(
        "W1 normal", "per step, one workflow", "insert_commit_us", "normal", goals["W1 normal"]
    )
    rows.extend(_otel_rows(records, sizes, store))
    ratio_row(
        "W2 full", f"per step, {sizes['w2']} workflows at once", "insert_commit_us", "full",
        goals["W2 full"],
    )
    ratio_row("W3 full", "per replayed step", "pk_read_us", "full", goals["W3 ratio"])
    w2, dbos_w2 = records.get("W2 full", {}), records.get("dbos W2 full", {})
    if goals.get("W2 vs DBOS") is not None:
        if w2.get("ok") and dbos_w2.get("ok"):
            ratio = w2["per_op_us"] / dbos_w2["per_op_us"]
            rows.append(("W2 full", "per step, vs DBOS 3.4.0 on the same server",
                         _fmt_us(w2["per_op_us"]), f"{_fmt_us(dbos_w2['per_op_us'])} DBOS",
                         f"{ratio:.2f}x (goal ≤ {goals['W2 vs DBOS']}x)",
                         ratio <= goals["W2 vs DBOS"]))
        else:
            rows.append(("W2 full", "per step, vs DBOS", "needs --dbos", "", "", False))
    if store == "postgres":  # beside the goal's floor, the one-round-trip commit (no goal)
        for sync in ("full", "normal"):
            ratio_row(f"W1 {sync}", "per step, one workflow", "autocommit_insert_us", sync, None)
    w3 = records.get("W3 full", {})
    if w3.get("ok"):
        rows.append(
            (
                "W3 full",
                "per replayed step (absolute)",
                _fmt_us(w3["per_op_us"]),
                "",
                f"goal ≤ {goals['W3 us']:g} µs",
                w3["per_op_us"] <= goals["W3 us"],
            )
        )
    for label, what, goal in (
        ("W4 full", "zero timer, start to result", goals["latency ms"]),
        ("W5 full", "signal to result", goals["latency ms"]),
        ("W5x full", "signal from another process to result", goals.get("W5x ms")),
    ):
        rec = records.get(label, {})
        if goal is None:
            continue
        if rec.get("ok"):
            rows.append(
                (
                    label,
                    what,
                    f"median {rec['median_ms']:.2f} ms",
                    f"p95 {rec['p95_ms']:.2f} ms",
                    f"goal median ≤ {goal:g} ms",
                    rec["median_ms"] <= goal,
                )
            )
        else:
            rows.append((label, what, "FAILED", "", "", False))
    small, large = sizes["w6"][0], sizes["w6"][-1]
    by_n = records.get("W6 W3", {}).get("per_op_us_by_n", {})
    for workload in ("W1", "W3"):
        if workload == "W1":
            a, b = records.get(f"W6 W1 n={small}", {}), records.get(f"W6 W1 n={large}", {})
        else:
            a, b = (
                {"ok": str(n) in by_n, "per_op_us": by_n.get(str(n))} for n in (small, large)
            )
        if a.get("ok") and b.get("ok"):
            growth = b["per_op_us"] / a["per_op_us"]
            rows.append(
                (
                    f"W6 {workload}",
                    f"per step at n={large} vs n={small}",
                    f"{_fmt_us(b['per_op_us'])} vs {_fmt_us(a['per_op_us'])}",
                    "",
                    f"{growth:.2f}x (goal ≤ 1.25x)",
                    growth <= 1.25,
                )
            )
        else:
            rows.append((f"W6 {workload}", "growth", "FAILED", "", "", False))
    for label, what in (("W7 full", f"a parent of {sizes['w7']} children through a queue "
                                    "of concurrency 8, per child"),
                        ("W8 full", f"{sizes['w8']} one-step workflows through a queue "
                                    "of concurrency 8, per workflow")):
        ours, theirs = records.get(label, {}), records.get(f"dbos {label}", {})
        if not ours.get("ok"):
            rows.append((label, what, "FAILED", "", "", False))
        elif theirs.get("ok"):
            ratio = ours["seconds"] / theirs["seconds"]
            rows.append((label, what, f"{ours['seconds']:.2f} s ({_fmt_us(ours['per_op_us'])})",
                         f"{theirs['seconds']:.2f} s DBOS 3.4.0",
                         f"{ratio:.3f}x (goal ≤ 0.1x)", ratio <= 0.1))
        else:
            rows.append((label, what, f"{ours['seconds']:.2f} s ({_fmt_us(ours['per_op_us'])})",
                         "needs --dbos", "goal ≤ 0.1x of DBOS", False))
    # Against the raw writes the design needs per instance (issue 27), and W8's rate.
    ratio_row("W7 full", "per child, vs the raw commits a child needs", "queue_child_us",
              "full", goals["W7 floor"])
    ratio_row("W8 full", "per workflow, vs the raw commits an instance needs",
              "queue_instance_us", "full", goals["W8 floor"])
    w8, w8_floor = records.get("W8 full", {}), floor["full"].get("queue_instance_us")
    if w8.get("ok") and w8_floor is not None:
        rate = w8["n"] / w8["seconds"]
        rows.append(("W8 full", "instances a second through the queue", f"{rate:,.0f}/s",
                     f"{1e6 / w8_floor:,.0f}/s raw commits, one connection",
                     f"goal ≥ {goals['W8 per s']:,}/s", rate >= goals["W8 per s"]))
    else:
        rows.append(("W8 full", "instances a second", "FAILED", "", "", False))
    rec = records.get("suspended", {})
    if rec.get("ok"):
        rows.append(
            (
                "suspended",
                f"{rec['n']} suspended instances",
                f"{rec['rss_mb']:.0f} MB RSS",
                f"{rec['threads']} extra threads, 0 runs held",
                "goal < 150 MB",
                rec["rss_mb"] < 150,
            )
        )
    else:
        rows.append(("suspended", "", "FAILED", "", "", False))
    what = "schedule tick, due time to its instance created"
    rec = records.get("W9 full", {})
    if not sizes["w9"]:
        rows.append(("W9 full", what, "not run (--quick)", "waits for a minute boundary",
                     "goal ≤ 1 s", None))
    elif rec.get("ok"):
        lag, ran = max(rec["lag_ms"]), max(rec["ran_ms"])
        several = f"worst of {len(rec['lag_ms'])} ticks: " if len(rec["lag_ms"]) > 1 else ""
        rows.append(("W9 full", what, f"{several}{lag:.1f} ms", f"step began +{ran:.1f} ms",
                     "goal ≤ 1 s", lag <= 1000))
    else:
        rows.append(("W9 full", what, "FAILED", "", "", False))
    rows.extend(_dashboard_rows(records.get("W10 full", {})))
    rows.extend(_scale_rows(records.get("W11 full", {})))
    lines = [
        "| workload | what | memable | floor / detail | ratio / goal | met |",
        "|---|---|---|---|---|---|",
    ]
    met = {True: "yes", False: "NO", None: "n/a"}
    lines += [f"| {a} | {b} | {c} | {d} | {e} | {met[ok]} |" for a, b, c, d, e, ok in rows]
    return "\n".join(lines), all(row[-1] is not False for row in rows)


#: W10: the median answer of each dashboard page, in milliseconds (issue 25).
DASHBOARD_GOAL_MS = 200.0


def _dashboard_rows(rec: dict[str, Any]) -> list[tuple[str, str, str, str, str, bool | None]]:
    """One row per dashboard page W10 timed: its median answer against the goal."""
    if not rec.get("ok"):
        return [("W10 full", "dashboard pages", "FAILED", "", "", False)]
    return [(label, page["what"], f"median {page['median_ms']:.2f} ms",
             f"p95 {page['p95_ms']:.2f} ms, {rec['reps']} requests",
             f"goal median ≤ {DASHBOARD_GOAL_MS:g} ms", page["median_ms"] <= DASHBOARD_GOAL_MS)
            for label, page in rec["pages"].items()]


#: W11: the cost per unit (returned row, counted or purged instance) at the largest store
#: over the smallest (issue 27: no worse than linear in what it returns). Over 10x the
#: rows a B-tree's own log factor is 1.25x, and each row the list returns sits on a page
#: of its own in a file ten times larger (measured 1.14x-1.29x for the list); a read that
#: grew with the square of what it returns would show 10x.
SCALE_GROWTH_GOAL = 1.5
#: W11's rows: (label, the operation's key in the record, what it is, what it does to
#: the rows its cost is per).
SCALE_ROWS = (
    ("W11 list failed", "list failed", "list_instances: one workflow's failed", "returned"),
    ("W11 overview", "overview", "store.status_counts(), the overview's counts", "counted"),
    ("W11 overview page", "overview page", "pages.overview(store): counts, queues, schedules",
     "counted"),
    ("W11 purge", "purge", "purge_batches of a tenth, after a hundredth", "purged"),
)


def _scale_rows(rec: dict[str, Any]) -> list[tuple[str, str, str, str, str, bool | None]]:
    """One row per operation W11 timed: its figure at the largest store, at the smallest,
    and how its cost per unit grew between them against the goal."""
    if not rec.get("ok"):
        return [("W11 full", "store scale", "FAILED", "", "", False)]

    def figure(size: int, op: str, done: str) -> str:
        fig = rec["by_size"][str(size)][op]
        us = fig["per_unit_us"]
        of = "" if fig["count"] == size else f" of {size:,}"
        return (f"{fig['ms']:.2f} ms, {fig['count']:,} {done}{of} "
                f"({_fmt_us(us) if us >= 1 else f'{us:.3f} µs'} each)")

    large = rec["sizes"][-1]
    rows: list[tuple[str, str, str, str, str, bool | None]] = []
    for label, op, what, done in SCALE_ROWS:
        unit = rec["units"][op]
        size, basis = rec["bases"][op]  # what the workload judged it against
        growth = rec["growth"][op]
        median = f", median of {rec['reps']}" if "p95_ms" in rec["by_size"][str(large)][op] else ""
        rows.append((label, f"{what}{median}", figure(large, op, done),
                     figure(size, basis, done),
                     f"{growth:.2f}x per {unit} (goal ≤ {SCALE_GROWTH_GOAL}x)",
                     growth <= SCALE_GROWTH_GOAL))
    return rows


def _otel_rows(
    records: dict[str, dict[str, Any]], sizes: dict[str, Any], store: str
) -> list[tuple[str, str, str, str, str, bool | None]]:
    """W1 with the OpenTelemetry API (goal: within 3 % of the no-op) and with the SDK (the
    cost of a recorded span and its metrics, no goal), from the medians of the rounds."""
    if store != "sqlite":
        return [(f"W1 otel {otel}", "W1 full, OpenTelemetry", "not run on PostgreSQL",
                 "SQLite only", "", None) for otel in ("api", "sdk")]
    runs = {otel: [rec for label, rec in records.items()
                   if label.startswith(f"otel {otel} #")] for otel in OTEL_VARIANTS}
    rounds = sizes["otel_rounds"]
    of = f"median of {rounds} rounds" if rounds > 1 else "1 round"
    what = {"api": f"per step, API without SDK, {of}",
            "sdk": f"per step, SDK recording spans, {of}"}
    if len(runs["none"]) != rounds or not all(rec.get("ok") for rec in runs["none"]):
        return [(f"W1 otel {otel}", what[otel], "FAILED", "otel none failed", "", False)
                for otel in ("api", "sdk")]
    none = statistics.median(rec["per_op_us"] for rec in runs["none"])
    rows: list[tuple[str, str, str, str, str, bool | None]] = []
    for otel in ("api", "sdk"):
        label, recs = f"W1 otel {otel}", runs[otel]
        if len(recs) != rounds or not all(rec.get("ok") for rec in recs):
            rows.append((label, what[otel], "FAILED", "", "", False))
            continue
        missing = next((rec["unavailable"] for rec in recs if "unavailable" in rec), None)
        if missing:
            rows.append((label, what[otel], missing, "", "", None))
            continue
        median = statistics.median(rec["per_op_us"] for rec in recs)
        figure = _fmt_us(median) + _spread(recs)
        # Each round against its own otel none, run just before it: the machine's drift
        # between rounds cancels out there.
        pairs = [(rec["per_op_us"], base["per_op_us"])
                 for rec, base in zip(recs, runs["none"], strict=True)]
        if otel == "api":
            ratio = median / none
            by_round = sorted(ours / base for ours, base in pairs)
            rounds_note = (f"; by round {by_round[0]:.3f}x-{by_round[-1]:.3f}x, median "
                           f"{statistics.median(by_round):.3f}x" if rounds > 1 else "")
            rows.append((label, what[otel], figure,
                         f"{_fmt_us(none)} otel none{_spread(runs['none'])}",
                         f"{ratio:.3f}x (goal ≤ {OTEL_API_GOAL}x of otel none){rounds_note}",
                         ratio <= OTEL_API_GOAL))
        else:
            by_diff = sorted(ours - base for ours, base in pairs)
            rounds_note = (f" (by round {by_diff[0]:+.1f} to {by_diff[-1]:+.1f})"
                           if rounds > 1 else "")
            rows.append((label, what[otel], figure,
                         f"{_fmt_us(none)} otel none; {median - none:+.1f} µs per step"
                         f"{rounds_note}: a recorded span and its metrics", "no goal", None))
    return rows


def _spread(records: list[dict[str, Any]]) -> str:
    """`` (lowest-highest)`` per-step figure of the rounds, if more than one."""
    figures = [rec["per_op_us"] for rec in records]
    return f" ({min(figures):.1f}-{max(figures):.1f})" if len(figures) > 1 else ""


DBOS_LABELS = ("W1 full", "W2 full", "W3 full", "W4 full", "W5 full", "W7 full", "W8 full")


def dbos_report(records: dict[str, dict[str, Any]]) -> str:
    """memable beside DBOS, workload by workload, from the same run."""
    lines = [
        "| workload | memable | DBOS 3.4.0 | memable time / DBOS time |",
        "|---|---|---|---|",
    ]
    for label in DBOS_LABELS:
        ours, theirs = records.get(label, {}), records.get(f"dbos {label}", {})
        if not (ours.get("ok") and theirs.get("ok")):
            lines.append(f"| {label} | {_cell(ours, label)} | {_cell(theirs, label)} | |")
            continue
        ratio = ours["per_op_us"] / theirs["per_op_us"]
        lines.append(f"| {label} | {_cell(ours, label)} | {_cell(theirs, label)} | {ratio:.3f} |")
    return "\n".join(lines)


#: What W7's and W8's figure is per (the others: per step).
PER = {"W7 full": "child", "W8 full": "workflow"}


def _cell(record: dict[str, Any], label: str = "") -> str:
    if not record.get("ok"):
        return "FAILED" if record else "not run"
    if "median_ms" in record:
        return f"median {record['median_ms']:.2f} ms (p95 {record['p95_ms']:.2f} ms)"
    return f"{_fmt_us(record['per_op_us'])} per {PER.get(label, 'step')}"


def _server(url: str) -> str:
    """Host, port and version of the server (no password)."""
    import psycopg

    from memable._postgres.schema import describe, parse

    with psycopg.connect(url) as conn:
        version = conn.execute("SHOW server_version").fetchone()
    return f"{describe(parse(url))} (PostgreSQL {version[0] if version else '?'})"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--quick", action="store_true",
        help="small sizes: a ~30 s smoke run, without W9 (it waits for a minute boundary)",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON record per run")
    parser.add_argument("--strict", action="store_true", help="exit 2 when a goal is missed")
    parser.add_argument("--threads", type=int, default=8, help="engine max_workers (8)")
    parser.add_argument(
        "--dbos",
        metavar="PYTHON",
        help="also run W1-W5, W7 and W8 on DBOS, with this interpreter (one that has dbos "
        "installed)",
    )
    parser.add_argument(
        "--store",
        metavar="URL",
        help="run on this PostgreSQL server (postgresql://...), each workload in a schema "
        "of its own, beside the raw psycopg floor; default: SQLite files",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--params", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker(args.worker, json.loads(args.params))

    sizes = QUICK_SIZES if args.quick else FULL_SIZES
    started = time.time()
    records: dict[str, dict[str, Any]] = {}
    for label, workload, params in plan(sizes, args.threads, args.store):
        record = run_worker(workload, params)
        record["label"] = label
        records[label] = record
        if args.json:
            print(json.dumps(record), flush=True)
        elif not record["ok"]:
            print(f"!! {label} FAILED:\n{record.get('error', '')}", file=sys.stderr)
    if args.dbos:
        for label, workload, params in plan(sizes, args.threads, args.store):
            if label in DBOS_LABELS:
                record = run_worker(f"dbos:{workload}", params, args.dbos)
                record["label"] = f"dbos {label}"
                records[record["label"]] = record
                if args.json:
                    print(json.dumps(record), flush=True)
                elif not record["ok"]:
                    print(f"!! dbos {label} FAILED:\n{record.get('error', '')}", file=sys.stderr)
    table, met = report(records, sizes, "postgres" if args.store else "sqlite")
    failed = [label for label, rec in records.items() if not rec["ok"]]
    if not args.json:
        print(
            f"memable benchmarks ({'quick' if args.quick else 'full'} sizes), "
            f"{platform.python_implementation()} {platform.python_version()}, "
            + (f"PostgreSQL at {_server(args.store)}, " if args.store else
               f"SQLite {sqlite3.sqlite_version}, ")
            + f"{os.cpu_count()} CPUs, "
            f"{time.time() - started:.0f} s\n"
        )
        print(table)
        if args.dbos:
            print("\n" + dbos_report(records))
        verdict = "FAILED: " + ", ".join(failed) if failed else "each workload checked its results"
        print(f"\ncorrectness: {verdict}")
    if failed:
        return 1
    return 2 if args.strict and not met else 0


if __name__ == "__main__":
    raise SystemExit(main())
