"""Helpers shared by several test modules (not a test module itself)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path

from memable import Engine

PROCS = str(Path(__file__).with_name("_procs.py"))

#: A fixed instant for tests that freeze the clock.
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def dump(engine: Engine) -> list[str]:
    """Every row of the store, as SQL text (private connection on purpose: a full snapshot)."""
    with engine._store._lock:  # type: ignore[attr-defined]
        return list(engine._store._conn.iterdump())  # type: ignore[attr-defined]


@contextmanager
def killed_in_a_step(db: Path, log: Path, step: int = 3) -> Iterator[int]:
    """A child engine runs ten/crash (``_procs.py crash``) into step ``s<step>``.

    Yields the child's pid while it hangs there; on leaving, SIGKILLs it and
    reaps it, so its instance is left running with a dead owner.
    """
    child = subprocess.Popen(
        [sys.executable, PROCS, "crash", str(db), str(log), str(step)],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == f"in step {step}\n"
        yield child.pid
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=60)
        if child.stdout is not None:
            child.stdout.close()
