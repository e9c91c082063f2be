"""Shared fixtures: the same tests run on an in-memory store and on a file."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memable import Engine


def _engine_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("memable")}


@pytest.fixture(params=["memory", "file"])
def make_engine(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., Engine]]:
    """Build engines on the parametrised store; close them and check no thread leaks.

    Every engine made on the file store shares ``tmp_path / "memable.db"``.
    """
    made: list[Engine] = []
    before = _engine_threads()

    def make(**options: object) -> Engine:
        if request.param == "memory":
            engine = Engine.in_memory(**options)  # type: ignore[arg-type]
        else:
            engine = Engine.open(tmp_path / "memable.db", **options)  # type: ignore[arg-type]
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()
    # Threads of timed-out steps are abandoned daemons by design; the tests
    # release what they hang on, so those threads end on their own.
    for thread in _engine_threads() - before:
        if thread.name.startswith("memable-step"):
            thread.join(timeout=10)
    assert _engine_threads() <= before, "an engine thread outlived close()"


@pytest.fixture
def engine(make_engine: Callable[..., Engine]) -> Engine:
    """A fresh, not yet started engine on the parametrised store."""
    return make_engine()
