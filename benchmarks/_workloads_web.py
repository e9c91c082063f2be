"""W10, the dashboard: its pages over a store of many instances (memable only; no DBOS side).

``dashboard`` opens an engine on a fresh store (so the schema and every
migration are there) and closes it, then fills the store with bulk SQL in one
transaction: ``n`` instances of five workflows in all six statuses (three of
the workflows through queues), a quarter of them with three steps, the
suspended ones with the signal row they wait on, two schedules, and one live
owner that declares the queues. Rows are what the engine writes: ISO times,
JSON values, tracebacks for failures, queue, priority and ``queued_at`` for
the queued. On PostgreSQL the table is then analysed, as autovacuum does after
a bulk load; SQLite has no statistics (memable never runs ``ANALYZE``).

Then it opens the dashboard on the store as an operator does
(``memable.web.app(path or URL)``, read-only) and times, through
``werkzeug.test.Client``, the full answer (reads, rendering, WSGI) of each
page ``_pages`` names: one request as a warm-up (not counted), then ``reps``
more, their median and p95. Each page checks what it shows: the overview and
``/metrics`` the counts that were inserted, the list pages the rows, in
order, that the inserted rows give newest first (or none, for an id prefix no
instance has), the detail page its instance and steps.

It also times each store read the pages make on its own, and records the
query plans of the list's and the counts' reads (``EXPLAIN QUERY PLAN`` on
SQLite, ``EXPLAIN ANALYZE`` on PostgreSQL), checking that no read of a page
of the list (unfiltered, filtered, deep, last) scans the table.
"""

from __future__ import annotations

import json
import os
import random
import re
import socket
import statistics
import time
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from memable._queues import Declarations, QueueSpec
from memable._sqlite.schema import STEP_COLUMNS
from memable._store.sql.instances import INSTANCE_COLUMNS

from ._workloads import _engine, check

#: (workflow, its queue or None, weight): how the instances are spread.
WORKFLOWS = (("orders", None, 40), ("emails", "mail", 25), ("reports", None, 15),
             ("billing", "payments", 12), ("sync", "sync", 8))
#: Status weights, for a workflow with a queue and for one without (no queued ones).
STATUS_WEIGHTS = {
    True: {"completed": 66, "failed": 8, "cancelled": 3, "suspended": 6, "running": 4,
           "queued": 13},
    False: {"completed": 74, "failed": 8, "cancelled": 3, "suspended": 10, "running": 5,
            "queued": 0},
}
STEP_KEYS = ("fetch", "charge", "notify")
OWNER = "bench-owner-1"
#: The workflow the filtered page shows the failures of.
FILTER_WORKFLOW = "orders"
#: An id prefix no instance has (ids are 32 hex digits).
NO_MATCH = "zz"
#: Rows on one page of the list (``memable.web.pages.PAGE_SIZE``, checked).
PAGE = 50
BATCH = 5000


def _iso(t: datetime) -> str:
    return t.isoformat(timespec="microseconds")


def _instances(n: int, now: datetime) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """``n`` instance rows, oldest first, each with its step rows; created over 30 days
    before ``now`` (a few seconds apart, some at the same microsecond)."""
    rng = random.Random(10)
    names = [w for w, _, _ in WORKFLOWS]
    queues = {w: q for w, q, _ in WORKFLOWS}
    weights = [weight for _, _, weight in WORKFLOWS]
    start = now - timedelta(days=30)
    spacing = 30 * 86400 / n
    for i in range(n):
        workflow = rng.choices(names, weights)[0]
        queue = queues[workflow]
        table = STATUS_WEIGHTS[queue is not None]
        status = rng.choices(list(table), list(table.values()))[0]
        # Every 500th pair shares its time with the one before: ties the order breaks.
        created = start + timedelta(seconds=(i - (i % 500 == 1)) * spacing)
        updated = created + timedelta(seconds=rng.uniform(0.01, 30))
        row: dict[str, Any] = dict.fromkeys(INSTANCE_COLUMNS)
        row.update(
            workflow=workflow, instance_id=f"{rng.getrandbits(128):032x}", status=status,
            input=json.dumps({"n": i, "customer": f"c-{rng.randrange(5000)}",
                              "items": [rng.randrange(100) for _ in range(3)]}),
            created_at=_iso(created), updated_at=_iso(updated),
        )
        if queue is not None:
            row.update(queue=queue, priority=rng.choice((0, 0, 0, 1)), queued_at=_iso(created))
        steps = 3 if i % 4 == 0 else 0
        if status == "queued":
            row.update(updated_at=_iso(created))
            steps = 0
        elif status == "running":
            row.update(owner=OWNER, step_key="notify", step_started=_iso(updated),
                       status_message="sending the notification")
        elif status == "suspended":
            row.update(waiting_for="approval", message="waiting for approval")
        elif status == "completed":
            row.update(output=json.dumps({"ok": True, "n": i}), completed_at=_iso(updated))
        elif status == "failed":
            row.update(
                message="ValueError: the payment provider refused the card",
                completed_at=_iso(updated),
                traceback="Traceback (most recent call last):\n"
                + '  File "app/flows.py", line 42, in charge\n    provider.charge(card)\n' * 3
                + "ValueError: the payment provider refused the card\n",
            )
        elif status == "cancelled":
            row.update(message="cancelled by an operator", completed_at=_iso(updated))
        step_rows = []
        for seq in range(steps):
            key = STEP_KEYS[seq]
            failed = status == "failed" and seq == steps - 1
            at = created + timedelta(seconds=seq + 0.5)
            step = dict.fromkeys(STEP_COLUMNS)
            step.update(
                workflow=workflow, instance_id=row["instance_id"], key=key, seq=seq,
                kind="step", state="failed" if failed else "completed",
                result=None if failed else json.dumps({"step": key, "i": i, "s": "x" * 32}),
                attempts=3 if failed else 1, started_at=_iso(at),
                completed_at=_iso(at + timedelta(seconds=0.2)),
                error="ValueError: the payment provider refused the card" if failed else None,
            )
            step_rows.append(step)
        if status == "suspended":
            step = dict.fromkeys(STEP_COLUMNS)
            step.update(workflow=workflow, instance_id=row["instance_id"], key="approval",
                        seq=len(step_rows), kind="signal", state="waiting", attempts=0)
            step_rows.append(step)
        yield row, step_rows


def _extras(now: datetime) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The live owner (heartbeat now, declaring the queues) and two schedules."""
    declares = Declarations(
        [w for w, _, _ in WORKFLOWS],
        [QueueSpec("mail", concurrency=8), QueueSpec("payments", concurrency=2,
                                                     rate=(100, 60.0)),
         QueueSpec("sync", per_process=1)],
        {"nightly-report": ["0 2 * * *", "UTC"], "hourly-sync": ["0 * * * *", "UTC"]},
    ).to_json()
    owner = {"id": OWNER, "host": socket.gethostname(), "pid": os.getpid(),
             "heartbeat": now.timestamp(), "lease": 86400.0, "started_at": _iso(now),
             "boot_id": None, "pid_ns": None, "proc_start": None, "declares": declares}
    last = now.replace(minute=0, second=0, microsecond=0)
    schedules = [
        {"name": "nightly-report", "cron": "0 2 * * *", "timezone": "UTC",
         "workflow": "reports", "last_tick": (last - timedelta(hours=3)).strftime(
             "%Y-%m-%dT%H:%M:%SZ"), "since": _iso(now - timedelta(days=30)),
         "skipped": 0, "missed": 0},
        {"name": "hourly-sync", "cron": "0 * * * *", "timezone": "UTC", "workflow": "sync",
         "last_tick": last.strftime("%Y-%m-%dT%H:%M:%SZ"),
         "since": _iso(now - timedelta(days=30)), "skipped": 0, "missed": 1},
    ]
    return owner, schedules


def _insert_sql(table: str, columns: list[str], mark: str) -> str:
    quoted = ", ".join(f'"{c}"' for c in columns)
    return f"INSERT INTO {table} ({quoted}) VALUES ({', '.join([mark] * len(columns))})"


def _fill(p: dict[str, Any], path: Path, n: int, now: datetime
          ) -> tuple[list[dict[str, Any]], int]:
    """Bulk-insert the store's rows in one transaction; the instance rows, and how many
    step rows."""
    rows: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for row, step_rows in _instances(n, now):
        rows.append(row)
        steps.extend(step_rows)
    owner, schedules = _extras(now)
    tables = [("memable_instances", list(INSTANCE_COLUMNS), rows),
              ("memable_steps", list(STEP_COLUMNS), steps),
              ("memable_owners", list(owner), [owner]),
              ("memable_schedules", list(schedules[0]), schedules)]
    if p.get("store"):
        import psycopg

        with psycopg.connect(p["store"]) as conn:  # one transaction, committed on exit
            conn.execute(f'SET search_path TO "{p["schema"]}"')
            with conn.cursor() as cursor:
                for table, columns, values in tables:
                    sql = _insert_sql(table, columns, "%s")
                    for at in range(0, len(values), BATCH):
                        cursor.executemany(sql, [tuple(v[c] for c in columns)
                                                 for v in values[at:at + BATCH]])
            conn.commit()
            conn.autocommit = True
            # What autovacuum does next.
            conn.execute("ANALYZE memable_instances; ANALYZE memable_steps")
    else:
        import sqlite3

        db = sqlite3.connect(path, isolation_level=None)
        try:
            db.execute("BEGIN")
            for table, columns, values in tables:
                sql = _insert_sql(table, columns, "?")
                for at in range(0, len(values), BATCH):
                    db.executemany(sql, [tuple(v[c] for c in columns)
                                         for v in values[at:at + BATCH]])
            db.execute("COMMIT")
        finally:
            db.close()
    return rows, len(steps)


def _newest_first(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(rows, key=lambda r: (r["created_at"], r["workflow"], r["instance_id"]),
                  reverse=True)


_LINK = re.compile(r'class="instance-link" href="/instance\?workflow=([^&"]+)&amp;id=([^"]+)"')


def _listed(html: str) -> list[tuple[str, str]]:
    return _LINK.findall(html)


def _pages(rows: list[dict[str, Any]]) -> list[tuple[str, str, str, Callable[[str], None]]]:
    """(label, what, path, check of the answer's text) of every page timed."""
    newest = _newest_first(rows)
    pairs = [(r["workflow"], r["instance_id"]) for r in newest]
    failed = [(r["workflow"], r["instance_id"]) for r in newest
              if r["workflow"] == FILTER_WORKFLOW and r["status"] == "failed"]
    counts = Counter((r["workflow"], r["status"]) for r in rows)
    deep = 100
    # One failed instance with steps, the kind an operator opens.
    target = next(r for r in rows if r["status"] == "failed"
                  and int(json.loads(r["input"])["n"]) % 4 == 0)

    def overview(text: str) -> None:
        check(f'<td class="n">{len(rows)}</td>' in text, "W10 / does not show the total")
        for (workflow, status), n in counts.items():
            href = f'href="/instances?workflow={workflow}&amp;status={status}">{n}</a>'
            check(href in text, f"W10 / does not show {n} {status} of {workflow}")

    def first(text: str) -> None:
        check(_listed(text) == pairs[:PAGE], "W10 /instances shows other rows")
        check('id="page-next"' in text, "W10 /instances has no next page")

    def filtered(text: str) -> None:
        check(_listed(text) == failed[:PAGE], "W10 the filtered page shows other rows")

    def deep_page(text: str) -> None:
        want = pairs[(deep - 1) * PAGE:deep * PAGE]
        check(len(want) == PAGE and _listed(text) == want, f"W10 page {deep} shows other rows")

    last = -(-len(rows) // PAGE)

    def last_page(text: str) -> None:
        want = pairs[(last - 1) * PAGE:]
        check(_listed(text) == want and 'id="page-next"' not in text,
              f"W10 the last page ({last}) shows other rows")

    def no_match(text: str) -> None:
        check('id="none"' in text and not _listed(text), "W10 the id prefix matched rows")

    def detail(text: str) -> None:
        check(target["instance_id"] in text and "charge" in text and "notify" in text,
              "W10 /instance does not show the instance and its steps")

    def metrics(text: str) -> None:
        for (workflow, status), n in counts.items():
            line = f'memable_instances{{workflow="{workflow}",status="{status}"}} {n}\n'
            check(line in text, f"W10 /metrics lacks {line!r}")

    n = len(rows)
    return [
        ("W10 /", f"overview, {n} instances", "/", overview),
        ("W10 /instances", "list, first page", "/instances", first),
        ("W10 filtered", f"list, workflow={FILTER_WORKFLOW}&status=failed",
         f"/instances?workflow={FILTER_WORKFLOW}&status=failed", filtered),
        ("W10 deep", f"list, page {deep}", f"/instances?page={deep}", deep_page),
        ("W10 last", f"list, last page ({last})", f"/instances?page={last}", last_page),
        ("W10 id prefix", "list, an id prefix no instance has (a search: reads every "
         "instance)", f"/instances?id={NO_MATCH}", no_match),
        ("W10 /instance", "one failed instance, 3 steps",
         f"/instance?workflow={target['workflow']}&id={target['instance_id']}", detail),
        ("W10 /metrics", "Prometheus scrape", "/metrics", metrics),
    ]


def _median_ms(action: Callable[[], Any], reps: int) -> dict[str, float]:
    action()  # warm-up
    samples = []
    for _ in range(reps):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    ordered = sorted(samples)
    return {"median_ms": statistics.median(ordered) * 1e3,
            "p95_ms": ordered[max(0, round(0.95 * len(ordered)) - 1)] * 1e3}


def _plan_reads(n: int) -> list[tuple[str, str, dict[str, Any]]]:
    """The reads of the list and counts whose plans are recorded: (name, SQL, parameters)."""
    from memable._store.sql import reads

    captured: list[tuple[str, str, dict[str, Any]]] = []

    def capture(name: str) -> Callable[[str, str, dict[str, Any]], list[dict[str, Any]]]:
        def read(what: str, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
            captured.append((name, sql, params))
            return []
        return read

    reads.status_counts(capture("status_counts"))
    reads.instance_page(capture("instance_page"), None, None, None, 0, PAGE + 1)
    reads.instance_page(capture("instance_page filtered"), FILTER_WORKFLOW, "failed", None,
                        0, PAGE + 1)
    reads.instance_page(capture("instance_page deep"), None, None, None, 99 * PAGE, PAGE + 1)
    last = (n - 1) // PAGE * PAGE
    reads.instance_page(capture("instance_page last"), None, None, None, last, PAGE + 1)
    reads.instance_page(capture("id prefix"), None, None, NO_MATCH, 0, PAGE + 1)
    reads.workflows(capture("workflows"))
    reads.queue_names(capture("queue_names"))
    return captured


def _plans(p: dict[str, Any], path: Path, n: int) -> dict[str, str]:
    """The plan of each read of ``_plan_reads``, as text: on PostgreSQL run, with the rows
    each node gave (``EXPLAIN ANALYZE``)."""
    plans = {}
    if p.get("store"):
        import psycopg

        from memable._store.transaction import POSTGRESQL

        with psycopg.connect(p["store"], autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{p["schema"]}"')
            for name, sql, params in _plan_reads(n):
                explain = "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) "
                lines = conn.execute(explain + POSTGRESQL.spell(sql), params).fetchall()
                plans[name] = "\n".join(line[0] for line in lines)
    else:
        import sqlite3

        db = sqlite3.connect(path)
        try:
            for name, sql, params in _plan_reads(n):
                lines = db.execute("EXPLAIN QUERY PLAN " + sql, params).fetchall()
                plans[name] = "\n".join(line[3] for line in lines)
        finally:
            db.close()
    return plans


def _scans_table(plan: str) -> bool:
    """Whether a plan reads the whole instances table (not an index)."""
    return bool(re.search(r"^SCAN instances$|Seq Scan on instances", plan, re.MULTILINE))


def dashboard(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """W10: the dashboard's pages over ``n`` instances, each page's median answer."""
    from werkzeug.test import Client

    from memable.web import app
    from memable.web.pages import PAGE_SIZE

    check(PAGE_SIZE == PAGE, f"W10 expects pages of {PAGE}, the dashboard's are {PAGE_SIZE}")
    n, reps = p["n"], p["reps"]
    path = tmp / "w10.db"
    _engine(tmp, "w10", p).close()  # the store, its schema and migrations, empty
    now = datetime.now(timezone.utc)
    started = time.perf_counter()
    rows, step_count = _fill(p, path, n, now)
    fill_s = time.perf_counter() - started
    dash = app(p["store"], schema=p["schema"]) if p.get("store") else app(path)
    client = Client(dash)
    pages: dict[str, dict[str, Any]] = {}
    try:
        for label, what, url, verify in _pages(rows):
            answers: list[Any] = []

            def get(url: str = url, answers: list[Any] = answers) -> None:
                answers.append(client.get(url))

            timing = _median_ms(get, reps)
            for answer in (answers[0], answers[-1]):
                check(answer.status_code == 200, f"W10 {url} answered {answer.status_code}")
                verify(answer.text)
            pages[label] = {"what": what, "url": url, **timing}
        store = dash.store
        reads = {
            "status_counts": _median_ms(store.status_counts, reps),
            "instance_page": _median_ms(
                lambda: store.instance_page(None, None, None, 0, PAGE + 1), reps),
            "instance_page deep": _median_ms(
                lambda: store.instance_page(None, None, None, 99 * PAGE, PAGE + 1), reps),
            "instance_page last": _median_ms(
                lambda: store.instance_page(None, None, None, (n - 1) // PAGE * PAGE,
                                            PAGE + 1), reps),
            "workflows": _median_ms(store.workflows, reps),
            "queue_names": _median_ms(store.queue_names, reps),
            "queue_stats": _median_ms(lambda: store.queue_stats("mail", time.time()), reps),
            "live_owners": _median_ms(lambda: store.live_owners(time.time()), reps),
            "schedules": _median_ms(store.schedules, reps),
        }
    finally:
        dash.close()
    plans = _plans(p, path, n)
    scans = [name for name, plan in plans.items()
             if name.startswith("instance_page") and _scans_table(plan)]
    check(not scans, f"W10 a list page scans the instances table: {scans}: {plans}")
    slowest = max(page["median_ms"] for page in pages.values())
    return {"per_op_us": slowest * 1e3, "n": n, "steps": step_count, "fill_s": fill_s,
            "reps": reps, "pages": pages, "reads": reads, "plans": plans}


#: W10, by the name the worker runs it under.
WEB_WORKLOADS = {"dashboard": dashboard}
