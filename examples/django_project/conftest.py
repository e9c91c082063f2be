"""Django setup for the example's tests; the memable plugin's ``memable_engine`` runs WORKFLOWS."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
from orders.workflows import WORKFLOWS  # noqa: E402


@pytest.fixture
def memable_workflows() -> dict[str, Callable[..., Any]]:
    """What the plugin's ``memable_engine`` fixture registers before it starts the engine."""
    return WORKFLOWS


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
