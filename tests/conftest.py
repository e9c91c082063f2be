"""Shared fixtures: the same tests run on an in-memory store and on a file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from memable import Engine
from memable.testing import _leak_report, _leaked_threads, _memable_threads

pytest_plugins = ["pytester"]


@pytest.fixture(params=["memory", "file"])
def make_engine(
    request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., Engine]]:
    """Build engines on the parametrised store; close them and check no thread leaks.

    Every engine made on the file store shares ``tmp_path / "memable.db"``.
    """
    made: list[Engine] = []
    before = _memable_threads()

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
    # The plugin's check: threads of timed-out steps get 10 s to end on their own.
    leaked = _leaked_threads(before, timeout=10)
    assert not leaked, _leak_report(leaked, 10)


@pytest.fixture
def engine(make_engine: Callable[..., Engine]) -> Engine:
    """A fresh, not yet started engine on the parametrised store."""
    return make_engine()
