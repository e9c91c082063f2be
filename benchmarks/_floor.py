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
