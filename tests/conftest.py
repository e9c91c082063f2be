"""Shared fixtures: the same tests run on an in-memory store, a file and PostgreSQL."""

from __future__ import annotations

import fcntl
import os
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, settings

from memable import Engine
from memable._running import leak_report, leaked_threads, memable_threads

pytest_plugins = ["pytester"]


#: The PostgreSQL server the tests use (each test in a schema of its own).
POSTGRES_URL = os.environ.get(
    "MEMABLE_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)


#: Held (exclusively) by each test marked ``heavy`` while it runs, across every pytest
#: process on the machine: the workers of one run (pytest -n) and parallel tox envs.
HEAVY_LOCK = os.path.join(tempfile.gettempdir(), "memable-tests-heavy.lock")


@pytest.fixture(autouse=True)
def _one_heavy_test_at_a_time(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test marked ``heavy`` waits for any other heavy test to end: two at once could
    take more connections than the server allows (max_connections, 100 by default)."""
    if request.node.get_closest_marker("heavy") is None:
        yield
        return
    with open(HEAVY_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def postgres_or_skip() -> None:
    """Skip the test, saying why, when no server answers; under CI (CI=true) fail instead."""
    try:
        import psycopg

        psycopg.connect(POSTGRES_URL, connect_timeout=5).close()
    except Exception as exc:  # ImportError, or psycopg.OperationalError
        why = f"no PostgreSQL server for the tests at {POSTGRES_URL} ({exc})"
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"{why}; under CI the PostgreSQL cases must run")
        pytest.skip(why)


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh schema name on the test server, dropped (with its tables) afterwards."""
    postgres_or_skip()
    import psycopg

    name = f"test_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(POSTGRES_URL, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture(params=["memory", "file", "postgres"])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """How ``Engine.open`` reaches the parametrised store: ``{"target": ..., "schema": ...}``;
    None for the in-memory store."""
    if request.param == "memory":
        yield {}
    elif request.param == "file":
        yield {"target": tmp_path / "memable.db"}
    else:
        schema = request.getfixturevalue("pg_schema")
        yield {"target": POSTGRES_URL, "schema": schema}


@pytest.fixture
def make_engine(store_target: dict[str, Any]) -> Iterator[Callable[..., Engine]]:
    """Build engines on the parametrised store; close them and check no thread leaks.

    Every engine made in one test shares its store (``tmp_path / "memable.db"``,
    or one PostgreSQL schema).
    """
    made: list[Engine] = []
    before = memable_threads()

    def make(**options: object) -> Engine:
        if not store_target:
            engine = Engine.in_memory(**options)  # type: ignore[arg-type]
        else:
            engine = Engine.open(**store_target, **options)  # type: ignore[arg-type]
        made.append(engine)
        return engine

    yield make
    for engine in made:
        engine.close()
    # The plugin's check: threads of timed-out steps get 10 s to end on their own.
    leaked = leaked_threads(before, timeout=10)
    assert not leaked, leak_report(leaked, 10)


@pytest.fixture(params=["file", "postgres"])
def shared_store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """A store several engines and processes can share: ``{"target": ...}`` of a file, or
    ``{"target": URL, "schema": ...}`` of a PostgreSQL schema of its own."""
    if request.param == "file":
        return {"target": tmp_path / "db"}
    return {"target": POSTGRES_URL, "schema": request.getfixturevalue("pg_schema")}


@pytest.fixture
def open_shared(shared_store: dict[str, Any]) -> Iterator[Callable[..., Engine]]:
    """Open engines on ``shared_store``; closed afterwards."""
    made: list[Engine] = []

    def make(**options: Any) -> Engine:
        made.append(Engine.open(**shared_store, **options))
        return made[-1]

    yield make
    for engine in made:
        engine.close()


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
