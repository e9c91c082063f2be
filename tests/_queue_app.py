"""An app for the queue tests' worker processes (``memable worker _queue_app:engine``).

The store comes from MEMABLE_QUEUE_DB (a file or a PostgreSQL URL) and
MEMABLE_QUEUE_SCHEMA; each execution of the step appends "PID INSTANCE" to
MEMABLE_QUEUE_LOG. Not a test module.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from _procs import log_line

from memable import Context, Engine

#: The limits every process declares, as the SPEC asks: the same everywhere.
LIMITS = {"concurrency": 3, "rate": (20, 1.0)}


def job(ctx: Context, n: int) -> int:
    """One step that takes a little while, logged with the pid that ran it."""
    log = os.environ["MEMABLE_QUEUE_LOG"]

    def work() -> int:
        threading.Event().wait(0.02)  # the work itself
        log_line(log, f"{os.getpid()} {ctx.instance_id}")
        return n

    return int(ctx.step("work").run(work))


def make(opener: Callable[..., Engine] = Engine.open, **options: object) -> Engine:
    """An engine on the store the environment names, with the queue and the workflow;
    ``opener`` opens it (as ``Engine.open`` does: the test's ``helpers.build`` keeps its
    store)."""
    schema = os.environ.get("MEMABLE_QUEUE_SCHEMA") or None
    engine = opener(os.environ["MEMABLE_QUEUE_DB"], schema=schema, **options)
    engine.queue("jobs", **LIMITS)  # type: ignore[arg-type]
    engine.register("job", job, queue="jobs")
    return engine


def engine() -> Engine:
    """What ``memable worker _queue_app:engine`` loads (called: a fresh engine)."""
    return make(poll_interval=0.05)
