"""Helpers shared by several test modules (not a test module itself)."""

from __future__ import annotations

from datetime import datetime, timezone

from memable import Engine

#: A fixed instant for tests that freeze the clock.
T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def dump(engine: Engine) -> list[str]:
    """Every row of the store, as SQL text (private connection on purpose: a full snapshot)."""
    with engine._store._lock:  # type: ignore[attr-defined]
        return list(engine._store._conn.iterdump())  # type: ignore[attr-defined]
