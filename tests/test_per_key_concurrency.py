"""Per-key concurrency: ``engine.queue(name, per_key=n)`` and ``invoke(...,
concurrency_key=)``: at most ``n`` instances with one key run at once, across every engine
on the store, while the instances of other keys (and those without a key) run; the claim,
its validation, ``memable queues``, ``memable show`` and the dashboard. On an in-memory
store, a file and PostgreSQL, and with real ``memable worker`` processes.

"Stays queued" is judged after the consuming engine's queue thread has looked at the store
(``Looks`` counts its claims), never after a sleep.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from itertools import combinations, pairwise
from pathlib import Path
from typing import Any

import pytest
from conftest import POSTGRES_URL
from helpers import Looks, cli, query, runner_of, store_of
from werkzeug.test import Client

from memable import Context, Engine, Queued
from memable.web import app

TIMEOUT = 10.0
TESTS = Path(__file__).resolve().parent


class Held:
    """A workflow whose step records each start and end, in order, and holds the runs of
    the instances ``hold`` names until ``release``."""

    def __init__(self, *hold: str) -> None:
        self._lock = threading.Lock()
        self.events: list[str] = []
        self.entered = {i: threading.Event() for i in hold}
        self.release = threading.Event()

    def __call__(self, ctx: Context, n: int) -> int:
        def work() -> int:
            with self._lock:
                self.events.append(f"start {ctx.instance_id}")
            if ctx.instance_id in self.entered:
                self.entered[ctx.instance_id].set()
                assert self.release.wait(TIMEOUT)
            with self._lock:
                self.events.append(f"end {ctx.instance_id}")
            return n

        return int(ctx.step("work").run(work))


def _consumer(make: Callable[..., Engine], held: Held, **limits: Any) -> Engine:
    engine = make(poll_interval=0.05)
    engine.queue("q", **limits)
    engine.register("held", held, queue="q")
    return engine


def _invoke(engine: Engine, instance_id: str, key: str | None, **options: Any) -> Any:
    return engine.invoke("held", 0, instance_id=instance_id, concurrency_key=key, **options)


# ---------------------------------------------------------------------- the engine


def test_a_key_at_its_limit_waits_while_the_other_keys_run(
    make_engine: Callable[..., Engine],
) -> None:
    """per_key=1: while a-1 runs, a-2 (queued before the b's) stays queued and b-1, b-2
    run; once a-1 ends, a-2 starts."""
    held = Held("a-1")
    engine = _consumer(make_engine, held, per_key=1)
    looks = Looks(engine)
    with engine:
        first = _invoke(engine, "a-1", "a")
        assert held.entered["a-1"].wait(TIMEOUT)
        second = _invoke(engine, "a-2", "a")
        others = [_invoke(engine, f"b-{n}", "b") for n in (1, 2)]
        assert [inv.result(TIMEOUT) for inv in others] == [0, 0]
        looks.twice_more()
        assert second.state == Queued()
        held.release.set()
        assert (first.result(TIMEOUT), second.result(TIMEOUT)) == (0, 0)
    events = held.events
    assert events.index("start a-2") > events.index("end a-1")
    assert events.index("end b-2") < events.index("end a-1")


def test_a_limit_above_one_lets_that_many_of_a_key_run_together(
    make_engine: Callable[..., Engine],
) -> None:
    """per_key=2: a-1 and a-2 run together (each held), a-3 waits for one of them."""
    held = Held("a-1", "a-2")
    engine = _consumer(make_engine, held, per_key=2)
    looks = Looks(engine)
    with engine:
        invs = [_invoke(engine, f"a-{n}", "a") for n in (1, 2, 3)]
        assert all(held.entered[i].wait(TIMEOUT) for i in ("a-1", "a-2"))
        looks.twice_more()
        assert invs[2].state == Queued()
        held.release.set()
        assert [inv.result(TIMEOUT) for inv in invs] == [0, 0, 0]
    assert held.events.index("start a-3") > min(
        held.events.index("end a-1"), held.events.index("end a-2"))


def test_instances_without_a_key_are_not_limited_by_it(
    make_engine: Callable[..., Engine],
) -> None:
    """Two instances without a key run at once (each waits to see the other) beside a
    keyed one that holds its key's only slot."""
    held = Held("a-1")
    both = threading.Barrier(2, timeout=TIMEOUT)
    engine = make_engine(poll_interval=0.05)
    engine.queue("q", per_key=1)
    engine.register("held", held, queue="q")
    engine.register("together", lambda ctx: both.wait() >= 0, queue="q")
    with engine:
        first = _invoke(engine, "a-1", "a")
        assert held.entered["a-1"].wait(TIMEOUT)
        free = [engine.invoke("together", instance_id=f"n-{n}") for n in (1, 2)]
        assert [inv.result(TIMEOUT) for inv in free] == [True, True]
        held.release.set()
        assert first.result(TIMEOUT) == 0


def test_a_saturated_key_at_the_head_of_the_queue_does_not_hold_up_the_others(
    make_engine: Callable[..., Engine],
) -> None:
    """concurrency=3, per_key=1, a-1 running: a-2 and a-3 first in the queue (priority -5)
    stay queued; b-1 and c-1 behind them run. Released, the a's run in their order."""
    held = Held("a-1")
    engine = _consumer(make_engine, held, concurrency=3, per_key=1)
    looks = Looks(engine)
    with engine:
        first = _invoke(engine, "a-1", "a")
        assert held.entered["a-1"].wait(TIMEOUT)
        heads = [_invoke(engine, f"a-{n}", "a", priority=-5) for n in (2, 3)]
        others = [_invoke(engine, "b-1", "b"), _invoke(engine, "c-1", "c", priority=5)]
        assert [inv.result(TIMEOUT) for inv in others] == [0, 0]
        looks.twice_more()
        assert [inv.state for inv in heads] == [Queued(), Queued()]
        held.release.set()
        assert [inv.result(TIMEOUT) for inv in [first, *heads]] == [0, 0, 0]
    events = held.events
    assert events.index("end a-1") < events.index("start a-2") < events.index("end a-2") \
        < events.index("start a-3")


def test_a_cancelled_run_holds_its_keys_slot_until_it_has_stopped(
    make_engine: Callable[..., Engine],
) -> None:
    """a-1 cancelled while its step runs: a-2 stays queued (b-1 runs) until that step
    returns and the run lets go of the instance."""
    held = Held("a-1")
    engine = _consumer(make_engine, held, per_key=1)
    looks = Looks(engine)
    with engine:
        first = _invoke(engine, "a-1", "a")
        assert held.entered["a-1"].wait(TIMEOUT)
        engine.cancel("held", "a-1")
        second = _invoke(engine, "a-2", "a")
        assert _invoke(engine, "b-1", "b").result(TIMEOUT) == 0
        looks.twice_more()
        assert query(engine, "SELECT status FROM memable_instances WHERE instance_id = 'a-1'") == [
            ("cancelled",)]
        assert second.state == Queued()
        held.release.set()
        assert second.result(TIMEOUT) == 0
        assert str(first.state) == "cancelled"
    assert held.events.index("start a-2") > held.events.index("end a-1")


def test_one_claim_counts_what_it_took_and_skips_past_a_full_key(
    make_engine: Callable[..., Engine],
) -> None:
    """The store's claim, called once with room for all: per_key=2 takes the first two of
    key a (of four, first in the queue), both of b and those without a key, in the
    queue's order; a second claim takes nothing more.

    The test claims in the engine's name, as its queue thread would, so it says so
    (``start_made``): else the engine's poll finds instances owned here and not running and
    runs them again as lost. One poll is let in after the first claim."""
    engine = make_engine(queues=(), poll_interval=0.01)  # enqueues only: the test claims
    engine.queue("q", per_key=2)
    engine.register("held", Held(), queue="q")
    polls = Looks(engine, "look_around")

    def claims() -> list[Any]:  # made ours, run by nobody: the poll leaves them be
        with engine:
            for i in range(4):
                _invoke(engine, f"a-{i}", "a", priority=-1)
            for i in range(2):
                _invoke(engine, f"b-{i}", "b")
                _invoke(engine, f"n-{i}", None)

            def claim(batch: int) -> list[str]:
                claimed = store_of(engine).claim_queued(
                    "q", ["held"], concurrency=None, per_process=None, rate=None,
                    clock=lambda: 0.0, at=1767225600.0, batch=batch, per_key=2,
                )
                return [s.instance.instance_id for s in claimed.snapshots]

            assert claim(3) == ["a-0", "a-1", "b-0"]
            polls.twice_more()
            assert claim(64) == ["n-0", "b-1", "n-1"]
            assert claim(64) == []
            assert {i: str(engine.invocation("held", i).state) for i in ("a-2", "a-3")} == {
                "a-2": "queued", "a-3": "queued"}
        return []

    runner_of(engine).start_made(claims)


def test_a_key_on_a_queue_without_per_key_is_refused_and_nothing_stored(
    make_engine: Callable[..., Engine],
) -> None:
    """A ``concurrency_key`` is refused with a ``ValueError`` saying why when the workflow's
    queue has no ``per_key`` or the workflow has no queue, and with a ``TypeError`` when it
    is empty or not a str; no instance is stored."""
    engine = make_engine()
    engine.queue("q", concurrency=2)
    engine.register("held", Held(), queue="q")
    engine.register("here", lambda ctx: None)
    with engine:
        with pytest.raises(ValueError, match="concurrency_key 'tenant-1'") as refused:
            _invoke(engine, "x-1", "tenant-1")
        assert str(refused.value) == (
            "concurrency_key 'tenant-1' of workflow 'held' instance 'x-1' needs a queue "
            "declared with per_key (engine.queue(name, per_key=n)); queue 'q' has no per_key")
        with pytest.raises(ValueError, match=r"'here' instance 'x-2' .* it has no queue"):
            engine.invoke("here", instance_id="x-2", concurrency_key="tenant-1")
        for bad in ("", 5):
            with pytest.raises(TypeError, match=r"concurrency_key .* non-empty str"):
                _invoke(engine, "x-3", bad)  # type: ignore[arg-type]
        assert query(engine, "SELECT count(*) FROM memable_instances") == [(0,)]


@pytest.mark.parametrize("per_key", [0, -1, 1.5, True, "2"])
def test_a_bad_per_key_is_refused(engine: Engine, per_key: Any) -> None:
    """``engine.queue(per_key=...)`` refuses zero, a negative number, a float, a bool and a
    string."""
    with pytest.raises(ValueError, match=f"per_key is a positive int or None, not {per_key!r}"):
        engine.queue("q", per_key=per_key)


# ---------------------------------------------------------------------- what operators see


def _ok(store: dict[str, Any], *args: str) -> str:
    command, *rest = args
    schema = ["--schema", store["schema"]] if "schema" in store else []
    result = cli(command, str(store["target"]), *rest, *schema)
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    return result.stdout


def test_memable_queues_and_show_give_the_key_and_its_limit(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """``memable queues`` lists per_key with the other limits; ``memable show`` of an
    instance whose key is at its limit names the key and says so; the dashboard too."""
    held = Held("a-1")
    worker = _consumer(open_shared, held, concurrency=4, per_key=1)
    looks = Looks(worker)
    with worker:
        first = _invoke(worker, "a-1", "acme")
        assert held.entered["a-1"].wait(TIMEOUT)
        _invoke(worker, "a-2", "acme")
        looks.twice_more()
        [listed] = json.loads(_ok(shared_store, "queues", "--json"))
        table = _ok(shared_store, "queues")
        view = json.loads(_ok(shared_store, "show", "held", "a-2", "--json"))
        text = _ok(shared_store, "show", "held", "a-2").splitlines()
        client = Client(app(worker))
        overview, detail = client.get("/").text, client.get("/instance?workflow=held&id=a-2").text
        held.release.set()
        assert first.result(TIMEOUT) == 0
    assert listed["limits"] == {"concurrency": 4, "per_process": None, "rate": None,
                                "per_key": 1}
    assert (listed["queued"], listed["running"]) == (1, 1)
    assert "concurrency 4, 1 per key" in table
    why = "concurrency key 'acme' at its limit: 1 of 1 running"
    assert view["queue"] == {"name": "q", "priority": 0, "concurrency_key": "acme",
                             "position": 1, "running": 1, "waiting_because": why}
    assert "queue      q (priority 0, concurrency key 'acme', position 1)" in text
    assert f"waiting    {why}" in text
    assert "concurrency 4, 1 per key" in overview
    assert "concurrency key acme" in detail
    assert why.replace("'", "&#39;") in detail


# ---------------------------------------------------------------------- processes

KEYS = ("a", "b", "c")
EACH = 6
WORKERS = 4


@pytest.fixture(params=["file", "postgres"])
def per_key_store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The environment that points ``_per_key_app`` at a file or a PostgreSQL schema."""
    if request.param == "file":
        return {"MEMABLE_PERKEY_DB": str(tmp_path / "db"), "MEMABLE_PERKEY_SCHEMA": ""}
    return {"MEMABLE_PERKEY_DB": POSTGRES_URL,
            "MEMABLE_PERKEY_SCHEMA": request.getfixturevalue("pg_schema")}


@pytest.mark.heavy
def test_worker_processes_never_run_two_of_one_key_at_once(
    per_key_store: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Four ``memable worker`` processes (per_key=1, per_process=1, concurrency=6) consume
    six instances of each of three keys, queued key by key (all a's first). Each run
    records its start and end and, in between, waits to see a run of another key in
    progress (or none left): no two runs of one key overlap, runs of different keys do,
    and they ran in several workers."""
    records = tmp_path / "records.db"
    env = {**os.environ, **per_key_store, "MEMABLE_PERKEY_RECORDS": str(records),
           "MEMABLE_PERKEY_EACH": str(EACH), "MEMABLE_PERKEY_KEYS": str(len(KEYS)),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(TESTS))
    from _per_key_app import create_records, make

    create_records(str(records))
    web = make(queues=())  # enqueues only, like a web process
    web.start()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        invs = [web.invoke("job", key, instance_id=f"{key}-{n}", concurrency_key=key)
                for key in KEYS for n in range(EACH)]
        workers = [
            subprocess.Popen([sys.executable, "-m", "memable", "worker", "_per_key_app:engine"],
                             cwd=TESTS, env=env, stderr=subprocess.DEVNULL)
            for _ in range(WORKERS)
        ]
        assert [inv.result(90) for inv in invs] == [key for key in KEYS for _ in range(EACH)]
    finally:
        for proc in workers:
            proc.send_signal(signal.SIGTERM)
        for proc in workers:
            proc.wait(timeout=60)
        web.close()
    conn = sqlite3.connect(records)
    try:
        events = conn.execute("SELECT seq, instance, key, kind, pid FROM events").fetchall()
    finally:
        conn.close()
    assert [e for e in events if e[3] == "gave-up"] == []
    runs: dict[str, dict[str, Any]] = {}
    for seq, instance, key, kind, pid in events:
        runs.setdefault(instance, {"key": key, "pid": pid})[kind] = seq
    assert sorted(runs) == sorted(inv.instance_id for inv in invs)  # each ran once
    spans = sorted((r["start"], r["end"], r["key"]) for r in runs.values())
    for key in KEYS:
        mine = [(start, end) for start, end, k in spans if k == key]
        overlapping = [(x, y) for x, y in pairwise(mine) if y[0] < x[1]]
        assert overlapping == [], f"runs of key {key!r} overlapped"
    assert any(a[2] != b[2] and b[0] < a[1] for a, b in combinations(spans, 2)), spans
    pids = {r["pid"] for r in runs.values()}
    assert pids <= {proc.pid for proc in workers}
    assert len(pids) >= 2
