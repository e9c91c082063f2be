"""A cancelled run holds its queue's slot until it has stopped (issue 21, point 4).

``cancel`` marks a running instance cancelled at once while its step goes on; the
slot stays taken until that run lets go of the instance (or its owner dies), and
then the queue is woken: the engine that ran it, another engine on the store (a
file's poll, PostgreSQL's NOTIFY), or, for a dead owner, once its lease ran out.

Run as a script (``python test_cancel_queue_slot.py hold TARGET SCHEMA``) this is
the child process of the dead-owner tests: an engine that runs one instance into
a step that never returns.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from helpers import build, query, runner_of, store_of, until, write

from memable import Cancelled, Context, Engine, MetadataStatus
from memable._engine import access

TIMEOUT = 10.0
#: The child's lease: long enough that a loaded machine does not let it lapse while
#: the child lives, short enough to wait out once it is stopped.
CHILD_LEASE = 3.0


class Steps:
    """How many step bodies run at once, and the most seen; ``lock`` guards both."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0

    def enter(self) -> None:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def leave(self) -> None:
        with self.lock:
            self.now -= 1


class Claims:
    """Every queue claim an engine makes, numbered by when it began, with what it took.

    ``_cond`` guards ``_begun`` and ``_done``.
    """

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._cond = threading.Condition()
        self._begun = 0
        self._done: list[tuple[int, list[str]]] = []
        store = store_of(engine)
        claim = store.claim_queued

        def traced(*args: Any, **kwargs: Any) -> Any:
            with self._cond:
                self._begun += 1
                number = self._begun
            claimed = claim(*args, **kwargs)
            with self._cond:
                self._done.append((number, [s.instance.instance_id for s in claimed.snapshots]))
                self._cond.notify_all()
            return claimed

        store.claim_queued = traced  # type: ignore[method-assign]

    def look_now(self) -> list[str]:
        """Have the queue thread look again; what the first claim begun after this took."""
        with self._cond:
            mark = self._begun
        runner_of(self._engine).kick()
        with self._cond:
            assert self._cond.wait_for(lambda: any(n > mark for n, _ in self._done), TIMEOUT)
            return next(ids for n, ids in self._done if n > mark)


def _holder(steps: Steps, inside: threading.Event, release: threading.Event,
            then: str = "step") -> Callable[[Context], str]:
    """A workflow whose first step waits for ``release``; a cancel stops it before what
    comes ``then``: another step, or a suspend point (whose store write finds the
    instance cancelled, when no notice of the cancel reached the run)."""
    def work() -> str:
        steps.enter()
        try:
            inside.set()
            assert release.wait(TIMEOUT * 3)
            return "worked"
        finally:
            steps.leave()

    def hold(ctx: Context) -> str:
        ctx.step("work").run(work)
        if then == "suspend":
            return str(ctx.suspend("never"))
        return str(ctx.step("after").run(lambda: "never: cancelled before it"))

    return hold


def _job(steps: Steps) -> Callable[[Context], str]:
    def work() -> str:
        steps.enter()
        steps.leave()
        return "done"

    def job(ctx: Context) -> str:
        return str(ctx.step("work").run(work))

    return job


@contextmanager
def _released(release: threading.Event) -> Iterator[None]:
    """Within: a held step waits for ``release``; on leaving (a failed assertion too) it
    is set, so the engine can stop."""
    try:
        yield
    finally:
        release.set()


def _status(engine: Engine, workflow: str, instance_id: str) -> object:
    meta = engine.get_metadata(workflow, instance_id)
    assert meta is not None
    return meta.status


def test_a_cancelled_run_holds_its_slot_until_it_stops(
    make_engine: Callable[..., Engine],
) -> None:
    """concurrency=1, A's step in flight, A cancelled, B invoked: B stays queued while
    A's step runs (the queue thread looks and takes nothing); once A's run stopped,
    B runs. Never two steps at once."""
    engine = make_engine(poll_interval=60)
    engine.queue("q", concurrency=1)
    steps, inside, release = Steps(), threading.Event(), threading.Event()
    engine.register("hold", _holder(steps, inside, release), queue="q")
    engine.register("job", _job(steps), queue="q")
    claims = Claims(engine)
    with engine, _released(release):
        a = engine.invoke("hold", instance_id="a")
        assert inside.wait(TIMEOUT)
        engine.cancel("hold", "a")
        b = engine.invoke("job", instance_id="b")
        assert claims.look_now() == []
        assert _status(engine, "job", "b") == MetadataStatus.Queued()
        release.set()
        assert a.wait(TIMEOUT) == Cancelled()
        assert b.result(TIMEOUT) == "done"
        assert [s.key for s in engine.steps("hold", "a")] == ["work"]
    assert steps.most == 1


def _on_postgres(engine: Engine) -> bool:
    from memable._postgres.store import PostgresStore

    return isinstance(store_of(engine), PostgresStore)


@pytest.mark.parametrize("then", ["step", "suspend"])
def test_another_engine_claims_the_slot_once_the_cancelled_run_stopped(
    open_shared: Callable[..., Engine], then: str,
) -> None:
    """Engine one runs A (only it has "hold"), engine two alone can run B ("job"). Two
    cancels A and invokes B: B stays queued while A's step runs; when one's run stops
    (at its next step, or at a suspend point), two is woken through the store (a
    file's poll; on PostgreSQL the release's NOTIFY: two polls only every 30 s, and B
    must run well within that)."""
    one = open_shared(poll_interval=30)
    two = open_shared(poll_interval=30 if _on_postgres(one) else 0.05)
    steps, inside, release = Steps(), threading.Event(), threading.Event()
    for engine in (one, two):
        engine.queue("q", concurrency=1)
    one.register("hold", _holder(steps, inside, release, then), queue="q")
    two.register("job", _job(steps), queue="q")
    claims = Claims(two)
    with one, two, _released(release):
        a = one.invoke("hold", instance_id="a")
        assert inside.wait(TIMEOUT)
        two.cancel("hold", "a")
        b = two.invoke("job", instance_id="b")
        assert claims.look_now() == []
        assert _status(two, "job", "b") == MetadataStatus.Queued()
        release.set()
        assert a.wait(TIMEOUT) == Cancelled()
        assert b.result(TIMEOUT) == "done"
        assert [s.key for s in one.steps("hold", "a")] == ["work"]
    assert steps.most == 1


def _child(target: str, schema: str) -> None:
    """The child process: run "hold" instance "a" into a step that never returns."""
    engine = Engine.open(target, schema=schema or None, poll_interval=0.05, lease=CHILD_LEASE)
    engine.queue("q", concurrency=1)

    def work() -> None:
        print("in step", flush=True)
        threading.Event().wait()  # until the parent kills or stops this process

    engine.register("hold", lambda ctx: ctx.step("work").run(work), queue="q")
    with engine:
        engine.invoke("hold", instance_id="a")
        threading.Event().wait()


@pytest.mark.parametrize("where", ["here", "elsewhere"])
def test_the_slot_of_a_cancelled_run_whose_owner_died_comes_free(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any], where: str,
) -> None:
    """A child process runs A and holds the slot; A is cancelled here and B stays queued
    while the child lives. Then the child is SIGKILLed: nobody will clear A's owner.
    On this host its dead pid gets its owner row reaped at once; an owner on another
    host is judged by its lease alone (the test moves the child's row "elsewhere"
    first). Either way B runs."""
    engine = open_shared(poll_interval=0.05)
    engine.queue("q", concurrency=1)
    steps = Steps()
    engine.register("job", _job(steps), queue="q")
    claims = Claims(engine)
    child = subprocess.Popen(
        [sys.executable, __file__, "hold", str(shared_store["target"]),
         shared_store.get("schema") or ""],
        stdout=subprocess.PIPE, text=True,
    )
    with engine:
        try:
            assert child.stdout is not None
            assert child.stdout.readline() == "in step\n"
            engine.cancel("hold", "a")
            b = engine.invoke("job", instance_id="b")
            assert claims.look_now() == []
            assert _status(engine, "job", "b") == MetadataStatus.Queued()
            if where == "elsewhere":
                write(engine, "UPDATE memable_owners SET host = 'elsewhere.invalid' WHERE id <> ?",
                      (store_of(engine).owner,))
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=60)
            assert b.result(TIMEOUT + CHILD_LEASE) == "done"
            assert _status(engine, "hold", "a") == MetadataStatus.Cancelled()
            [(owner,)] = query(engine,
                               "SELECT owner FROM memable_instances WHERE instance_id = 'a'")
            assert owner is not None  # the dead run never let go: its owner's death freed B
        finally:
            if child.poll() is None:
                os.kill(child.pid, signal.SIGKILL)
                child.wait(timeout=60)
            if child.stdout is not None:
                child.stdout.close()


@contextmanager
def _end_fails(store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
               request: pytest.FixtureRequest) -> Iterator[tuple[dict[str, Any], dict[str, Any],
                                                                 Callable[[], None],
                                                                 Callable[[], None]]]:
    """How a store's writes fail for a while: (how the engine opens it, how a reader opens
    it, block, unblock). A file: another connection holds the write lock past a busy
    timeout of 0.5 s. PostgreSQL: the engine reaches the server through a proxy that drops
    every connection and refuses new ones, past the engine's lease (4 s), so its run's
    writes give up (``LeaseLost``)."""
    if store == "file":
        from memable._sqlite import schema

        monkeypatch.setattr(schema, "BUSY_TIMEOUT", 0.5)
        path = tmp_path / "memable.db"
        locker = sqlite3.connect(path, isolation_level=None)

        def unlock() -> None:
            if locker.in_transaction:
                locker.execute("ROLLBACK")

        try:
            yield ({"target": path}, {"target": path},
                   lambda: locker.execute("BEGIN IMMEDIATE") and None, unlock)
        finally:
            locker.close()
        return
    from _tcp_proxy import Proxy
    from conftest import POSTGRES_URL

    from memable._postgres.schema import parse

    pg_schema = request.getfixturevalue("pg_schema")
    params = parse(POSTGRES_URL)
    proxy = Proxy((params.get("host", "127.0.0.1"), int(params.get("port", "5432"))))
    through = (f"postgresql://{params.get('user', 'postgres')}@127.0.0.1:{proxy.port}/"
               f"{params.get('dbname', 'test')}")
    try:
        yield ({"target": through, "schema": pg_schema, "lease": 4.0},
               {"target": POSTGRES_URL, "schema": pg_schema}, proxy.drop, proxy.heal)
    finally:
        proxy.close()


@pytest.mark.parametrize("store", ["file", "postgres"])
def test_a_cancelled_run_whose_end_failed_frees_its_slot_at_the_next_look(
    store: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    """A cancelled run ends while the store refuses its writes (a file's write lock held
    past the busy timeout; PostgreSQL unreachable past the lease): its end (the release
    of the instance) is not recorded, and the instance stays cancelled and this live
    engine's, holding the slot of a ``concurrency=1`` queue. Once the store takes writes
    again, the engine's next look lets go of its own cancelled instance that no run here
    has, and the next instance runs."""
    with _end_fails(store, tmp_path, monkeypatch, request) as (opens, reads, block, unblock):
        engine = Engine.open(**opens, poll_interval=0.1)
        reader = build(**reads).engine
        engine.queue("q", concurrency=1)
        entered, gate = threading.Event(), threading.Event()

        def held(ctx: Context, n: int) -> int:
            entered.set()
            assert gate.wait(TIMEOUT)
            return int(ctx.step("s").run(lambda: n))

        engine.register("held", held, queue="q")
        try:
            with engine:
                engine.invoke("held", 1, instance_id="a")
                assert entered.wait(TIMEOUT)
                engine.cancel("held", "a")
                block()
                gate.set()  # the run stops at its step boundary; its end fails
                until(lambda: not access.in_flight(engine), 30)
                # Nothing can let go of it while the store is blocked: it holds the slot.
                assert query(
                    reader, "SELECT status, owner IS NOT NULL FROM memable_instances"
                ) == [("cancelled", 1)]
                unblock()
                assert engine.invoke("held", 2, instance_id="b").result(TIMEOUT) == 2
                assert query(reader, "SELECT owner FROM memable_instances WHERE instance_id = 'a'"
                             ) == [(None,)]
        finally:
            gate.set()
            unblock()
            engine.close()
            reader.close()


if __name__ == "__main__":
    assert sys.argv[1] == "hold"
    _child(sys.argv[2], sys.argv[3])
