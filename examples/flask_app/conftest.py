"""Fixtures of the Flask example: the plugin's ``memable_engine``, set up as the app's
worker is (its queue, its workflows), consumes the queue the views enqueue on."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from flask.testing import FlaskClient
from memable import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent))

from app import create_app
from workflows import configure


@pytest.fixture
def memable_configure() -> Callable[[Engine], None]:
    """How the plugin's ``memable_engine`` is set up: the app's queue and workflows."""
    return configure


@pytest.fixture
def engine(memable_engine: Engine) -> Engine:
    """The plugin's engine, under the shorter name these tests use."""
    return memable_engine


@pytest.fixture
def client(engine: Engine) -> FlaskClient:
    """A test client of the app, on the in-memory engine of the plugin."""
    return create_app(engine, TESTING=True, SECRET_KEY="tests only").test_client()
