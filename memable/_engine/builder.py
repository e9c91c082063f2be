"""The builder that collects an engine's options and opens its store."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Generic, NoReturn, TypeVar

import attrs

from .._queues import check_consumed
from .._retry import Retry
from .._run.options import Options
from .._store.protocol import Store, Synchronous
from .targets import check_target, open_store

#: What ``build()`` makes: an ``Engine`` (generic, not importing the engine, which imports this).
E = TypeVar("E")

_DEFAULT_OPTIONS = Options()


def _no_factory(store: Store, options: Options) -> NoReturn:
    raise TypeError("build engines with Engine.builder(), which knows how to make one")


@attrs.frozen
class EngineBuilder(Generic[E]):
    """Configures an ``Engine``; each method returns a new builder.

    >>> from memable import Engine
    >>> engine = Engine.builder().in_memory().max_workers(4).build()
    >>> engine.close()
    """

    _path: str | os.PathLike[str] | None = None
    _memory: bool = False
    _schema: str | None = None
    _options: Options = _DEFAULT_OPTIONS
    # What makes the engine from the store and options: Engine itself (see E).
    _factory: Callable[[Store, Options], E] = attrs.field(default=_no_factory, repr=False)

    def in_memory(self) -> EngineBuilder[E]:
        """Use an in-memory store (nothing survives the process).

        >>> from memable import Engine
        >>> Engine.builder().in_memory().build().close()
        """
        return attrs.evolve(self, path=None, memory=True)

    def open(self, target: str | os.PathLike[str]) -> EngineBuilder[E]:
        """Use the SQLite file at ``target`` (created if missing), or the PostgreSQL
        database a ``postgresql://`` URL names; opened at ``build()``.

        >>> import os, tempfile
        >>> from memable import Engine
        >>> path = os.path.join(tempfile.mkdtemp(), "workflows.db")
        >>> Engine.builder().open(path).build().close()
        """
        if not isinstance(target, (str, os.PathLike)):
            raise TypeError(f"a store is a path or a postgresql:// URL, not {target!r}")
        return attrs.evolve(self, path=target, memory=False)

    def schema(self, name: str) -> EngineBuilder[E]:
        """The PostgreSQL schema that holds the store's tables (default ``"memable"``).

        >>> from memable import Engine
        >>> Engine.builder().open("jobs.db").schema("jobs").build()
        Traceback (most recent call last):
        ...
        ValueError: schema is for a PostgreSQL URL; 'jobs.db' is a SQLite file
        """
        return attrs.evolve(self, schema=name)

    def max_workers(self, n: int) -> EngineBuilder[E]:
        """Run workflows on ``n`` worker threads (default 8).

        >>> from memable import Engine
        >>> Engine.builder().in_memory().max_workers(2).build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, max_workers=n))

    def synchronous(self, mode: Synchronous) -> EngineBuilder[E]:
        """Set SQLite ``synchronous``: ``"full"`` (default) or the faster ``"normal"``.

        >>> from memable import Engine
        >>> Engine.builder().in_memory().synchronous("normal").build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, synchronous=mode))

    def poll_interval(self, seconds: float | timedelta) -> EngineBuilder[E]:
        """Seconds between looks at the store for what other processes wrote (default 1).

        >>> from memable import Engine
        >>> Engine.builder().in_memory().poll_interval(0.5).build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, poll_interval=seconds))

    def lease(self, seconds: float | timedelta) -> EngineBuilder[E]:
        """Seconds this engine counts as alive after a heartbeat (default 15; beats every third).

        >>> from memable import Engine
        >>> Engine.builder().in_memory().lease(30).build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, lease=seconds))

    def recover(self, enabled: bool) -> EngineBuilder[E]:
        """Resume, at start and at each poll, instances whose engine died (default True).

        >>> from memable import Engine
        >>> Engine.builder().in_memory().recover(False).build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, recover=enabled))

    def retry(self, policy: Retry | None) -> EngineBuilder[E]:
        """The ``Retry`` of every step that sets none (default None: the first error fails).

        >>> from memable import Engine, Retry
        >>> Engine.builder().in_memory().retry(Retry(max_attempts=5)).build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, retry=policy))

    def sleep(self, sleep: Callable[[float], None] | None) -> EngineBuilder[E]:
        """What every retry backoff sleeps with, on the worker; tests pass a fake.

        By default (None) a backoff under a second waits on the worker (a cancel or ``stop()``
        interrupts it); a longer one is a durable timer (``Suspended("retry <key>")``).

        >>> from memable import Engine
        >>> slept = []
        >>> Engine.builder().in_memory().sleep(slept.append).build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, sleep=sleep))

    def queues(self, names: Iterable[str] | None) -> EngineBuilder[E]:
        """The declared queues the engine consumes: None all (default), ``()`` none.

        >>> from memable import Engine
        >>> Engine.builder().in_memory().queues(()).build().close()
        """
        consumed = check_consumed(names)
        return attrs.evolve(self, options=attrs.evolve(self._options, queues=consumed))

    def retention(self, keep: float | timedelta | None) -> EngineBuilder[E]:
        """Keep finished instances this long, then purge them (default None: for ever).

        >>> from datetime import timedelta
        >>> from memable import Engine
        >>> Engine.builder().in_memory().retention(timedelta(days=30)).build().close()
        """
        return attrs.evolve(self, options=attrs.evolve(self._options, retention=keep))

    def build(self) -> E:
        """Open the store and build the engine; raise ``StorageError`` if it cannot open.

        >>> from memable import Engine
        >>> Engine.builder().build()
        Traceback (most recent call last):
        ...
        ValueError: Engine.builder() needs .in_memory() or .open(path) before .build()
        """
        if self._path is None and not self._memory:
            raise ValueError("Engine.builder() needs .in_memory() or .open(path) before .build()")
        if self._path is not None:
            check_target(self._path, self._schema)
        elif self._schema is not None:
            raise ValueError("schema is for a PostgreSQL URL, not an in-memory store")
        store = open_store(self._path, self._options.synchronous, schema=self._schema,
            pool_size=self._options.max_workers + 3)
        return self._factory(store, self._options)
