"""How a run's end is recorded when something else touched its instance first.

A run that read its row without a parent records its end and commits in one round trip
(PostgreSQL: ``finish`` with ``execute_each(last=True)``); a run that read no row (one
started here from its input) goes the two-round-trip way. Both must answer alike when,
before the end, a cancel marked the instance (the end only lets go of it, so its queue's
slot comes free) or another engine took it over (the end writes nothing). Each pair is
forced in order, at the store, on a file and on PostgreSQL.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from helpers import queued_row, store_of

from memable import Engine
from memable._store.protocol import Store
from memable._store.rows import RunEnd, RunSnapshot

#: Whether the run read its row (its end then commits in the round trip that records it).
READ = pytest.mark.parametrize("read", [True, False], ids=["read-its-row", "read-nothing"])


def _claim(store: Store) -> list[RunSnapshot]:
    """One claim of queue "q" (concurrency 1) by ``store``'s engine: what it took."""
    return store.claim_queued("q", ["wf"], concurrency=1, per_process=None, rate=None,
                              clock=time.time, at=time.time(), batch=1).snapshots


def _end(snapshot: RunSnapshot, read: bool) -> RunEnd:
    return RunEnd("completed", time.time(), output=("1", None),
                  read=snapshot.instance if read else None)


@READ
def test_the_end_of_a_cancelled_run_lets_go_of_its_slot(
    open_shared: Callable[..., Engine], read: bool,
) -> None:
    """A run claimed from a ``concurrency=1`` queue is cancelled while its engine is alive:
    the slot stays held. Its end is then not recorded (the instance stays cancelled) but lets
    go of the instance at once: the next claim takes the next instance."""
    store = store_of(open_shared())
    store.register_owner(60.0, time.time())
    for instance_id in ("a", "b"):
        assert store.create_instance(queued_row(instance_id)) is True
    [a] = _claim(store)
    store.cancel("wf", "a", now=time.time())
    assert _claim(store) == []  # the cancelled run of a live engine holds the slot
    assert store.finish("wf", "a", _end(a, read)).recorded is False
    row = store.get_instance("wf", "a")
    assert row is not None
    assert (row.status, row.owner) == ("cancelled", None)
    assert [s.instance.instance_id for s in _claim(store)] == ["b"]


@READ
def test_the_end_of_a_run_taken_over_writes_nothing(
    open_shared: Callable[..., Engine], read: bool,
) -> None:
    """A run's engine (never registered: dead to the others) claims an instance; another
    engine recovers it (back in its queue, in its place) and claims it. The first run's end
    is not recorded and changes nothing: the instance stays running, the other engine's."""
    first, other = store_of(open_shared()), store_of(open_shared())
    assert first.create_instance(queued_row("a")) is True
    [a] = _claim(first)
    recovered = other.begin_run("wf", "a", now=time.time(), claim="recover")
    assert recovered is not None
    assert (recovered.instance.status, recovered.instance.owner) == ("queued", None)
    [taken] = _claim(other)
    assert taken.instance.owner == other.owner
    assert first.finish("wf", "a", _end(a, read)).recorded is False
    row = first.get_instance("wf", "a")
    assert row is not None
    assert (row.status, row.owner, row.output) == ("running", other.owner, None)
