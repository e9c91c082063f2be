"""Engine options, validated once when an engine is configured. No I/O."""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import timedelta

import attrs

from .._clock import SYSTEM_CLOCK, Clock
from .._queues import check_consumed
from .._retry import Retry
from .._store.protocol import Synchronous
from .._validate import positive_seconds


def _poll_interval(value: float | timedelta) -> float:
    return positive_seconds(value, "poll_interval")


def _lease(value: float | timedelta) -> float:
    return positive_seconds(value, "lease")


def _retention(value: float | timedelta | None) -> float | None:
    return None if value is None else positive_seconds(value, "retention")


@attrs.frozen
class Options:
    """What an engine is configured with; durations held as float seconds."""

    max_workers: int = 8
    synchronous: Synchronous = "full"
    poll_interval: float = attrs.field(default=1.0, converter=_poll_interval)
    lease: float = attrs.field(default=15.0, converter=_lease)
    recover: bool = True
    retry: Retry | None = None
    # Retry backoffs wait through this when given (tests pass a fake); None waits on the run's
    # interrupt event, so cancel and stop end it at once.
    sleep: Callable[[float], None] | None = None
    # Where deadlines, leases and waits read the time.
    clock: Clock = SYSTEM_CLOCK
    # The declared queues this engine consumes: None all, () none (enqueue only).
    queues: tuple[str, ...] | None = attrs.field(default=None, converter=check_consumed)
    # How long finished instances are kept before the retention thread purges them (None: ever).
    retention: float | None = attrs.field(default=None, converter=_retention)

    def __attrs_post_init__(self) -> None:
        if (isinstance(self.max_workers, bool) or not isinstance(self.max_workers, int)
                or self.max_workers < 1):
            raise ValueError(f"max_workers must be a positive int, not {self.max_workers!r}")
        if self.synchronous not in ("full", "normal"):
            raise ValueError(f"synchronous must be 'full' or 'normal', not {self.synchronous!r}")
        if not isinstance(self.recover, bool):
            raise TypeError(f"recover must be a bool, not {self.recover!r}")
        if self.retry is not None and not isinstance(self.retry, Retry):
            raise TypeError(f"retry must be a Retry or None, not {self.retry!r}")
        if self.sleep is not None and not callable(self.sleep):
            raise TypeError(f"sleep must be callable, not {self.sleep!r}")


#: What ``time.sleep`` was when memable was imported, for callers that pass it.
REAL_SLEEP = time.sleep
