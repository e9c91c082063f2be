"""Django setup for the example's tests; the memable plugin's ``memable_engine``, set up
as the worker is, runs what the views enqueue."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import django
import pytest
from django.test import Client
from django.test.utils import setup_test_environment
from memable import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ["DJANGO_SETTINGS_MODULE"] = "shop.settings"
django.setup()
setup_test_environment()  # what Django's test runner does: allows the host "testserver"

from orders.engine import use_engine  # noqa: E402
from orders.workflows import configure  # noqa: E402


@pytest.fixture
def memable_configure() -> Callable[[Engine], None]:
    """How the plugin's ``memable_engine`` is set up: the app's queue and workflows (it
    consumes the queue, as the worker does)."""
    return configure


@pytest.fixture
def engine(memable_engine: Engine) -> Engine:
    """The plugin's engine, under the shorter name these tests use."""
    return memable_engine


@pytest.fixture
def client(engine: Engine) -> Iterator[Client]:
    """Django's test client, with the views on the plugin's in-memory engine."""
    use_engine(engine)
    yield Client()
    use_engine(None)
