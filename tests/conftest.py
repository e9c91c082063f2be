"""Shared fixtures: the same tests run on an in-memory store and on a file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, settings

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


# Hypothesis profiles, registered at import time: the plugin loads the one named by
# --hypothesis-profile in pytest_configure, after this file is imported. "default"
# keeps tests/test_stateful.py well under a minute; "long" runs it for minutes.
_STATEFUL_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile(
    "default",
    max_examples=15,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=_STATEFUL_HEALTH,
    # No shrinking in the suite: a failure is reported as found, so a run that
    # fails still ends in minutes (each step may start real processes).
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.register_profile(
    "long",
    max_examples=400,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=_STATEFUL_HEALTH,
)
