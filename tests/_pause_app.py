"""An app for the pause tests' worker process (``memable worker _pause_app:engine``).

Two queues, declared in this order: ``jobs`` (the one the test pauses; one at a
time, so its runs start in the queue's order) and ``probe`` (never paused). An
engine's queue thread looks at its queues in the order they were declared, so a
probe that completes was claimed by a look that found ``jobs`` first. The store
comes from MEMABLE_PAUSE_DB (a file or a PostgreSQL URL) and MEMABLE_PAUSE_SCHEMA;
each execution of a job appends "PID INSTANCE" to MEMABLE_PAUSE_LOG. Not a test
module.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from _procs import log_line

from memable import Context, Engine


def job(ctx: Context, n: int) -> int:
    """One step, logged with the pid that ran it."""

    def work() -> int:
        log_line(os.environ["MEMABLE_PAUSE_LOG"], f"{os.getpid()} {ctx.instance_id}")
        return n

    return int(ctx.step("work").run(work))


def probe(ctx: Context) -> int:
    """Nothing but the pid that ran it."""
    return os.getpid()


def make(opener: Callable[..., Engine] = Engine.open, **options: object) -> Engine:
    """An engine on the store the environment names, with both queues and workflows;
    ``opener`` opens it (as ``Engine.open`` does: the test's ``helpers.build`` keeps its
    store)."""
    schema = os.environ.get("MEMABLE_PAUSE_SCHEMA") or None
    engine = opener(os.environ["MEMABLE_PAUSE_DB"], schema=schema, **options)
    engine.queue("jobs", concurrency=1)
    engine.queue("probe")
    engine.register("job", job, queue="jobs")
    engine.register("probe", probe, queue="probe")
    return engine


def engine() -> Engine:
    """What ``memable worker _pause_app:engine`` loads (called: a fresh engine)."""
    return make(poll_interval=0.05)
