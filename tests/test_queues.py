"""Queues: ``engine.queue``, ``register(..., queue=)``, ``invoke(..., queue=, priority=)``,
``Queued``, the ``queues`` option, and the limits, on every store."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from helpers import Looks, build, query, queued_row, runner_of, store_of, until

from memable import (
    AlreadyStarted,
    Cancelled,
    Completed,
    Context,
    Engine,
    MetadataStatus,
    Queued,
    Suspended,
)

TIMEOUT = 10.0


def _running(engine: Engine, queue: str) -> int:
    rows = query(engine, "SELECT count(*) FROM memable_instances "
                 "WHERE queue = ? AND status = 'running'", (queue,))
    return int(rows[0][0])


def test_an_instance_invoked_onto_a_queue_is_queued_then_run(
    make_engine: Callable[..., Engine],
) -> None:
    """An instance of a workflow registered on a queue is run by the engine that consumes
    the queue, and ends completed."""
    engine = make_engine()
    engine.queue("q")
    engine.register("double", lambda ctx, n: n * 2, queue="q")
    with engine:
        inv = engine.invoke("double", 21, instance_id="d")
        assert inv.result(TIMEOUT) == 42
        meta = engine.get_metadata("double", "d")
        assert meta is not None
        assert meta.status == MetadataStatus.Completed()


@pytest.fixture(params=["file", "postgres"])
def shared(request: pytest.FixtureRequest, tmp_path: Any) -> Callable[..., Engine]:
    """Engines that share one store (a file, or a PostgreSQL schema), closed afterwards."""
    from conftest import POSTGRES_URL

    made: list[Engine] = []
    if request.param == "file":
        target: dict[str, Any] = {"target": tmp_path / "db"}
    else:
        target = {"target": POSTGRES_URL, "schema": request.getfixturevalue("pg_schema")}

    def make(**options: Any) -> Engine:
        made.append(build(**target, **options).engine)
        return made[-1]

    yield make  # type: ignore[misc]
    for engine in made:
        engine.close()


def _job_of(who: str, ran: list[str]) -> Callable[[Context], str]:
    def job(ctx: Context) -> str:
        ran.append(who)
        return who

    return job


def test_an_enqueue_only_engine_stores_queued_instances_and_runs_none(
    shared: Callable[..., Engine],
) -> None:
    """An engine that consumes no queue (``queues=()``) stores the instance as queued and
    never runs it; a second engine on the same file or PostgreSQL store that consumes the
    queue runs it."""
    ran: list[str] = []
    web = shared(queues=())
    worker = shared(poll_interval=0.05)
    for engine, who in ((web, "web"), (worker, "worker")):
        engine.queue("q")
        engine.register("job", _job_of(who, ran), queue="q")
    with web:
        inv = web.invoke("job", instance_id="j")
        assert inv.state == Queued()
        meta = web.get_metadata("job", "j")
        assert meta is not None
        assert meta.status == MetadataStatus.Queued()
        with pytest.raises(TimeoutError):
            inv.wait(timeout=0.3)  # queued: nothing runs it yet
        with worker:
            assert inv.result(TIMEOUT) == "worker"
    assert ran == ["worker"]


def test_concurrency_caps_the_running_instances_of_a_queue(
    make_engine: Callable[..., Engine],
) -> None:
    """Five instances, concurrency 2: two run (held at a gate) while three stay queued;
    released, all complete."""
    engine = make_engine(poll_interval=60)
    engine.queue("q", concurrency=2)
    gate = threading.Event()
    entered = threading.Semaphore(0)

    def held(ctx: Context, n: int) -> int:
        entered.release()
        assert gate.wait(TIMEOUT)
        return n

    engine.register("held", held, queue="q")
    with engine:
        invs = [engine.invoke("held", i, instance_id=f"h{i}") for i in range(5)]
        assert entered.acquire(timeout=TIMEOUT)
        assert entered.acquire(timeout=TIMEOUT)
        assert _running(engine, "q") == 2
        assert sorted(str(inv.state) for inv in invs) == ["queued"] * 3 + ["started"] * 2
        gate.set()
        assert [inv.result(TIMEOUT) for inv in invs] == [0, 1, 2, 3, 4]


def test_per_process_caps_what_this_engine_runs(make_engine: Callable[..., Engine]) -> None:
    """``per_process=1`` lets this engine run one instance of the queue at a time: with the
    first held on an event, only one is running, and all three complete once it is
    released."""
    engine = make_engine(poll_interval=60)
    engine.queue("q", per_process=1)
    gate, entered = threading.Event(), threading.Semaphore(0)

    def held(ctx: Context, n: int) -> int:
        entered.release()
        assert gate.wait(TIMEOUT)
        return n

    engine.register("held", held, queue="q")
    with engine:
        invs = [engine.invoke("held", i, instance_id=f"h{i}") for i in range(3)]
        assert entered.acquire(timeout=TIMEOUT)
        assert _running(engine, "q") == 1
        gate.set()
        assert [inv.result(TIMEOUT) for inv in invs] == [0, 1, 2]


def test_lower_priority_runs_first_then_the_order_of_queueing(
    make_engine: Callable[..., Engine],
) -> None:
    """Queued while the one slot is held, they run by priority, then in queueing order."""
    order: list[int] = []
    web = make_engine(poll_interval=60)
    gate = threading.Event()

    def job(ctx: Context, n: int) -> int:
        if n < 0:
            assert gate.wait(TIMEOUT)
        order.append(n)
        return n

    web.queue("q", concurrency=1)
    web.register("job", job, queue="q")
    web.start()
    try:
        blocker = web.invoke("job", -1, instance_id="blocker", priority=-10)
        until(lambda: _running(web, "q") == 1)
        invs = [web.invoke("job", n, instance_id=f"j{n}", priority=p)
                for n, p in ((1, 5), (2, 1), (3, 5), (4, 0))]
        gate.set()
        assert blocker.result(TIMEOUT) == -1
        for inv in invs:
            inv.result(TIMEOUT)
    finally:
        web.close()
    assert order == [-1, 4, 2, 1, 3]


def test_a_signal_to_a_queued_workflow_queues_its_next_run(
    make_engine: Callable[..., Engine],
) -> None:
    """A suspended instance of a queued workflow holds no slot of its queue, and a signal to
    it queues its next run, which completes."""
    engine = make_engine()
    engine.queue("q", concurrency=1)
    engine.register("approve", lambda ctx: ctx.suspend("ok") + 1, queue="q")
    with engine:
        inv = engine.invoke("approve", instance_id="a")
        assert inv.wait(TIMEOUT) == Suspended("ok")
        assert _running(engine, "q") == 0  # suspended: it holds no slot
        engine.signal("approve", "a", "ok", 41)
        assert inv.result(TIMEOUT) == 42


def test_a_cancelled_queued_instance_never_runs(make_engine: Callable[..., Engine]) -> None:
    """An instance cancelled while it is queued (no engine consumes the queue) ends
    cancelled and never runs."""
    ran: list[int] = []
    engine = make_engine(queues=())
    engine.queue("q")
    engine.register("job", lambda ctx: ran.append(1), queue="q")
    with engine:
        inv = engine.invoke("job", instance_id="j")
        assert inv.state == Queued()
        engine.cancel("job", "j")
        assert inv.wait(TIMEOUT) == Cancelled()
    assert ran == []


def test_invoke_can_override_the_queue_or_run_without_one(
    make_engine: Callable[..., Engine],
) -> None:
    """``invoke(queue=...)`` puts an instance on another declared queue than its workflow's,
    and a workflow with no queue runs directly on the invoking engine; an instance on a
    queue nobody consumes stays queued."""
    engine = make_engine(queues=("b",))
    engine.queue("a")
    engine.queue("b")
    engine.register("job", lambda ctx: "done", queue="a")
    engine.register("plain", lambda ctx: "here")
    with engine:
        assert engine.invoke("job", instance_id="on-a").state == Queued()  # a: not consumed
        assert engine.invoke("job", instance_id="on-b", queue="b").result(TIMEOUT) == "done"
        assert engine.invoke("plain").result(TIMEOUT) == "here"  # no queue: runs here
        assert engine.invocation("job", "on-a").state == Queued()


def test_wait_all_waits_for_the_queued_instances_this_engine_runs(
    make_engine: Callable[..., Engine],
) -> None:
    """``engine.wait_all`` returns only once every instance queued onto a queue this engine
    consumes has completed."""
    engine = make_engine()
    engine.queue("q", concurrency=2)
    engine.register("double", lambda ctx, n: n * 2, queue="q")
    engine.start()
    invs = [engine.invoke("double", i) for i in range(20)]
    engine.wait_all()
    assert all(inv.state == Completed() for inv in invs)
    engine.close()


def test_children_go_through_their_queue(make_engine: Callable[..., Engine]) -> None:
    """Children of a workflow registered on a queue run through that queue (three at a time
    here), and the parent gets every child's result."""
    engine = make_engine()
    engine.queue("resize", concurrency=3)
    engine.register("resize", lambda ctx, n: n + 1, queue="resize")
    engine.register("batch", lambda ctx, n: sum(ctx.children("r", "resize", range(n))))
    with engine:
        assert engine.invoke("batch", 30, instance_id="b").result(TIMEOUT) == sum(range(1, 31))
        assert _running(engine, "resize") == 0


def test_a_rate_limit_spaces_the_starts(make_engine: Callable[..., Engine]) -> None:
    """rate=(3, 0.3 s): the claims of nine instances, as the store records them, never
    hold more than three in any 0.3 s window."""
    engine = make_engine(poll_interval=60)
    engine.queue("q", rate=(3, timedelta(seconds=0.3)))
    engine.register("job", lambda ctx, n: n, queue="q")
    seen: dict[float, int] = {}  # each start time, and how many claims it holds
    stop = threading.Event()

    def sample_once() -> None:
        for at, n in query(engine, "SELECT at, count(*) FROM memable_queue_starts GROUP BY at"):
            seen[at] = max(seen.get(at, 0), n)

    def sample() -> None:  # the store keeps a start for a window: look more often
        while not stop.is_set():
            sample_once()
            stop.wait(0.02)

    with engine:
        sampler = threading.Thread(target=sample, name="test-sampler")
        sampler.start()
        try:
            invs = [engine.invoke("job", i) for i in range(9)]
            assert [inv.result(TIMEOUT) for inv in invs] == list(range(9))
        finally:
            stop.set()
            sampler.join()
        sample_once()  # the last claims, still in their window
    starts = sorted(at for at, n in seen.items() for _ in range(n))
    assert len(starts) == 9
    assert all(starts[i + 3] - starts[i] >= 0.3 for i in range(len(starts) - 3))


@pytest.mark.parametrize(
    ("limits", "error"),
    [({"concurrency": 0}, ValueError), ({"per_process": -1}, ValueError),
     ({"concurrency": 1.5}, ValueError), ({"concurrency": True}, ValueError),
     ({"rate": (0, 1)}, ValueError), ({"rate": (5, 0)}, ValueError),
     ({"rate": (5, "1s")}, ValueError), ({"rate": 5}, ValueError)],
)
def test_a_bad_limit_is_refused(engine: Engine, limits: dict[str, Any], error: type) -> None:
    """``engine.queue`` refuses a zero, negative, float or bool limit and a ``rate`` that is
    not a (positive count, positive seconds) pair."""
    with pytest.raises(error):
        engine.queue("q", **limits)


def test_queues_are_declared_before_start_and_by_name(engine: Engine) -> None:
    """A workflow or an invoke naming an undeclared queue is refused, a queue declared twice
    is refused, declaring one after start raises ``AlreadyStarted``, and a non-int priority
    is a ``TypeError``."""
    with pytest.raises(ValueError, match="not declared"):
        engine.register("job", lambda ctx: None, queue="nowhere")
    engine.queue("q")
    with pytest.raises(ValueError, match="already declared"):
        engine.queue("q")
    engine.register("job", lambda ctx: None, queue="q")
    with engine:
        with pytest.raises(AlreadyStarted):
            engine.queue("late")
        with pytest.raises(ValueError, match="not declared"):
            engine.invoke("job", queue="nowhere")
        with pytest.raises(TypeError, match="priority"):
            engine.invoke("job", priority="high")


def test_consuming_an_undeclared_queue_is_refused_at_start(
    make_engine: Callable[..., Engine],
) -> None:
    """An engine told to consume a queue nobody declared refuses to start."""
    engine = make_engine(queues=("missing",))
    with pytest.raises(ValueError, match="not declared"):
        engine.start()


def test_a_poll_during_a_claim_does_not_take_back_what_was_claimed(
    make_engine: Callable[..., Engine],
) -> None:
    """The poll's look at "instances ours that no run here has" comes right after a
    claim committed and before its run began: it must leave the claimed instance alone
    (else it would queue it again, and it would start twice)."""
    engine = make_engine(poll_interval=60)
    engine.queue("q")
    engine.register("job", lambda ctx, n: ctx.step("s").run(lambda: n), queue="q")
    store = store_of(engine)
    claim = store.claim_queued
    looked: list[int] = []

    def claim_then_poll(*args: Any, **kwargs: Any) -> Any:
        claimed = claim(*args, **kwargs)
        if claimed.snapshots:
            runner_of(engine).claims.look_around(kwargs["clock"]())
            looked.append(len(claimed.snapshots))
        return claimed

    store.claim_queued = claim_then_poll  # type: ignore[method-assign]
    with engine:
        assert engine.invoke("job", 7, instance_id="j").result(TIMEOUT) == 7
        assert engine.steps("job", "j")[0].attempts == 1
    assert looked == [1]  # one claim: it was not queued again and claimed a second time


def test_wait_follows_a_queued_instance_to_the_end_of_its_next_run(
    make_engine: Callable[..., Engine],
) -> None:
    """After a signal, the instance waits for a slot (Queued) before it runs on:
    ``wait()`` returns the state that run ends in, not Queued."""
    engine = make_engine()
    engine.queue("q", concurrency=1)

    def two_waits(ctx: Context) -> str:
        ctx.suspend("first")
        return str(ctx.suspend("second"))

    engine.register("two", two_waits, queue="q")
    with engine:
        inv = engine.invoke("two", instance_id="t")
        assert inv.wait(TIMEOUT) == Suspended("first")
        assert engine.signal("two", "t", "first", 1).wait(TIMEOUT) == Suspended("second")
        assert engine.resume("two", "t").wait(TIMEOUT) == Suspended("second")
        assert engine.signal("two", "t", "second", "done").result(TIMEOUT) == "done"


def test_a_file_store_reads_the_rate_clock_under_its_write_lock(tmp_path: Any) -> None:
    """Claims on one file are serialised by its write lock; the clock a rate is judged by
    is read inside that lock, so the starts are recorded in the order claims commit
    (a clock read before waiting for the lock would record a later claim as earlier)."""
    import time

    from memable._sqlite.store import SQLiteStore

    store = SQLiteStore(tmp_path / "db", "full")
    try:
        store.create_instance(queued_row("i", at="t"))
        locked: list[bool] = []

        def clock() -> float:
            locked.append(store._conn.in_transaction)
            return time.time()

        claimed = store.claim_queued("q", ["wf"], concurrency=None, per_process=None,
                                     rate=(5, 1.0), clock=clock, at=time.time(), batch=8)
        assert [s.instance.instance_id for s in claimed.snapshots] == ["i"]
        assert locked == [True]
    finally:
        store.close()


def test_a_queue_without_a_rate_keeps_no_starts(make_engine: Callable[..., Engine]) -> None:
    """Only a rate counts starts: a queue without one leaves ``queue_starts`` empty."""
    engine = make_engine()
    engine.queue("q", concurrency=2)
    engine.register("job", lambda ctx, n: n, queue="q")
    with engine:
        assert [engine.invoke("job", i).result(TIMEOUT) for i in range(5)] == list(range(5))
        assert query(engine, "SELECT count(*) FROM memable_queue_starts") == [(0,)]


def _unconsumed(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The WARNINGs naming a queue that no running engine consumes, as logged."""
    return [r.getMessage() for r in caplog.records
            if r.levelno == logging.WARNING and "no running engine consumes it" in r.getMessage()]


def test_a_queue_nobody_consumes_is_named_once_with_the_closest_consumed_name(
    shared: Callable[..., Engine], caplog: pytest.LogCaptureFixture,
) -> None:
    """A typo between the web process (``ordres``) and the worker (``orders``) left the
    order queued for ever and nothing said so. The worker names each such queue once, at
    WARNING, with the closest name it consumes: at its start for what was queued before,
    and at a later look for what is queued after; never again for the same queue."""
    caplog.set_level(logging.WARNING, logger="memable")
    web = shared(queues=())
    worker = shared(lease=1.5)  # looks for unconsumed queues every lease seconds
    web.queue("ordres")
    web.queue("oders")
    web.register("ship", lambda ctx: "shipped", queue="ordres")
    worker.queue("orders")
    worker.register("ship", lambda ctx: "shipped", queue="orders")
    claims, checks = Looks(worker), Looks(worker, "queue_names")
    with web:
        first = web.invoke("ship", instance_id="o-1")
        with worker:
            claims.twice_more()  # its first claim looked before it claimed
            [said] = _unconsumed(caplog)
            assert "queue 'ordres' holds 1 runnable instance" in said
            assert "closest queue consumed is 'orders'" in said
            web.invoke("ship", instance_id="o-2", queue="oders")
            # The second check began after the invoke; a claim that returns after it
            # read the queues comes after what that check logged (one thread does both).
            checks.twice_more()
            claims.twice_more()
            assert len(_unconsumed(caplog)) == 2
            assert "queue 'oders' holds 1" in _unconsumed(caplog)[1]
            assert "'orders'" in _unconsumed(caplog)[1]
            checks.twice_more()  # more looks, the same queues: nothing more said
            claims.twice_more()
            assert len(_unconsumed(caplog)) == 2
            assert first.state == Queued()


def test_no_queue_is_named_unconsumed_when_the_names_match(
    shared: Callable[..., Engine], caplog: pytest.LogCaptureFixture,
) -> None:
    """The web process and the worker name one queue: the order runs and no WARNING says
    that a queue is unconsumed; nor one that holds the worker's workflow and that another
    running engine consumes (without running that workflow: why it waits is for
    ``memable show``, not a typo)."""
    caplog.set_level(logging.WARNING, logger="memable")
    web = shared(queues=())
    worker = shared(lease=1.5, queues=["orders"])
    other = shared(queues=["emails"])
    for engine in (web, worker, other):
        engine.queue("orders")
        engine.queue("emails")
    for engine in (web, worker):
        engine.register("ship", lambda ctx: "shipped", queue="orders")
    other.register("mail", lambda ctx: "mailed", queue="emails")
    checks = Looks(worker, "queue_names")
    with web, other:
        emailed = web.invoke("ship", instance_id="e-1", queue="emails")
        with worker:
            inv = web.invoke("ship", instance_id="o-1")
            assert inv.result(TIMEOUT) == "shipped"
            checks.twice_more()
            assert emailed.state == Queued()
    assert _unconsumed(caplog) == []
