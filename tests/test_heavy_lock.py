"""The suite's own guard: a test marked ``heavy`` holds the machine-wide lock while it runs,
so no other heavy test (another worker's, another tox env's) runs beside it."""

from __future__ import annotations

import fcntl

import pytest
from conftest import HEAVY_LOCK


@pytest.mark.heavy
def test_a_heavy_test_runs_holding_the_lock() -> None:
    """While a ``heavy`` test runs, another file handle cannot take the machine-wide lock: the
    suite's fixture holds it."""
    with open(HEAVY_LOCK, "a") as other, pytest.raises(BlockingIOError):
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
