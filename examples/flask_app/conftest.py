"""Fixtures of the Flask example: the plugin's ``memable_engine`` runs the app's WORKFLOWS."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from memable import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent))

from app import create_app
from workflows import WORKFLOWS


@pytest.fixture
def memable_workflows() -> dict[str, Callable[..., Any]]:
    """What the plugin's ``memable_engine`` fixture registers before it starts the engine."""
    return WORKFLOWS


@pytest.fixture
def engine(memable_engine: Engine) -> Engine:
    """The plugin's engine, under the shorter name these tests use."""
    return memable_engine


@pytest.fixture
def client(engine: Engine) -> FlaskClient:
    """A test client of the app, on the in-memory engine of the plugin."""
    return create_app(engine, TESTING=True).test_client()
