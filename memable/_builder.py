"""Engine options and the builder that collects them."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from ._retry import Retry
from ._schema import Synchronous
from ._sqlite import SQLiteStore

if TYPE_CHECKING:
    from ._engine import Engine


@attrs.frozen
class _Options:
    max_workers: int = 8
    synchronous: Synchronous = "full"
    poll_interval: float = 1.0
    lease: float = 15.0
    recover: bool = True
    retry: Retry | None = None
    # Retry backoff sleeps through this, so that tests need not wait for real time.
    sleep: Callable[[float], None] = time.sleep

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.max_workers, int) or self.max_workers < 1:
            raise ValueError(f"max_workers must be a positive int, not {self.max_workers!r}")
        if self.synchronous not in ("full", "normal"):
            raise ValueError(f"synchronous must be 'full' or 'normal', not {self.synchronous!r}")
        if not self.poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0, not {self.poll_interval!r}")
        if not self.lease > 0:
            raise ValueError(f"lease must be > 0, not {self.lease!r}")
        if self.retry is not None and not isinstance(self.retry, Retry):
            raise ValueError(f"retry must be a Retry or None, not {self.retry!r}")


@attrs.frozen
class EngineBuilder:
    """Configures an ``Engine``; each method returns a new builder.

    >>> from memable import Engine
    >>> engine = Engine.builder().in_memory().max_workers(4).build()
    >>> engine.close()
    """

    _path: str | os.PathLike[str] | None = None
    _memory: bool = False
    _options: _Options = _Options()

    def in_memory(self) -> EngineBuilder:
        """Use an in-memory store (nothing survives the process).

        >>> from memable import Engine
        >>> Engine.builder().in_memory().build().close()
        """
        return attrs.evolve(self, path=None, memory=True)

    def open(self, path: str | os.PathLike[str]) -> EngineBuilder:
        """Use the SQLite file at ``path`` (created if missing, opened at ``build()``).

        >>> import os, tempfile
        >>> from memable import Engine
        >>> path = os.path.join(tempfile.mkdtemp(), "workflows.db")
        >>> Engine.builder().open(path).build().close()
        """
        return attrs.evolve(self, path=path, memory=False)

    def max_workers(self, n: int) -> EngineBuilder:
        """Run workflows on ``n`` worker threads (default 8).

        >>> from memable import Engine
        >>> Engine.builder().in_memory().max_workers(2).build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, max_workers=n))

    def synchronous(self, mode: Synchronous) -> EngineBuilder:
        """Set SQLite ``synchronous``: ``"full"`` (default) or the faster ``"normal"``.

        ``"full"`` loses nothing acknowledged even on power loss.

        ``"normal"`` may lose the last commits on power loss or an OS crash,
        never on a process crash.

        >>> from memable import Engine
        >>> Engine.builder().in_memory().synchronous("normal").build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, synchronous=mode))

    def poll_interval(self, seconds: float) -> EngineBuilder:
        """Seconds between looks at the store for what other processes wrote (default 1).

        ``Invocation.result()`` re-reads the store this often while it waits.

        >>> from memable import Engine
        >>> Engine.builder().in_memory().poll_interval(0.5).build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, poll_interval=seconds))

    def lease(self, seconds: float) -> EngineBuilder:
        """Seconds this engine counts as alive after a heartbeat (default 15; beats every third).

        Another engine takes over the instances of one whose lease ran out.

        >>> from memable import Engine
        >>> Engine.builder().in_memory().lease(30).build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, lease=seconds))

    def recover(self, enabled: bool) -> EngineBuilder:
        """Resume, at start and at each poll, instances whose engine died (default True).

        >>> from memable import Engine
        >>> Engine.builder().in_memory().recover(False).build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, recover=enabled))

    def retry(self, policy: Retry | None) -> EngineBuilder:
        """The ``Retry`` of every step that sets none (default None: the first error fails).

        >>> from memable import Engine, Retry
        >>> Engine.builder().in_memory().retry(Retry(max_attempts=5)).build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, retry=policy))

    def sleep(self, sleep: Callable[[float], None]) -> EngineBuilder:
        """What retry backoff sleeps with (default ``time.sleep``); tests pass a fake.

        >>> from memable import Engine
        >>> slept = []
        >>> Engine.builder().in_memory().sleep(slept.append).build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, sleep=sleep))

    def build(self) -> Engine:
        """Open the store and build the engine; raise ``StorageError`` if it cannot open.

        >>> from memable import Engine
        >>> Engine.builder().build()
        Traceback (most recent call last):
        ...
        ValueError: Engine.builder() needs .in_memory() or .open(path) before .build()
        """
        if self._path is None and not self._memory:
            raise ValueError("Engine.builder() needs .in_memory() or .open(path) before .build()")
        from ._engine import Engine  # the engine module imports this one

        return Engine(SQLiteStore(self._path, self._options.synchronous), self._options)
