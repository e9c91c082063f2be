"""The memable engine of a process, on the file ``settings.MEMABLE_DB`` names."""

from __future__ import annotations

import atexit
import threading

from django.conf import settings
from memable import Engine

from .workflows import WORKFLOWS

_lock = threading.Lock()
_engine: Engine | None = None


def open_engine() -> Engine:
    """An engine on ``settings.MEMABLE_DB`` with every workflow registered; not started."""
    engine = Engine.open(settings.MEMABLE_DB)
    for name, fn in WORKFLOWS.items():
        engine.register(name, fn)
    return engine


def get_engine() -> Engine:
    """The web process's engine, opened and started by the first request that needs it.

    Not at import time nor in ``AppConfig.ready()``: other management
    commands then open nothing, and a server that loads the app before it
    forks its workers (``gunicorn --preload``) starts the engine's threads
    in each worker, after the fork.
    """
    global _engine
    with _lock:
        if _engine is None:
            _engine = open_engine()
            _engine.start()
            # At exit: take no new work, let the runs in flight end, close the file.
            atexit.register(_engine.close)
        return _engine


def use_engine(engine: Engine | None) -> None:
    """Make ``engine`` the one ``get_engine`` returns (for tests); None forgets it."""
    global _engine
    with _lock:
        _engine = engine
