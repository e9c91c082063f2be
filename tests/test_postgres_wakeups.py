"""A cancel reaches what waits on the instance at once, not at the next poll (issue 21,
point 5); so does the end of a run that held a queue's slot another engine waits for.

An ``Invocation`` whose instance runs nowhere here (suspended, or queued) follows the
store, reading it again each ``poll_interval``. A cancel made by this engine, or told
by another one through PostgreSQL's NOTIFY (another engine, or ``memable cancel``),
has it read again at once. Every engine here polls every 30 s, and the follower
must have ended within 10 s of the cancel: only the wake-up ends it in time (its
next poll would find the instance cancelled too, but 30 s on).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from conftest import POSTGRES_URL, postgres_or_skip
from helpers import cli, runner_of

from memable import Cancelled, Engine, Invocation, Queued, Suspended, WorkflowFailed

TIMEOUT = 10.0
POLL = 30.0


def _register(engine: Engine) -> None:
    engine.queue("q")
    engine.register("parked", lambda ctx: ctx.suspend("go"))
    engine.register("queued", lambda ctx: "ran", queue="q")


class Follower:
    """A thread that follows an instance (``result()`` or ``wait()``) and keeps how it ended.

    ``read`` is set once the follower has read the stored row: a change from then on
    must end its wait. ``_lock`` guards ``outcome``.
    """

    def __init__(self, engine: Engine, inv: Invocation, how: str) -> None:
        self.read = threading.Event()
        self._lock = threading.Lock()
        self.outcome: Any = None
        stored_row = engine._stored_row

        def reading(workflow: str, instance_id: str) -> Any:
            row = stored_row(workflow, instance_id)
            self.read.set()
            return row

        engine._stored_row = reading  # type: ignore[method-assign]
        follow = inv.result if how == "result" else inv.wait

        def run() -> None:
            try:
                got: Any = follow(POLL * 2)  # past the poll: a wait without the wake-up
            except Exception as exc:  # WorkflowFailed (or a closed store, after a failure)
                got = exc
            with self._lock:
                self.outcome = got

        # A daemon: after a failed check it ends at its poll, or when the store closes.
        self._thread = threading.Thread(target=run, name="test-follower", daemon=True)
        self._thread.start()

    def ended(self) -> Any:
        """How the follow ended (its value, or the exception it raised), within TIMEOUT."""
        self._thread.join(TIMEOUT)
        assert not self._thread.is_alive(), "the cancel did not end the wait"
        with self._lock:
            return self.outcome


def _follow(engine: Engine, how: str) -> Follower:
    """Start an instance that runs nowhere here, and a follower of it waiting on the store:
    ``result()`` of a suspended one, or ``wait()`` of a queued one nobody consumes."""
    if how == "result":
        inv = engine.invoke("parked", instance_id="i")
        assert inv.wait(TIMEOUT) == Suspended("go")
    else:
        inv = engine.invoke("queued", instance_id="i")
        assert inv.state == Queued()
    follower = Follower(engine, inv, how)
    assert follower.read.wait(TIMEOUT)
    return follower


def _assert_cancelled(how: str, outcome: Any) -> None:
    if how == "result":
        assert isinstance(outcome, WorkflowFailed), outcome
        assert outcome.state == Cancelled()
    else:
        assert outcome == Cancelled()


@pytest.mark.parametrize("how", ["result", "wait"])
def test_a_local_cancel_ends_a_wait_on_the_store_at_once(
    make_engine: Callable[..., Engine], how: str,
) -> None:
    """A cancel made by this engine ends, well before the next 30 s poll, a ``result()`` on
    a suspended instance or a ``wait()`` on a queued one that is following the store."""
    engine = make_engine(poll_interval=POLL, queues=())
    _register(engine)
    with engine:
        follower = _follow(engine, how)
        engine.cancel("parked" if how == "result" else "queued", "i")
        _assert_cancelled(how, follower.ended())


@pytest.mark.parametrize("by", ["cli", "engine"])
@pytest.mark.parametrize("how", ["result", "wait"])
def test_a_cancel_from_elsewhere_ends_a_wait_on_a_postgres_store_at_once(
    pg_schema: str, how: str, by: str,
) -> None:
    """The cancel's NOTIFY reaches the waiting engine within milliseconds, as a signal's
    does: from another engine on the schema, or from ``memable cancel``."""
    postgres_or_skip()
    engine = Engine.open(POSTGRES_URL, schema=pg_schema, poll_interval=POLL, queues=())
    other = Engine.open(POSTGRES_URL, schema=pg_schema, poll_interval=POLL, queues=())
    for each in (engine, other):
        _register(each)
    workflow = "parked" if how == "result" else "queued"
    try:
        with engine:
            follower = _follow(engine, how)
            if by == "cli":
                done = cli("cancel", POSTGRES_URL, workflow, "i", "--schema", pg_schema)
                assert done.exit_code == 0, done.output
            else:
                with other:
                    other.cancel(workflow, "i")
            _assert_cancelled(how, follower.ended())
    finally:
        other.close()
        engine.close()


def test_a_run_that_ends_elsewhere_frees_its_queue_slot_at_once(pg_schema: str) -> None:
    """The end of a run on a queue tells every engine on the store (NOTIFY "queued", sent
    by the statement that records the end): an engine whose instance waits for that slot
    starts it at once, not at its next poll, 30 s on. Each engine runs one workflow of
    the queue (concurrency 1), so only the other one can take the waiting instance."""
    postgres_or_skip()
    started, release = threading.Event(), threading.Event()
    first = Engine.open(POSTGRES_URL, schema=pg_schema, poll_interval=POLL)
    second = Engine.open(POSTGRES_URL, schema=pg_schema, poll_interval=POLL)
    for each in (first, second):
        each.queue("one", concurrency=1)

    def holds(ctx: Any) -> bool:
        started.set()
        return release.wait(TIMEOUT)

    first.register("holds", holds, queue="one")
    second.register("waits", lambda ctx: "ran", queue="one")
    looked = threading.Event()  # the second engine's queue thread looked (and found no slot)
    try:
        with first, second:
            consumer = runner_of(second).claims.consumer
            assert consumer is not None
            claim = consumer.claim

            def claiming() -> float | None:
                retry_in = claim()
                looked.set()
                return retry_in

            consumer.claim = claiming  # type: ignore[method-assign]
            holding = first.invoke("holds", instance_id="h")
            assert started.wait(TIMEOUT)
            looked.clear()
            waiting = second.invoke("waits", instance_id="w")  # kicks its queue thread
            assert looked.wait(TIMEOUT)
            assert waiting.state == Queued()  # the slot is the first engine's run's
            release.set()
            assert holding.result(TIMEOUT) is True
            assert waiting.result(TIMEOUT) == "ran"
    finally:
        second.close()
        first.close()
