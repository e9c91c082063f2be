"""The memable engine of a process, on the file ``settings.MEMABLE_DB`` names."""

from __future__ import annotations

import atexit
import threading

from django.conf import settings
from memable import Engine

from .workflows import configure

_lock = threading.Lock()
_engine: Engine | None = None


def open_engine(*, web: bool = False) -> Engine:
    """An engine on ``settings.MEMABLE_DB`` with the queue, workflows and schedule; not
    started.

    ``web``: a web process's engine, which consumes no queue (``queues=()``):
    it enqueues orders, signals them and reads them (and may fire a tick of
    the daily summary onto the queue); ``manage.py memable_worker`` processes
    run them.
    """
    engine = Engine.open(settings.MEMABLE_DB, queues=() if web else None)
    configure(engine)
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
            _engine = open_engine(web=True)
            _engine.start()
            # At exit: take no new work, let the runs in flight end, close the file.
            atexit.register(_engine.close)
        return _engine


def use_engine(engine: Engine | None) -> None:
    """Make ``engine`` the one ``get_engine`` returns (for tests); None forgets it."""
    global _engine
    with _lock:
        _engine = engine
