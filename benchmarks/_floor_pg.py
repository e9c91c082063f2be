"""The raw PostgreSQL floor: one committed row and one primary-key read on the same server.

Raw psycopg on one connection, in the same run as the workloads, in a schema
of their own that is dropped afterwards: an INSERT of one step-sized row and
its COMMIT, committed as durably as ``synchronous_commit`` says, two ways
(psycopg's default transaction, as the DBOS study measured it: BEGIN, INSERT,
COMMIT, three round trips; and an autocommit INSERT, one round trip), and a
primary-key SELECT.
"""

from __future__ import annotations

import time

import psycopg

from memable._store.transaction import POSTGRESQL

from ._floor import QUEUE_TABLES, QUEUE_WRITES


def _connect(
    url: str, synchronous: str, autocommit: bool = True
) -> psycopg.Connection[tuple[object, ...]]:
    conn = psycopg.connect(url, autocommit=True)
    conn.execute(f"SET synchronous_commit = {'on' if synchronous == 'full' else 'off'}")
    conn.autocommit = autocommit
    return conn


def measure(url: str, schema: str, synchronous: str, rows: int) -> dict[str, float]:
    """Microseconds per INSERT+COMMIT (both ways) and per primary-key read."""
    payload = '{"i":0,"s":"' + "x" * 32 + '"}'
    with _connect(url, synchronous) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            conn.execute(
                f'CREATE TABLE "{schema}".steps (workflow text, instance_id text, key text, '
                "result text, PRIMARY KEY (workflow, instance_id, key))"
            )
            insert = f'INSERT INTO "{schema}".steps VALUES (%s, %s, %s, %s)'
            for i in range(rows):  # warm the server's caches and the connection
                conn.execute(insert, ("floor", "warm", f"s{i}", payload))
            start = time.perf_counter()
            for i in range(rows):
                conn.execute(insert, ("floor", "timed", f"s{i}", payload))
            insert_us = (time.perf_counter() - start) / rows * 1e6
            with _connect(url, synchronous, autocommit=False) as tx:
                start = time.perf_counter()
                for i in range(rows):
                    tx.execute(insert, ("floor", "tx", f"s{i}", payload))
                    tx.commit()
                tx_us = (time.perf_counter() - start) / rows * 1e6
            select = (
                f'SELECT result FROM "{schema}".steps WHERE workflow = %s '
                "AND instance_id = %s AND key = %s"
            )
            start = time.perf_counter()
            for i in range(rows):
                conn.execute(select, ("floor", "timed", f"s{i}")).fetchone()
            read_us = (time.perf_counter() - start) / rows * 1e6
        finally:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
    return {"insert_commit_us": tx_us, "autocommit_insert_us": insert_us, "pk_read_us": read_us}


def measure_queue(url: str, schema: str, synchronous: str, rows: int) -> dict[str, float]:
    """Microseconds per queued one-step instance (W8) and per child (W7): the statements
    the design needs, each its own autocommit round trip (stored queued, claimed, the
    step, the end; a W7 child's insert shares one transaction with all the others)."""
    payload = '{"i":0,"s":"' + "x" * 32 + '"}'
    with _connect(url, synchronous) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        try:
            conn.execute(f'SET search_path TO "{schema}"')
            for table in QUEUE_TABLES:
                conn.execute(table)
            writes = [POSTGRESQL.spell(statement) for statement in QUEUE_WRITES]

            def run(prefix: str, children: bool) -> float:
                params = [{"id": f"{prefix}-{i}", "input": str(i), "payload": payload,
                           "output": str(i)} for i in range(rows)]
                start = time.perf_counter()
                per_instance = writes
                if children:
                    with conn.transaction(), conn.cursor() as cursor:
                        cursor.executemany(writes[0], params)
                    per_instance = writes[1:]
                for values in params:
                    for statement in per_instance:
                        conn.execute(statement, values)
                return (time.perf_counter() - start) / rows * 1e6

            run("warm", False)
            return {"queue_instance_us": run("w8", False), "queue_child_us": run("w7", True)}
        finally:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')
