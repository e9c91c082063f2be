"""Ownership of instances: an engine that lost its instance is fenced off (its step write,
signal placement or run check raises LostInstance), a step write meeting a stored key, owner
rows, leases and heartbeats, and an invocation that follows the engine that took its instance."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import closing
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from helpers import Built, build, store_of, write

from memable import (
    Completed,
    Context,
    Engine,
    EngineError,
)
from memable._clock import SYSTEM_CLOCK
from memable._engine import access
from memable._store import admin
from memable._store.control import LostInstance
from memable._store.protocol import InstanceRow, StepWrite
from memable._store.rows import UNREACHED


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


@pytest.fixture
def two_engines(tmp_path: Path) -> Iterator[tuple[Built, Built]]:
    """Two engines on one file, not started (neither has an owner row, so either may
    claim), each with its store."""
    a, b = build(tmp_path / "db"), build(tmp_path / "db")
    yield a, b
    a.engine.close()
    b.engine.close()


def _instance(built: Built, instance_id: str) -> None:
    now = _now()
    assert built.store.create_instance(InstanceRow(
        workflow="wf", instance_id=instance_id, status="running", message=None,
        input="null", input_type=None, output=None, output_type=None,
        created_at=now, updated_at=now, completed_at=None,
    ))


def _step(key: str, result: str, kind: str = "step") -> StepWrite:
    return StepWrite(
        workflow="wf", instance_id="i", key=key, seq=0, kind=kind,  # type: ignore[arg-type]
        state="completed", result=result, result_type=None, status=None, error=None,
        at=time.time(), started=time.time(),
    )


def test_a_step_write_of_an_engine_that_lost_its_instance_is_refused(
    two_engines: tuple[Built, Built],
) -> None:
    """B claims the instance A created: A's step write raises LostInstance and stores nothing."""
    a, b = two_engines
    _instance(a, "i")
    a.store.save_step(_step("first", "1"))
    assert b.store.begin_run("wf", "i", now=time.time(), claim="resume") is not None
    with pytest.raises(LostInstance) as lost:
        a.store.save_step(_step("second", "2"))
    assert lost.value.args == ("wf", "i")
    assert a.store.read_step("wf", "i", "second") is None
    b.store.save_step(_step("second", "3"))
    stored = b.store.read_step("wf", "i", "second")
    assert stored is not None
    assert stored.result == "3"


def test_placing_a_signal_is_the_owners_alone(two_engines: tuple[Built, Built]) -> None:
    """A signal stored before the run reached its key waits at UNREACHED; the owner's run
    places it, and once B has claimed the instance A's placement raises LostInstance and
    leaves the row as it was, while B's takes."""
    a, b = two_engines
    _instance(a, "i")
    for key in ("k1", "k2"):
        admin.store_signal(a.store, "wf", "i", key, key, clock=SYSTEM_CLOCK)

    def seqs() -> list[int | None]:
        rows = [b.store.read_step("wf", "i", key) for key in ("k1", "k2")]
        return [None if row is None else row.seq for row in rows]

    a.store.place_signal("wf", "i", "k1", 3)
    assert b.store.begin_run("wf", "i", now=time.time(), claim="resume") is not None
    with pytest.raises(LostInstance):
        a.store.place_signal("wf", "i", "k2", 4)
    assert seqs() == [3, UNREACHED]
    b.store.place_signal("wf", "i", "k2", 4)
    assert seqs() == [3, 4]


def test_a_run_check_by_an_engine_that_lost_its_instance_raises_lost_instance(
    two_engines: tuple[Built, Built],
) -> None:
    """check_run: the owner sees the status; a former owner, or a missing instance, is lost."""
    a, b = two_engines
    _instance(a, "i")
    assert a.store.check_run("wf", "i") == "running"
    assert b.store.begin_run("wf", "i", now=time.time(), claim="resume") is not None
    assert b.store.check_run("wf", "i") == "running"
    a.store.cancel("wf", "i", now=time.time())
    assert b.store.check_run("wf", "i") == "cancelled"
    for store, instance_id in [(a.store, "i"), (b.store, "missing")]:
        with pytest.raises(LostInstance) as lost:
            store.check_run("wf", instance_id)
        assert lost.value.args == ("wf", instance_id)


def test_a_step_write_to_a_key_stored_as_another_kind_is_refused(
    two_engines: tuple[Built, Built],
) -> None:
    """The owner writes a step where a signal is stored: InvalidKey names both kinds."""
    a, _ = two_engines
    _instance(a, "i")
    a.store.save_step(_step("k", "1", kind="signal"))
    with pytest.raises(EngineError) as info:
        a.store.save_step(_step("k", "2"))
    assert type(info.value).__name__ == "InvalidKey"
    assert str(info.value) == (
        "invalid key 'k' (it holds a signal, and the workflow uses it as a step): "
        "workflow 'wf', instance 'i'"
    )
    stored = a.store.read_step("wf", "i", "k")
    assert stored is not None
    assert (stored.kind, stored.result) == ("signal", "1")


def test_a_step_write_to_a_key_completed_meanwhile_leaves_it(
    two_engines: tuple[Built, Built],
) -> None:
    """The owner writes a key completed as the same kind: no error, the first row stands."""
    a, _ = two_engines
    _instance(a, "i")
    a.store.save_step(_step("k", "1"))
    a.store.save_step(_step("k", "2"))
    stored = a.store.read_step("wf", "i", "k")
    assert stored is not None
    assert stored.result == "1"


# ---------------------------------------------------------------------- owner rows and leases


def _owner_row(path: Path, owner: str) -> tuple[Any, ...] | None:
    with closing(sqlite3.connect(path)) as reader:
        return reader.execute(  # type: ignore[no-any-return]
            "SELECT heartbeat, lease, started_at FROM memable_owners WHERE id = ?", (owner,)
        ).fetchone()


def test_a_heartbeat_renews_the_lease_and_brings_back_a_reaped_owner(tmp_path: Path) -> None:
    """heartbeat moves only the heartbeat; an owner row reaped meanwhile is registered again."""
    db = tmp_path / "db"
    engine, store = build(db)
    store.register_owner(30.0, 1000.0)
    first = _owner_row(db, store.owner)
    assert first is not None
    store.heartbeat(1010.0)
    assert _owner_row(db, store.owner) == (1010.0, 30.0, first[2])
    with closing(sqlite3.connect(db)) as writer, writer:
        writer.execute("DELETE FROM memable_owners WHERE id = ?", (store.owner,))
    store.heartbeat(5000.0)
    again = _owner_row(db, store.owner)
    assert again is not None
    assert again[:2] == (5000.0, 30.0)
    assert again[2] != first[2]
    engine.close()


def test_the_steps_in_flight_list_a_run_that_has_not_begun_its_workflow_yet() -> None:
    """A run registered but still claiming its instance has no context yet: the heartbeat's
    list of steps in flight shows it with no step (it raised)."""
    engine, store = build(poll_interval=60, lease=600)
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda: 1))
    claiming, release = threading.Event(), threading.Event()
    real = store.begin_run

    def held(*args: Any, **kwargs: Any) -> Any:
        claiming.set()
        assert release.wait(10)
        return real(*args, **kwargs)

    store.begin_run = held  # type: ignore[method-assign]
    with engine:
        assert isinstance(engine.invoke("wf", instance_id="x").wait(timeout=10), Completed)
        # resume() claims on its caller's thread: call it on a thread of its own.
        resumed: list[Any] = []
        caller = threading.Thread(target=lambda: resumed.append(engine.resume("wf", "x")))
        caller.start()
        try:
            assert claiming.wait(10)
            assert access.in_flight(engine) == [("wf", "x", None, None)]
        finally:
            release.set()
            caller.join(10)
        assert resumed[0].result(timeout=10) == 1
    engine.close()


@pytest.mark.parametrize("lease", ["expired", "current"])
def test_an_owner_elsewhere_is_judged_by_its_lease(tmp_path: Path, lease: str) -> None:
    """An owner on another host is judged by its lease alone.

    Expired, its instance is taken over and run on; current, it is left
    alone however many times the engine looks.
    """
    db = tmp_path / "db"
    ran: list[str] = []

    def wf(ctx: Any) -> str:
        ctx.step("a").run(lambda: ran.append("a") or "a")
        return str(ctx.step("b").run(lambda: ran.append("b") or "b"))

    first = Engine.open(db)
    first.register("wf", wf)
    with first:
        first.invoke("wf", instance_id="x").result(timeout=10)
    first.close()
    heartbeat = 1000.0 if lease == "expired" else time.time()
    with closing(sqlite3.connect(db)) as conn, conn:  # as if it ran on another host
        conn.execute(
            "INSERT INTO memable_owners (id, host, pid, heartbeat, lease, started_at) "
            "VALUES ('ghost', 'another-host', 4242, ?, 600.0, '2026-01-01')",
            (heartbeat,),
        )
        conn.execute(
            "UPDATE memable_instances SET status = 'running', owner = 'ghost', output = NULL")
        conn.execute("DELETE FROM memable_steps WHERE key = 'b'")
    second, store = build(db, poll_interval=0.05)
    second.register("wf", wf)
    looks = threading.Semaphore(0)
    real_look = store.look_around

    def look(*args: Any) -> Any:
        found = real_look(*args)
        looks.release()
        return found

    store.look_around = look  # type: ignore[method-assign]
    with second:
        if lease == "expired":
            assert second.invocation("wf", "x").result(timeout=10) == "b"
        else:
            for _ in range(3):  # three looks at the store, each after the last
                assert looks.acquire(timeout=10)
        owner = store.read_rows("owner", "SELECT owner FROM memable_instances", {})
    second.close()
    if lease == "expired":
        assert ran == ["a", "b", "b"]
    else:
        assert ran == ["a", "b"]
        assert owner == [{"owner": "ghost"}]


@pytest.mark.parametrize("store_target", ["file", "postgres"], indirect=True)
def test_the_invocation_of_a_run_that_lost_its_instance_follows_the_engine_that_took_it(
    make_engine: Callable[..., Engine],
) -> None:
    """A's run is in step a when its lease is made to run out; B takes the instance and runs
    it. A's write is then refused and its run ends, while B still runs: A's Invocation must
    wait for B's end (it returned the running row's state)."""
    a = make_engine(poll_interval=0.05, lease=600)  # A's heartbeat never comes in time
    b = make_engine(poll_interval=0.05)
    in_a, release_a, in_b, release_b = (threading.Event() for _ in range(4))

    def wf_a(ctx: Context) -> str:
        return str(ctx.step("a").run(lambda: in_a.set() or (release_a.wait(10) and "from a")))

    def wf_b(ctx: Context) -> str:
        return str(ctx.step("a").run(lambda: in_b.set() or (release_b.wait(10) and "from b")))

    a.register("wf", wf_a)
    b.register("wf", wf_b)
    a_ended = threading.Event()
    a_store = store_of(a)
    real = a_store.get_instance

    def noting_the_end(*args: Any, **kwargs: Any) -> Any:
        found = real(*args, **kwargs)
        if release_a.is_set():  # the refused run reads the store once it lost the instance
            a_ended.set()
        return found

    a_store.get_instance = noting_the_end  # type: ignore[method-assign]
    with a, b:
        inv = a.invoke("wf", instance_id="x")
        assert in_a.wait(10)
        write(a, "UPDATE memable_owners SET heartbeat = 0 WHERE id = ?", (a_store.owner,))
        assert in_b.wait(10)
        waited: list[Any] = []
        waiter = threading.Thread(target=lambda: waited.append(inv.wait(timeout=20)))
        waiter.start()
        release_a.set()
        assert a_ended.wait(10)
        release_b.set()
        waiter.join(30)
        assert waited == [Completed()]
        assert inv.result(timeout=10) == "from b"
