"""W11, scale: an operator's reads and the purge over stores of growing size (memable only;
no DBOS side).

``store_scale`` makes, for each of ``sizes``, a fresh store exactly as W10
makes its own (``_workloads_web``: an engine opened and closed on it, so the
schema and every migration are there, then bulk SQL in one transaction:
instances of five workflows in all six statuses, a quarter with three steps;
on PostgreSQL in a schema of its own per size, analysed after the load), and
opens each as the command line does (``memable._inspect.open_existing``).
All the stores stay open while the reads are timed: each read once per size
as a warm-up, then ``reps`` rounds in which the sizes take turns (as W6 W3
does, this machine's CPU speed changing within a minute); the median and p95
of each. Timed:

- ``list failed``: ``memable._inspect.list_instances(store, "orders",
  "failed")``, what ``memable list --workflow orders --status failed``
  prints. Checked: the ids are those of the failed "orders" rows inserted,
  oldest first.
- ``overview``: ``store.status_counts()``, the dashboard overview's read; and
  ``overview page``: ``memable.web.pages.overview(store)`` whole (the counts,
  the queues, the schedules). Checked: the counts per workflow and status are
  those inserted.
- ``purge``: ``admin.purge_batches(store, cutoff, now)``, what ``memable purge`` runs, twice per
  store (a purge cannot be repeated on the same rows): the oldest hundredth of
  the instances (1,000 of 100,000), then the next tenth (10,000), each by a
  cutoff, the ``completed_at`` of the finished row after them (as epoch seconds). Checked: it
  returned that count, those instances and their steps are gone, and every
  other instance, with each of its steps, is still there (and the counts by
  workflow and status are those inserted less the purged).

Each figure is recorded with the count it returned, counted or purged, and its
cost per unit (µs per returned row, per instance counted, per purged
instance); ``growth`` is that cost at the largest size over the smallest, but for
the purge, whose amount can vary in one store, the tenth's over the
hundredth's in the largest store (``purge by store size``: the tenth's across
the sizes, where the store grows as well). The
stores are removed at the end (files, or schemas: the worker drops only its
own).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from memable._store.admin import purge_batches

from ._workloads import _engine, check
from ._workloads_web import FILTER_WORKFLOW, _fill

T = TypeVar("T")

#: The statuses ``Store.purge`` deletes (with ``completed_at`` before its cutoff).
FINISHED = ("completed", "failed", "cancelled")
#: Each timed operation, by its key in a size's record: the unit its cost is per.
UNITS = {"list failed": "returned row", "overview": "instance counted",
         "overview page": "instance counted", "purge hundredth": "purged instance",
         "purge": "purged instance"}


def _turns(actions: dict[int, Callable[[], T]], reps: int
           ) -> dict[int, tuple[dict[str, float], list[T]]]:
    """Each size's action once as a warm-up, then ``reps`` timed rounds in which the sizes
    take turns, so that every size sees the same moments of this noisy machine (see W6
    W3): per size, the median and p95 in ms, and its first and last answers."""
    answers = {n: [action()] for n, action in actions.items()}
    samples: dict[int, list[float]] = {n: [] for n in actions}
    for _ in range(reps):
        for n, action in actions.items():
            start = time.perf_counter()
            answer = action()
            samples[n].append(time.perf_counter() - start)
            answers[n][1:] = [answer]
    timed = {}
    for n, times in samples.items():
        ordered = sorted(times)
        timed[n] = ({"ms": statistics.median(ordered) * 1e3,
                     "p95_ms": ordered[max(0, round(0.95 * len(ordered)) - 1)] * 1e3},
                    answers[n])
    return timed


def _figure(timing: dict[str, float], count: int) -> dict[str, float]:
    """A timing with the count it is of, and its cost per unit in µs."""
    return {**timing, "count": count, "per_unit_us": timing["ms"] * 1e3 / max(count, 1)}


def _select(p: dict[str, Any], path: Path, sql: str) -> list[tuple[Any, ...]]:
    """The rows of ``sql`` on the store, read on a connection of its own (not timed)."""
    if p.get("store"):
        import psycopg

        with psycopg.connect(p["store"], autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{p["schema"]}"')
            return [tuple(row) for row in conn.execute(sql).fetchall()]
    import sqlite3

    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


def _present(p: dict[str, Any], path: Path) -> tuple[set[tuple[str, str]], Counter[Any]]:
    """(workflow, id) of every instance in the store, and how many steps each has."""
    instances = {(w, i) for w, i in _select(p, path, "SELECT workflow, instance_id "
                                                     "FROM memable_instances")}
    steps: Counter[Any] = Counter({(w, i): int(n) for w, i, n in _select(
        p, path, "SELECT workflow, instance_id, COUNT(*) FROM memable_steps "
                 "GROUP BY workflow, instance_id")})
    return instances, steps


def _drop(p: dict[str, Any], path: Path) -> None:
    """Remove one size's store: its PostgreSQL schema, or its file (with WAL and index)."""
    if p.get("store"):
        import psycopg

        with psycopg.connect(p["store"], autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{p["schema"]}" CASCADE')
        return
    for suffix in ("", "-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


class _Sized:
    """One size's store, filled as W10 fills its own and opened as the command line opens
    one, with what the checks expect of it."""

    def __init__(self, tmp: Path, p: dict[str, Any], size: int) -> None:
        from memable._inspect import open_existing

        # On PostgreSQL each size in a schema of its own (the worker drops only its own).
        self.p = {**p, "schema": f"{p['schema']}_{size}"} if p.get("store") else p
        self.size, self.path = size, tmp / f"w11_{size}.db"
        _engine(tmp, f"w11_{size}", self.p).close()  # the schema and migrations, empty
        started = time.perf_counter()
        rows, self.step_count = _fill(self.p, self.path, size, datetime.now(timezone.utc))
        self.fill_s = time.perf_counter() - started
        self.keys = {(r["workflow"], r["instance_id"]) for r in rows}
        self.counts = Counter((r["workflow"], r["status"]) for r in rows)
        self.failed = [r["instance_id"] for r in sorted(rows, key=lambda r: (
            r["created_at"], r["workflow"], r["instance_id"]))
            if r["workflow"] == FILTER_WORKFLOW and r["status"] == "failed"]
        # The finished, oldest first by completed_at: the purges take them in that order.
        self.finished = sorted((r for r in rows if r["status"] in FINISHED),
                               key=lambda r: str(r["completed_at"]))
        self.purged_so_far = 0
        self.store = open_existing(self.p["store"] if self.p.get("store") else str(self.path),
                                   self.p["schema"] if self.p.get("store") else None)

    def check_listed(self, answer: list[dict[str, Any]]) -> None:
        check([i["instance_id"] for i in answer] == self.failed,
              f"W11 {self.size}: list_instances({FILTER_WORKFLOW!r}, 'failed') gave "
              f"{len(answer)} rows, not the {len(self.failed)} inserted, oldest first")

    def check_counts(self, got: list[tuple[str, str, int]]) -> None:
        check(Counter({(w, s): n for w, s, n in got}) == self.counts,
              f"W11 {self.size}: status_counts() differs from the rows inserted")

    def check_overview(self, page: dict[str, Any]) -> None:
        shown = Counter({(w["name"], s): n for w in page["workflows"]
                         for s, n in w["counts"].items() if n})
        check(page["total"] == self.size and shown == self.counts,
              f"W11 {self.size}: the overview shows other counts than those inserted")

    def purge(self, count: int) -> dict[str, float]:
        """Purge the ``count`` oldest finished instances left, timed; check what went and
        what stayed."""
        first, finished = self.purged_so_far, self.finished
        check(count > 0 and first + count < len(finished), f"W11 {self.size}: "
              f"{len(finished)} finished rows, cannot purge {count} after {first}")
        cutoff: str = finished[first + count]["completed_at"]
        check(finished[first + count - 1]["completed_at"] < cutoff,
              f"W11 {self.size}: two finished rows complete at the cutoff {cutoff}")
        going = finished[first:first + count]
        purged = {(r["workflow"], r["instance_id"]) for r in going}
        instances, steps = _present(self.p, self.path)
        check(instances == self.keys,
              f"W11 {self.size}: the store holds other instances than it should")
        check(first or sum(steps.values()) == self.step_count, f"W11 {self.size}: the store "
              f"holds {sum(steps.values())} steps, not the {self.step_count} inserted")
        started = time.perf_counter()
        before = datetime.fromisoformat(cutoff).timestamp()  # epoch seconds, as it is passed
        deleted = sum(purge_batches(self.store, before, time.time()))
        seconds = time.perf_counter() - started
        check(deleted == count, f"W11 {self.size}: purge({cutoff}) returned {deleted}, "
              f"not {count}")
        after, steps_after = _present(self.p, self.path)
        check(after == self.keys - purged, f"W11 {self.size}: after the purge the "
              f"store lacks {len(self.keys - purged - after)} instances it should "
              f"keep and holds {len(after & purged)} it should have purged")
        check(steps_after == Counter({k: n for k, n in steps.items() if k not in purged}),
              f"W11 {self.size}: after the purge the steps are not those of the instances "
              "kept")
        self.keys -= purged
        self.counts -= Counter((r["workflow"], r["status"]) for r in going)
        self.purged_so_far += count
        left = Counter({(w, s): n for w, s, n in self.store.status_counts()})
        check(left == self.counts, f"W11 {self.size}: after the purge the counts are "
              "not those inserted less the purged")
        return _figure({"ms": seconds * 1e3}, count)


def store_scale(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """W11: list of one workflow's failed, the overview's counts and a purge of a tenth, at
    each of ``sizes`` instances; each one's cost per unit and how it grows."""
    from memable._clock import SYSTEM_CLOCK
    from memable._inspect import list_instances
    from memable.web.pages import overview

    sizes, reps = p["sizes"], p["reps"]
    made: dict[int, _Sized] = {}
    try:
        for size in sizes:
            made[size] = _Sized(tmp, p, size)
        # What the checks keep of the rows (every row of every size) is the workload's,
        # not the reads': out of the collector's sight, or each collection the reads
        # trigger walks it, and more of them at the larger size.
        gc.collect()
        gc.freeze()
        figures: dict[int, dict[str, Any]] = {
            n: {"instances": n, "steps": s.step_count, "fill_s": s.fill_s}
            for n, s in made.items()}
        for n, (timing, answers) in _turns(
                {n: partial(list_instances, s.store, FILTER_WORKFLOW, "failed",
                         clock=SYSTEM_CLOCK)
                 for n, s in made.items()}, reps).items():
            for answer in answers:
                made[n].check_listed(answer)
            figures[n]["list failed"] = _figure(timing, len(made[n].failed))
        for n, (timing, counts) in _turns(
                {n: s.store.status_counts for n, s in made.items()}, reps).items():
            for got in counts:
                made[n].check_counts(got)
            figures[n]["overview"] = _figure(timing, n)
        for n, (timing, pages) in _turns(
                {n: partial(overview, s.store, SYSTEM_CLOCK) for n, s in made.items()},
                reps).items():
            for page in pages:
                made[n].check_overview(page)
            figures[n]["overview page"] = _figure(timing, n)
        for n, s in made.items():  # a purge cannot be repeated on the same rows
            # A hundredth, then a tenth: how the cost grows with what it purges, in one
            # store (across the sizes it grows with the store as well).
            figures[n]["purge hundredth"] = s.purge(n // 100)
            figures[n]["purge"] = s.purge(n // 10)
    finally:
        gc.unfreeze()
        for s in made.values():
            s.store.close()
        for size in sizes:  # a size whose fill failed may have left its store too
            _drop({**p, "schema": f"{p['schema']}_{size}"} if p.get("store") else p,
                  tmp / f"w11_{size}.db")
    small, large = sizes[0], sizes[-1]
    # What each figure at the largest store is judged against: itself at the smallest;
    # the purge, whose amount can vary in one store, a hundredth of the largest.
    bases = {op: (small, op) for op in UNITS}
    bases["purge"] = (large, "purge hundredth")
    growth = {op: figures[large][op]["per_unit_us"] / figures[n][basis]["per_unit_us"]
              for op, (n, basis) in bases.items()}
    growth["purge by store size"] = (figures[large]["purge"]["per_unit_us"]
                                     / figures[small]["purge"]["per_unit_us"])
    return {"sizes": sizes, "reps": reps, "units": UNITS,
            "by_size": {str(n): f for n, f in figures.items()},
            "bases": {op: [n, basis] for op, (n, basis) in bases.items()}, "growth": growth}


#: W11, by the name the worker runs it under.
SCALE_WORKLOADS = {"store_scale": store_scale}
