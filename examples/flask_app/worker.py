"""The worker process of the Flask example: ``memable worker worker:engine``.

It opens the same store as the app (``MEMABLE_DB``, default ``memable.db``),
declares the same queue and schedule and consumes the queue: the orders the
web process queued run here, and so do the daily summary's ticks, whichever
process fired them.
"""

from __future__ import annotations

import os

from memable import Engine

from workflows import configure


def engine() -> Engine:
    """The worker's engine (``memable worker`` calls this to get a fresh one)."""
    opened = Engine.open(os.environ.get("MEMABLE_DB", "memable.db"))
    configure(opened)
    return opened
