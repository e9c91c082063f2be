"""An engine started for a test, and the check that it leaked no thread when done.

Behind ``memable.testing.running`` and the pytest fixture; needs neither pytest nor freezegun."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from . import _clock
from ._engine.engine import Engine

#: Seconds teardown waits, in all, for threads of timed-out steps to end.
THREAD_TIMEOUT = 10.0
THREAD_TIMEOUT_INI = "memable_thread_timeout"


@contextmanager
def running(
    engine: Engine, workflows: Mapping[str, Callable[..., Any]] | None = None, *,
    thread_timeout: float = THREAD_TIMEOUT,
) -> Iterator[Engine]:
    """Register ``workflows`` on ``engine``, start it, and check it leaks nothing when done.

    On leaving the block normally: ``wait_all()``, ``close()``, then every ``memable...``
    thread started since entering must have ended (timed-out steps' get ``thread_timeout``
    seconds in all), or the test fails naming them; on an exception the engine is only closed.

    >>> import os, tempfile
    >>> from memable import Engine
    >>> from memable.testing import running
    >>> path = os.path.join(tempfile.mkdtemp(), "workflows.db")
    >>> with running(Engine.open(path), {"double": lambda ctx, n: 2 * n}) as engine:
    ...     engine.invoke("double", 21).result(timeout=10)
    42
    """
    before = memable_threads()
    try:
        for name, fn in (workflows or {}).items():
            engine.register(name, fn)
        engine.start()
        yield engine
        engine.wait_all()
    finally:
        engine.close()
    leaked = leaked_threads(before, thread_timeout)
    if leaked:
        _fail(leak_report(leaked, thread_timeout))


def _fail(report: str) -> None:
    """Fail with ``report``: ``pytest.fail`` (no traceback), else ``AssertionError``."""
    try:
        import pytest
    except ImportError:
        raise AssertionError(report) from None
    pytest.fail(report, pytrace=False)


def memable_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("memable")}


def leaked_threads(before: set[threading.Thread], timeout: float) -> list[threading.Thread]:
    """The memable threads started since ``before`` still alive; those of timed-out steps
    (abandoned daemons that end on their own) get ``timeout`` seconds in all to end."""
    deadline = _clock.monotonic() + timeout
    for thread in memable_threads() - before:
        if thread.name.startswith("memable-step"):
            thread.join(max(0.0, deadline - _clock.monotonic()))
    return sorted((t for t in memable_threads() - before if t.is_alive()), key=lambda t: t.name)


def leak_report(leaked: list[threading.Thread], timeout: float) -> str:
    lines = [f"{len(leaked)} memable thread(s) outlived the engine:"]
    for thread in leaked:
        if thread.name.startswith("memable-step"):
            why = (f"a timed-out step still running {timeout:g} s after the engine closed; "
                   "release what it waits on before the test ends")
        else:
            why = "a thread of an engine that was started and never closed"
        lines.append(f"  {thread.name!r}: {why}")
    return "\n".join(lines)
