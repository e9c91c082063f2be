"""A nightly report run from cron: one workflow instance per day, its id the date.

    15 2 * * *  cd /srv/shop && .venv/bin/python nightly_report.py --db workflows.db

Because the instance id is the day the report covers:

- a run that crashed (killed, rebooted, out of memory) is resumed by the next
  run for that day: completed steps are served from the store, only the step
  in flight and those after it execute;
- a second run for a day whose report is done invokes nothing new;
- a run that failed (an exception in a step) is resumed by the next run.

Each step prints ``executing <key>`` when its function runs, so the output
shows what executed and what was served from the store. For a crash drill,
set ``NIGHTLY_REPORT_HOLD=<key>``: the run blocks inside that step until it is
killed.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
from collections.abc import Callable
from datetime import date, timedelta
from pathlib import Path

import attrs
from memable import Context, Engine, MetadataStatus, WorkflowFailed

WORKFLOW = "nightly-report"


@attrs.frozen
class Totals:
    """What the report says about one day."""

    day: date
    orders: int
    revenue: float


def executing(key: str) -> None:
    """Say that a step function runs; in a crash drill, block here until killed."""
    print(f"executing {key}", flush=True)
    if os.environ.get("NIGHTLY_REPORT_HOLD") == key:
        print(f"holding in {key}", flush=True)
        threading.Event().wait()


def fetch_orders(day: date) -> list[float]:
    """Stand-in for a query on the shop's database: the total of each order of ``day``."""
    executing("orders:v1")
    return [float(10 + (day.toordinal() + 7 * i) % 40) for i in range(3 + day.day % 4)]


def summarise(day: date, orders: list[float]) -> Totals:
    executing("totals:v1")
    return Totals(day=day, orders=len(orders), revenue=round(sum(orders), 2))


def publish(out_dir: str, totals: Totals) -> str:
    """Write the report file. Idempotent: running it again writes the same file."""
    executing("publish:v1")
    path = Path(out_dir) / f"report-{totals.day.isoformat()}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(attrs.asdict(totals, value_serializer=_jsonable)) + "\n")
    os.replace(tmp, path)  # readers see the old file or the new one, never half of one
    return str(path)


def notify(idempotency_key: str, path: str) -> str:
    """Stand-in for a mail API that drops a second request with the same idempotency key."""
    executing("notify:v1")
    return f"sent {path} (idempotency key {idempotency_key})"


def _jsonable(_instance: object, _field: object, value: object) -> object:
    return value.isoformat() if isinstance(value, date) else value


def make_workflow(out_dir: str) -> Callable[[Context, date], str]:
    def nightly_report(ctx: Context, day: date) -> str:
        ctx.set_status(f"report for {day}")
        orders = ctx.step("orders:v1").run(fetch_orders, day)
        totals = ctx.step("totals:v1").run(summarise, day, orders)
        path = ctx.step("publish:v1").run(publish, out_dir, totals)
        # If the process dies after the mail API accepted the request but before
        # this step committed, the step runs again: the key lets the API drop it.
        ctx.step("notify:v1").run(notify, f"{ctx.instance_id}/notify:v1", path)
        return path

    return nightly_report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the report of one day, once.")
    parser.add_argument("--db", default="workflows.db", help="the memable store")
    parser.add_argument("--out", default="reports", help="directory of the report files")
    parser.add_argument(
        "--day",
        type=date.fromisoformat,
        default=date.today() - timedelta(days=1),
        help="the day to report on, YYYY-MM-DD (default: yesterday)",
    )
    args = parser.parse_args(argv)
    day_id = args.day.isoformat()

    engine = Engine.open(args.db)
    engine.register(WORKFLOW, make_workflow(args.out))
    # What the last run left, read before the engine starts: once started, it may
    # recover (and finish) a crashed run before this line would have run.
    meta = engine.get_metadata(WORKFLOW, day_id)
    if meta is None:
        print(f"{day_id}: starting", flush=True)
    else:
        print(f"{day_id}: found {meta.status.name}", flush=True)
    with engine:  # on start, instances of a dead process are recovered
        if meta is not None and isinstance(meta.status, MetadataStatus.Failed):
            inv = engine.resume(WORKFLOW, day_id)
        else:
            # New: runs it. Completed: runs nothing. Running: a crashed run is
            # being recovered, or a live one in another process is waited for.
            inv = engine.invoke(WORKFLOW, args.day, instance_id=day_id)
        try:
            path = inv.result()
        except WorkflowFailed as err:
            print(f"{day_id}: {err}", flush=True)
            return 1
    print(f"{day_id}: done, {path}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
