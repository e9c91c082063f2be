"""A child engine process that declares a schedule, for tests/test_schedule_processes.py.

    _schedule_procs.py TARGET SCHEMA LOG T0 SPEED CATCH_UP

TARGET is a SQLite file or a PostgreSQL URL (SCHEMA its schema; "-" for a
file). The engine's wall clock runs SPEED times faster than real time from the
real instant T0 (so a tick a minute comes every 60 / SPEED real seconds); its
timer thread looks every 20 ms. It declares the schedule "every" ("* * * * *",
CATCH_UP) of the workflow "job", whose one step appends "INSTANCE PID" to LOG.
It prints "started" once running, and stops (draining its runs) when a line
arrives on stdin, then prints "stopped".
"""

from __future__ import annotations

import os
import sys
import time
from datetime import datetime

from _procs import log_line  # the one O_APPEND writer of the helpers

from memable import Context, Engine
from memable._clock import Clock
from memable._postgres.store import PostgresStore
from memable._run.options import Options
from memable._sqlite.store import SQLiteStore
from memable._store.protocol import Store


def main(target: str, schema: str, log: str, t0: str, speed: str, catch_up: str) -> None:
    start, fast = float(t0), float(speed)

    def wall() -> float:
        return start + (time.time() - start) * fast

    store: Store = (SQLiteStore(target, "full") if schema == "-"
                    else PostgresStore(target, "full", schema=schema))
    # The lease is in the fast clock's seconds: 10 real seconds at 60x.
    engine = Engine(store, Options(poll_interval=0.02, lease=600.0, clock=Clock(wall=wall)))

    def job(ctx: Context, tick: datetime) -> None:
        ctx.step("log").run(lambda: log_line(log, f"{ctx.instance_id} {os.getpid()}"))

    engine.register("job", job)
    engine.schedule("every", "* * * * *", "job", catch_up=catch_up)  # type: ignore[arg-type]
    with engine:
        print("started", flush=True)
        sys.stdin.readline()
    print("stopped", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
