"""Engines made before ``os.fork()``: unusable in the child, with an error that says why.

A forked child shares its parent's store connection, owner id and (dead) threads: every
engine's ``ForkGuard`` notes the fork and refuses every call there.

>>> guard = ForkGuard()
>>> guard.check()
>>> guard.forked = True
>>> guard.check()
Traceback (most recent call last):
...
memable._errors.EngineError: this engine was made before os.fork() and cannot be used in ...
"""

from __future__ import annotations

import os
import weakref

from .._errors import EngineError

#: What a forked child is told, and what to do instead.
FORKED = (
    "this engine was made before os.fork() and cannot be used in the child process; make the "
    "engine in each child after the fork: under gunicorn, in a post_fork hook or on first use in "
    "the worker, or run gunicorn without --preload (see 'Web apps and forking servers' in the "
    "memable docs)")

# Guards of this process, so that a forked child can mark them.
_guards: weakref.WeakSet[ForkGuard] = weakref.WeakSet()


class ForkGuard:
    """Whether this process is a child forked after the guard was made."""

    def __init__(self) -> None:
        self.forked = False  # set in a forked child, before any of its code runs
        _guards.add(self)

    def check(self) -> None:
        """Raise ``EngineError`` in a child forked after this guard was made."""
        if self.forked:
            raise EngineError(FORKED)


def _forked() -> None:
    for guard in list(_guards):
        guard.forked = True


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forked)
