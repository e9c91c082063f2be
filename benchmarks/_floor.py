"""The raw SQLite floor: what one committed row and one primary-key read cost here.

Measured with the same journal mode (WAL) and ``synchronous`` setting as the
engine, on a file in the same temporary directory, in the same run.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path


def insert_commit_us(directory: Path, synchronous: str, rows: int) -> float:
    """Microseconds per INSERT + COMMIT of one step-sized row."""
    conn = sqlite3.connect(directory / "floor.db", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        conn.execute(
            "CREATE TABLE steps (workflow TEXT, instance_id TEXT, key TEXT, result TEXT, "
            "PRIMARY KEY (workflow, instance_id, key))"
        )
        # Warm the WAL to its working size first: a growing WAL makes every
        # commit an append, which is not the steady state the engine runs in.
        _insert(conn, "warm", rows)
        start = time.perf_counter()
        _insert(conn, "timed", rows)
        return (time.perf_counter() - start) / rows * 1e6
    finally:
        conn.close()


def _insert(conn: sqlite3.Connection, instance: str, rows: int) -> None:
    payload = '{"i":0,"s":"' + "x" * 32 + '"}'
    for i in range(rows):
        conn.execute("BEGIN")
        conn.execute("INSERT INTO steps VALUES ('floor', ?, ?, ?)", (instance, f"s{i}", payload))
        conn.execute("COMMIT")


def pk_read_us(directory: Path, rows: int) -> float:
    """Microseconds per primary-key SELECT of one row, inside one read transaction."""
    conn = sqlite3.connect(directory / "floor.db", isolation_level=None)
    try:
        keys = [f"s{i}" for i in range(rows)]
        conn.execute("BEGIN")
        start = time.perf_counter()
        for key in keys:
            conn.execute(
                "SELECT result FROM steps WHERE workflow = 'floor' AND instance_id = 'timed' "
                "AND key = ?",
                (key,),
            ).fetchone()
        elapsed = time.perf_counter() - start
        conn.execute("COMMIT")
        return elapsed / rows * 1e6
    finally:
        conn.close()


#: The commits a queued one-step instance needs, raw: stored queued, claimed (set
#: running), its step stored, its end stored. W7's children are stored with the
#: parent's step, all in one transaction, so a child needs the last three.
QUEUE_WRITES = (
    "INSERT INTO instances VALUES ('floor', :id, 'queued', :input, NULL)",
    "UPDATE instances SET status = 'running' WHERE workflow = 'floor' AND instance_id = :id",
    "INSERT INTO steps VALUES ('floor', :id, 'small', :payload)",
    "UPDATE instances SET status = 'completed', output = :output "
    "WHERE workflow = 'floor' AND instance_id = :id",
)


#: The two tables those commits write, as both stores take them.
QUEUE_TABLES = (
    "CREATE TABLE instances (workflow TEXT, instance_id TEXT, status TEXT, input TEXT, "
    "output TEXT, PRIMARY KEY (workflow, instance_id))",
    "CREATE TABLE steps (workflow TEXT, instance_id TEXT, key TEXT, result TEXT, "
    "PRIMARY KEY (workflow, instance_id, key))",
)


def queue_instance_us(directory: Path, synchronous: str, rows: int) -> dict[str, float]:
    """Microseconds per queued one-step instance (W8: four commits) and per child (W7:
    the inserts of all in one commit, then three commits each), raw ``sqlite3`` on one
    connection, as the W1 floor is measured."""
    conn = sqlite3.connect(directory / f"queue-floor-{synchronous}.db", isolation_level=None)
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(f"PRAGMA synchronous = {synchronous.upper()}")
        for table in QUEUE_TABLES:
            conn.execute(table)
        _queue_rows(conn, "warm", rows, children=False)  # the WAL to its working size
        start = time.perf_counter()
        _queue_rows(conn, "w8", rows, children=False)
        instance_us = (time.perf_counter() - start) / rows * 1e6
        start = time.perf_counter()
        _queue_rows(conn, "w7", rows, children=True)
        child_us = (time.perf_counter() - start) / rows * 1e6
        return {"queue_instance_us": instance_us, "queue_child_us": child_us}
    finally:
        conn.close()


def _queue_rows(conn: sqlite3.Connection, prefix: str, rows: int, *, children: bool) -> None:
    payload = '{"i":0,"s":"' + "x" * 32 + '"}'
    params = [{"id": f"{prefix}-{i}", "input": str(i), "payload": payload, "output": str(i)}
              for i in range(rows)]
    insert, *per_instance = QUEUE_WRITES
    if children:  # stored together, in the parent's step's transaction
        conn.execute("BEGIN")
        conn.executemany(insert, params)
        conn.execute("COMMIT")
    else:
        per_instance = list(QUEUE_WRITES)
    for values in params:
        for statement in per_instance:
            conn.execute("BEGIN")
            conn.execute(statement, values)
            conn.execute("COMMIT")
