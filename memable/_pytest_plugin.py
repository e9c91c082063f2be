"""The fixtures of memable's pytest plugin and its ini option, which ``memable.testing`` (the
``pytest11`` entry point) imports only when pytest is installed."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from ._engine.engine import Engine
from ._running import THREAD_TIMEOUT, THREAD_TIMEOUT_INI, running


def pytest_addoption(parser: pytest.Parser) -> None:
    """Declare the ini option ``memable_thread_timeout``."""
    parser.addini(THREAD_TIMEOUT_INI,
        help="seconds the memable engine fixture waits at teardown for the threads of "
        f"timed-out steps to end before it reports them as leaked (default {THREAD_TIMEOUT:g})",
        default=str(THREAD_TIMEOUT))


@pytest.fixture
def memable_workflows() -> Mapping[str, Callable[..., Any]]:
    """The workflows the ``memable_engine`` fixture registers, by name: none unless overridden
    (in a ``conftest.py``, a module or a class) to return ``{"ship": ship, ...}``."""
    return {}


@pytest.fixture
def memable_configure() -> Callable[[Engine], None] | None:
    """A function that sets up the ``memable_engine`` before it starts: none unless overridden.

    Override it to return your app's ``configure(engine)``; it runs before ``memable_workflows``
    are registered."""
    return None


@pytest.fixture
def memable_options() -> dict[str, Any]:
    """Keyword options of ``Engine.in_memory`` for ``memable_engine``: none unless overridden
    (e.g. ``{"poll_interval": 60, "max_workers": 2}``)."""
    return {}


@pytest.fixture
def memable_engine(
    request: pytest.FixtureRequest, memable_workflows: Mapping[str, Callable[..., Any]],
    memable_options: dict[str, Any], memable_configure: Callable[[Engine], None] | None,
) -> Iterator[Engine]:
    """A started in-memory ``Engine`` with ``memable_workflows``, built with ``memable_options``
    and set up by ``memable_configure``.

    At teardown the engine is drained (``wait_all``) and closed. Then every ``memable`` thread
    started during the test must have ended: timed-out steps' threads get
    ``memable_thread_timeout`` seconds (ini option, default 10); one still alive fails the
    test, by name."""
    timeout = _thread_timeout(request.config)
    engine = Engine.in_memory(**memable_options)
    if memable_configure is not None:
        try:
            memable_configure(engine)
        except BaseException:
            engine.close()
            raise
    with running(engine, memable_workflows, thread_timeout=timeout) as started:
        yield started


@pytest.fixture
def engine(memable_engine: Engine) -> Engine:
    """Deprecated old name of ``memable_engine`` (one release); a project's ``engine`` wins."""
    warnings.warn(
        "the memable fixture 'engine' is now 'memable_engine'; the old name goes in the "
        "next release", DeprecationWarning, stacklevel=2)
    return memable_engine


def _thread_timeout(config: pytest.Config) -> float:
    text = str(config.getini(THREAD_TIMEOUT_INI))
    try:
        seconds = float(text)
    except ValueError:
        raise pytest.UsageError(
            f"{THREAD_TIMEOUT_INI} must be a number of seconds, not {text!r}") from None
    if not seconds >= 0:
        raise pytest.UsageError(f"{THREAD_TIMEOUT_INI} must not be negative, not {text!r}")
    return seconds
