"""Checks of what callers pass in: step keys and durations. No I/O."""

from __future__ import annotations

import math
from datetime import timedelta

from ._errors import InvalidKey

#: The longest duration memable takes (what a ``timedelta`` holds).
MAX_SECONDS = timedelta.max.total_seconds()
#: The latest deadline memable stores: the end of the year 9999, in epoch seconds.
MAX_DEADLINE = 253402300799.0


def check_key(key: object, workflow: str, instance_id: str) -> str:
    """Return ``key`` if it is a usable step key, else raise InvalidKey.

    >>> check_key("charge:v1", "wf", "i-1")
    'charge:v1'
    """
    if not isinstance(key, str) or not key:
        raise InvalidKey(key, "keys are non-empty str", workflow=workflow, instance_id=instance_id)
    if key.startswith("_"):
        raise InvalidKey(key, "keys starting with '_' are reserved for the engine",
            workflow=workflow, instance_id=instance_id)
    return key


def seconds_of(duration: object, what: str = "duration") -> float:
    """A duration given as float seconds or a timedelta, in seconds.

    Raise ``TypeError`` for anything else (a ``str`` included) and ``ValueError`` for a negative,
    NaN or infinite one, naming ``what``.

    >>> seconds_of(timedelta(minutes=1), "lease")
    60.0
    >>> seconds_of("5", "lease")
    Traceback (most recent call last):
    ...
    TypeError: lease is float seconds or a timedelta, not str '5'
    """
    if isinstance(duration, timedelta):
        seconds = duration.total_seconds()
    elif isinstance(duration, (int, float)) and not isinstance(duration, bool):
        seconds = float(duration)
    else:
        raise TypeError(
            f"{what} is float seconds or a timedelta, not {type(duration).__name__} {duration!r}")
    if math.isnan(seconds) or seconds < 0:
        raise ValueError(f"{what} is >= 0 seconds, not {duration!r}")
    if seconds > MAX_SECONDS:
        raise ValueError(f"{what} of {duration!r} is longer than a timedelta holds")
    return seconds


def check_deadline(deadline: float, what: str, duration: object) -> float:
    """Return ``deadline`` (epoch seconds) unless it lies past the year 9999 (ValueError).

    >>> check_deadline(1e12, "timer duration", 1e12)
    Traceback (most recent call last):
    ...
    ValueError: timer duration 1000000000000.0 puts the deadline past the year 9999
    """
    if deadline > MAX_DEADLINE:
        raise ValueError(f"{what} {duration!r} puts the deadline past the year 9999")
    return deadline


def positive_seconds(duration: object, what: str) -> float:
    """``seconds_of``, and more than zero: one rule for 0 and for negatives.

    >>> positive_seconds(0, "step timeout")
    Traceback (most recent call last):
    ...
    ValueError: step timeout is > 0 seconds, not 0
    """
    if isinstance(duration, (int, float, timedelta)) and not isinstance(duration, bool):
        seconds = duration.total_seconds() if isinstance(duration, timedelta) else duration
        if seconds <= 0:
            raise ValueError(f"{what} is > 0 seconds, not {duration!r}")
    return seconds_of(duration, what)
