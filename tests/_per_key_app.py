"""An app for the per-key tests' worker processes (``memable worker _per_key_app:engine``).

One queue, ``jobs``: ``concurrency=6`` (more than the test's keys), ``per_key=1`` and
``per_process=1`` (so the runs of several keys at once are in several processes).
``job`` takes its concurrency key as input; its one step records its start and its end
as rows of a SQLite file of its own (MEMABLE_PERKEY_RECORDS, each write under ``BEGIN
IMMEDIATE``, numbered in the order they commit), and between the two waits until it
sees a run of another key in progress, or until no other key has a run left to do
(MEMABLE_PERKEY_KEYS keys of MEMABLE_PERKEY_EACH instances each): so every run but the
last ones overlaps one of another key. A wait longer than ``GIVE_UP`` records
``gave-up`` and ends the run, so a broken limit fails the test instead of hanging it.
The store comes from MEMABLE_PERKEY_DB (a file or a PostgreSQL URL) and
MEMABLE_PERKEY_SCHEMA. Not a test module.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time

from memable import Context, Engine

#: The limits every process declares, as the SPEC asks: the same everywhere.
LIMITS = {"concurrency": 6, "per_key": 1, "per_process": 1}
#: Seconds a run waits for a run of another key before it records ``gave-up``.
GIVE_UP = 30.0
#: Seconds between two looks at the records (another process writes them: no event).
LOOK_EVERY = 0.005

RECORDS = """
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, instance TEXT NOT NULL, key TEXT NOT NULL,
    kind TEXT NOT NULL, pid INTEGER NOT NULL)
"""
# Runs of another key that started and have not ended.
_OTHERS_IN_PROGRESS = """
SELECT count(*) FROM events AS s WHERE s.kind = 'start' AND s.key <> ? AND NOT EXISTS (
    SELECT 1 FROM events AS e WHERE e.kind = 'end' AND e.instance = s.instance)
"""
_OTHERS_ENDED = "SELECT count(*) FROM events WHERE kind = 'end' AND key <> ?"


def _connect() -> sqlite3.Connection:
    return sqlite3.connect(os.environ["MEMABLE_PERKEY_RECORDS"], timeout=30,
                           isolation_level=None)


def create_records(path: str) -> None:
    """Create the records file (WAL: the runs' looks do not block their writes)."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = wal")
        conn.execute(RECORDS)
    finally:
        conn.close()


def record(instance: str, key: str, kind: str) -> None:
    """Append one event, under the file's write lock (so ``seq`` is the commit order)."""
    conn = _connect()
    try:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO events (instance, key, kind, pid) VALUES (?, ?, ?, ?)",
                     (instance, key, kind, os.getpid()))
        conn.execute("COMMIT")
    finally:
        conn.close()


def _another_key_runs_or_none_left(key: str) -> bool:
    others = int(os.environ["MEMABLE_PERKEY_EACH"]) * (int(os.environ["MEMABLE_PERKEY_KEYS"]) - 1)
    conn = _connect()
    try:
        if conn.execute(_OTHERS_IN_PROGRESS, (key,)).fetchone()[0] > 0:
            return True
        return bool(conn.execute(_OTHERS_ENDED, (key,)).fetchone()[0] >= others)
    finally:
        conn.close()


def job(ctx: Context, key: str) -> str:
    """One step: record its start, wait for a run of another key (see the module), record
    its end."""

    def work() -> str:
        record(ctx.instance_id, key, "start")
        pause, deadline = threading.Event(), time.monotonic() + GIVE_UP
        while not _another_key_runs_or_none_left(key):
            if time.monotonic() > deadline:
                record(ctx.instance_id, key, "gave-up")
                break
            pause.wait(LOOK_EVERY)  # a bounded look across processes
        record(ctx.instance_id, key, "end")
        return key

    return str(ctx.step("work").run(work))


def make(**options: object) -> Engine:
    """An engine on the store the environment names, with the queue and the workflow."""
    schema = os.environ.get("MEMABLE_PERKEY_SCHEMA") or None
    engine = Engine.open(os.environ["MEMABLE_PERKEY_DB"], schema=schema, **options)  # type: ignore[arg-type]
    engine.queue("jobs", **LIMITS)
    engine.register("job", job, queue="jobs")
    return engine


def engine() -> Engine:
    """What ``memable worker _per_key_app:engine`` loads (called: a fresh engine)."""
    return make(poll_interval=0.05)
