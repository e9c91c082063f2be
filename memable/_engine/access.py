"""What memable's own modules read of an engine beyond its public API (not for users).

The only readers of its store and runner outside ``memable._engine.engine``.

>>> from memable import Engine
>>> from memable._engine import access
>>> engine = Engine.in_memory(poll_interval=30)
>>> engine.register("b", lambda ctx: None)
>>> engine.register("a", lambda ctx: None)
>>> access.started(engine), access.workflows(engine), access.poll_interval(engine)
(False, ['a', 'b'], 30.0)
>>> engine.close()
"""

from __future__ import annotations

from .._clock import Clock
from .._store.protocol import Store
from .engine import Engine


def store(engine: Engine) -> Store:
    """The store the engine runs on (a dashboard on the engine shares it).

    >>> from memable import Engine
    >>> from memable._engine import access
    >>> engine = Engine.in_memory()
    >>> access.store(engine).list_instances("wf")
    []
    >>> engine.close()
    """
    return engine._store


def clock(engine: Engine) -> Clock:
    """The clock the engine dates its writes and judges its deadlines by.

    >>> import time
    >>> from memable import Engine
    >>> from memable._engine import access
    >>> engine = Engine.in_memory()
    >>> abs(access.clock(engine).wall() - time.time()) < 60
    True
    >>> engine.close()
    """
    return engine._runner.clock


def started(engine: Engine) -> bool:
    """Whether the engine is started (and not yet stopped).

    >>> from memable import Engine
    >>> from memable._engine import access
    >>> engine = Engine.in_memory()
    >>> with engine:
    ...     print(access.started(engine))
    True
    >>> access.started(engine)
    False
    """
    return engine._runner.phase == "started"


def workflows(engine: Engine) -> list[str]:
    """The names of the engine's registered workflows, sorted.

    >>> from memable import Engine
    >>> from memable._engine import access
    >>> engine = Engine.in_memory()
    >>> engine.register("wf", lambda ctx: None)
    >>> access.workflows(engine)
    ['wf']
    >>> engine.close()
    """
    return sorted(engine._runner.workflows)


def schedules(engine: Engine) -> list[str]:
    """The names of the schedules the engine declares, sorted.

    >>> from memable import Engine
    >>> from memable._engine import access
    >>> engine = Engine.in_memory()
    >>> engine.register("report", lambda ctx: None)
    >>> engine.schedule("nightly", "0 2 * * *", "report")
    >>> access.schedules(engine)
    ['nightly']
    >>> engine.close()
    """
    return sorted(engine._schedules.declares())


def in_flight(engine: Engine) -> list[tuple[str, str, str | None, float | None]]:
    """(workflow, instance id, key, since) of each run in flight: its step executing and
    since when (epoch seconds), or None for both between steps or while claiming.

    >>> import threading
    >>> from memable import Engine
    >>> from memable._engine import access
    >>> inside, release = threading.Event(), threading.Event()
    >>> def held() -> bool:
    ...     inside.set()
    ...     return release.wait(10)
    >>> engine = Engine.in_memory()
    >>> engine.register("wf", lambda ctx: ctx.step("s").run(held))
    >>> with engine:
    ...     _ = engine.invoke("wf", instance_id="x")
    ...     _ = inside.wait(10)
    ...     print(access.in_flight(engine)[0][:3])
    ...     release.set()
    ('wf', 'x', 's')
    >>> access.in_flight(engine)
    []
    """
    return engine._runner.in_flight()


def poll_interval(engine: Engine) -> float:
    """Seconds between the engine's looks at the store for what others wrote.

    >>> from memable import Engine
    >>> from memable._engine import access
    >>> engine = Engine.in_memory(poll_interval=2)
    >>> access.poll_interval(engine)
    2.0
    >>> engine.close()
    """
    return engine._runner.poll_interval
