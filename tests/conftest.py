"""Shared fixtures: the same tests run on an in-memory store, a file and PostgreSQL."""

from __future__ import annotations

import faulthandler
import fcntl
import os
import re
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import build
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


#: A test (setup, call and teardown) still running after this many seconds is taken for
#: hung: its process writes every thread's stack to a file of ``HANG_DIR`` and exits, so
#: that the run fails, naming the test (pytest -n reports its worker crashed), where it
#: would otherwise wait until CI's own limit and print nothing. The slowest test takes
#: about a minute and a half on 2 cores; a heavy one may first wait for others to end.
HANG_AFTER = float(os.environ.get("MEMABLE_TEST_HANG_AFTER", "600"))

#: Where the stacks of a hung test go (.ci/run prints the files when the run ends).
HANG_DIR = Path(os.environ.get("MEMABLE_TEST_HANG_DIR", tempfile.gettempdir()))
HANG_DIR.mkdir(parents=True, exist_ok=True)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Arm the hang watchdog (``HANG_AFTER``) around each test. The stacks go to a file,
    not to stderr: pytest captures the test's stderr, and an exiting process loses it."""
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", item.nodeid)[-150:]
    path = HANG_DIR / f"memable-hang-{os.getpid()}-{name}.txt"
    with open(path, "w") as stacks:
        stacks.write(f"{item.nodeid} still running after {HANG_AFTER:.0f} s:\n")
        stacks.flush()
        faulthandler.dump_traceback_later(HANG_AFTER, exit=True, file=stacks)
        try:
            yield
        finally:
            faulthandler.cancel_dump_traceback_later()
    path.unlink()


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
        engine = build(**store_target, **options).engine  # its store: helpers.store_of
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
        made.append(build(**shared_store, **options).engine)  # its store: helpers.store_of
        return made[-1]

    yield make
    for engine in made:
        engine.close()


@pytest.fixture
def engine(make_engine: Callable[..., Engine]) -> Engine:
    """A fresh, not yet started engine on the parametrised store."""
    return make_engine()


# Hypothesis profiles, registered at import time: the plugin loads the one named by
# --hypothesis-profile in pytest_configure, after this file is imported. Hypothesis
# loads its built-in "ci" profile instead of "default" when the environment has CI set,
# as .ci/run does; that profile's 100 examples of 50 steps took tests/test_stateful.py
# 180-500 s on this VM's 2 cores (`CI=true pytest tests/test_stateful.py
# --hypothesis-show-statistics`), the longest test of each env. So both profiles run the
# suite's budget: 25 examples of 30 steps, about 40 s. "ci" keeps Hypothesis's choices
# for CI (the same examples every run, no database, the failing example printed);
# "long" runs it for an hour or more.
_STATEFUL_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large]
_SUITE = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=_STATEFUL_HEALTH,
    # No shrinking in the suite: a failure is reported as found, so a run that
    # fails still ends in minutes (each step may start real processes).
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)
settings.register_profile("default", _SUITE)
settings.register_profile("ci", _SUITE, derandomize=True, database=None, print_blob=True)
settings.register_profile(
    "long",
    max_examples=400,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=_STATEFUL_HEALTH,
)


#: The tests that take longest (real-time waits, processes, servers), by node id or a
#: prefix of it, longest first: measured with ``pytest -n 4 -m "not browser"
#: --durations=40`` on 2 cores. ``pytest_collection_modifyitems`` puts them at the front
#: of the collection, so that under ``pytest -n`` they start first, each on a worker of
#: its own, instead of forming the run's tail. Order only: each still runs as it would.
SLOWEST_FIRST = (
    "tests/test_schedule_processes.py::test_ticks_missed_while_the_engine_is_stopped",
    "tests/test_stateful.py",
    "tests/test_schedule_processes.py::test_three_engines_run_each_tick_once",
    "tests/test_benchmarks.py::test_quick_benchmark_checks_its_results_and_exits_zero",
    "tests/test_postgres_faults.py::test_four_processes_on_one_database_and_a_kill",
    "tests/test_postgres.py::test_twenty_processes_opening_a_new_schema_at_once",
    "tests/test_processes.py::test_sigkill_inside_a_step_loses_no_completed_step",
    "tests/test_processes.py::test_processes_creating_one_new_file_at_once_all_open_it",
    "tests/test_queue_processes.py::test_four_processes_never_pass_the_queues_limits",
    "tests/test_howto.py::test_every_command_of_the_inspect_page_runs_on_a_demo_store",
    "tests/test_postgres_faults.py::test_connections_killed_by_the_server_mid_workload",
    "tests/test_cancel_queue_slot.py",
    "tests/test_queue_pause.py::test_a_worker_process_starts_nothing_of_a_paused_queue",
    "tests/test_worker.py::test_sigterm_with_the_server_unreachable_exits_within_the_lease",
    "tests/test_cancel_purge.py::test_purge_of_more_than_a_batch_takes_them_all_in_one_call",
    "tests/test_queues.py::test_a_queue_nobody_consumes_is_named_once",
    "tests/test_postgres_durability.py",
    "tests/test_postgres_faults.py",
    "tests/test_per_key_concurrency.py::test_worker_processes_never_run_two_of_one_key",
    "tests/test_schedules.py::test_the_timer_thread_fires_a_tick_on_its_own",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Move the tests of ``SLOWEST_FIRST`` to the front, in its order (the rest keep
    theirs)."""

    def rank(item: pytest.Item) -> int:
        for at, prefix in enumerate(SLOWEST_FIRST):
            if item.nodeid.startswith(prefix):
                return at
        return len(SLOWEST_FIRST)

    items.sort(key=rank)  # stable


def pytest_configure(config: pytest.Config) -> None:
    """Under ``pytest -n`` (xdist's default ``--dist load``), hand each worker one test
    at a time (``--maxschedchunk 1``) unless told otherwise: by default a worker takes
    about a sixteenth of the collection at once, so the slowest tests, first in it,
    would queue behind one another on one worker."""
    if getattr(config.option, "maxschedchunk", False) is None:
        config.option.maxschedchunk = 1
