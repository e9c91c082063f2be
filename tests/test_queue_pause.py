"""Pausing a queue: ``engine.pause_queue``/``resume_queue``, ``memable queue pause|resume``,
``memable queues``, ``memable show``'s reason, and the dashboard's form and gauge.

A paused queue is stored as paused and seen by every engine on the store: invokes
onto it are stored queued, runs in flight finish, and nothing of it starts until it
is resumed. "Nothing starts" is judged after the consuming engine's queue thread has
looked at the store (``Looks`` counts its claims), never after a sleep. On an
in-memory store, a file and PostgreSQL, and with a real ``memable worker`` process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import POSTGRES_URL
from helpers import Looks, build, cli, query, store_of
from werkzeug.test import Client, TestResponse

from memable import Context, Engine, Queued
from memable.web import app

TIMEOUT = 10.0
TESTS = Path(__file__).resolve().parent


def _states(engine: Engine, workflow: str, ids: list[str]) -> list[str]:
    return [str(engine.invocation(workflow, i).state) for i in ids]


def _consumer(make: Callable[..., Engine], ran: list[int], **options: Any) -> Engine:
    """An engine that consumes the queue ``q`` (one at a time) and runs ``job``, noting
    each input in ``ran``."""
    engine = make(**{"poll_interval": 0.05, **options})
    engine.queue("q", concurrency=1)
    engine.register("job", lambda ctx, n: ran.append(n) or n, queue="q")
    return engine


# ---------------------------------------------------------------------- the engine


def test_a_paused_queue_accepts_invokes_and_starts_nothing_until_resumed(
    make_engine: Callable[..., Engine],
) -> None:
    """Invokes onto a paused queue are stored queued; the queue thread looks and takes
    none; resumed, they run in the queue's order (priority, then time queued)."""
    ran: list[int] = []
    engine = _consumer(make_engine, ran)
    looks = Looks(engine)
    with engine:
        engine.pause_queue("q")
        ids = []
        for n, priority in ((1, 5), (2, 0), (3, 5), (4, -1)):
            ids.append(engine.invoke("job", n, instance_id=f"j{n}", priority=priority)
                       .instance_id)
        looks.twice_more()
        assert _states(engine, "job", ids) == ["queued"] * 4
        assert ran == []
        engine.resume_queue("q")
        assert [engine.invocation("job", i).result(TIMEOUT) for i in ids] == [1, 2, 3, 4]
    assert ran == [4, 2, 1, 3]


def test_a_run_in_flight_when_the_queue_is_paused_finishes(
    make_engine: Callable[..., Engine],
) -> None:
    """A run in flight (held on an event) when its queue is paused finishes; an instance
    invoked after the pause stays queued while the queue thread looks twice, and runs once
    the queue is resumed."""
    entered, release = threading.Event(), threading.Event()
    ran: list[str] = []

    def held(ctx: Context, n: int) -> int:
        ran.append(ctx.instance_id)
        if n == 0:
            entered.set()
            assert release.wait(TIMEOUT)
        return n

    engine = make_engine(poll_interval=0.05)
    engine.queue("q")
    engine.register("held", held, queue="q")
    looks = Looks(engine)
    with engine:
        first = engine.invoke("held", 0, instance_id="in-flight")
        assert entered.wait(TIMEOUT)
        engine.pause_queue("q")
        later = engine.invoke("held", 1, instance_id="later")
        release.set()
        assert first.result(TIMEOUT) == 0  # the run in flight finishes
        looks.twice_more()
        assert later.state == Queued()
        assert ran == ["in-flight"]
        engine.resume_queue("q")
        assert later.result(TIMEOUT) == 1
    assert ran == ["in-flight", "later"]


def test_pausing_twice_and_resuming_a_running_queue_change_nothing(
    make_engine: Callable[..., Engine],
) -> None:
    """Resuming a queue that is not paused does nothing, pausing it twice stores one pause,
    and after the resume a job runs as before."""
    ran: list[int] = []
    engine = _consumer(make_engine, ran)
    with engine:
        engine.resume_queue("q")  # not paused: nothing to do
        engine.pause_queue("q")
        engine.pause_queue("q")
        assert store_of(engine).paused_queues().keys() == {"q"}
        engine.resume_queue("q")
        assert store_of(engine).paused_queues() == {}
        assert engine.invoke("job", 7).result(TIMEOUT) == 7


def test_a_queue_this_engine_does_not_declare_is_refused(
    make_engine: Callable[..., Engine],
) -> None:
    """``pause_queue`` and ``resume_queue`` refuse a queue this engine does not declare and
    store nothing; a declared queue can be paused before the engine starts."""
    engine = make_engine()
    engine.queue("emails")
    for act in (engine.pause_queue, engine.resume_queue):
        with pytest.raises(ValueError, match="queue 'emial' is not declared"):
            act("emial")
    assert store_of(engine).paused_queues() == {}
    engine.pause_queue("emails")  # before start: the store is open already
    assert list(store_of(engine).paused_queues()) == ["emails"]


def test_wait_all_does_not_wait_for_a_paused_queue(make_engine: Callable[..., Engine]) -> None:
    """Its instances cannot start: wait_all returns, and they stay queued in the store."""
    ran: list[int] = []
    engine = _consumer(make_engine, ran)
    engine.start()
    engine.pause_queue("q")
    inv = engine.invoke("job", 1, instance_id="stays")
    waiting = threading.Thread(target=engine.wait_all, daemon=True)
    waiting.start()
    waiting.join(TIMEOUT)
    assert not waiting.is_alive()
    assert inv.state == Queued()
    assert ran == []


def test_another_engine_on_the_store_sees_the_pause(
    open_shared: Callable[..., Engine],
) -> None:
    """A web engine (it consumes nothing) pauses the queue a worker engine consumes: the
    worker looks and starts nothing; the web engine resumes it, and the worker runs all."""
    ran: list[int] = []
    web = open_shared(queues=())
    web.queue("q", concurrency=1)
    web.register("job", lambda ctx, n: n, queue="q")
    worker = _consumer(open_shared, ran)
    looks = Looks(worker)
    with web, worker:
        web.pause_queue("q")
        ids = [web.invoke("job", n, instance_id=f"w{n}").instance_id for n in range(3)]
        looks.twice_more()
        assert _states(web, "job", ids) == ["queued"] * 3
        assert ran == []
        web.resume_queue("q")
        assert [web.invocation("job", i).result(TIMEOUT) for i in ids] == [0, 1, 2]
    assert ran == [0, 1, 2]


def test_on_postgresql_a_resume_wakes_the_consumers_at_once(pg_schema: str) -> None:
    """The worker polls once a minute: only the resume's NOTIFY can start its run within
    the test's timeout."""
    ran: list[int] = []
    target = {"target": POSTGRES_URL, "schema": pg_schema}
    web = Engine.open(**target, queues=())  # type: ignore[arg-type]
    web.queue("q", concurrency=1)
    web.register("job", lambda ctx, n: n, queue="q")
    worker = _consumer(lambda **o: build(**target, **o).engine, ran, poll_interval=60)
    looks = Looks(worker)
    with web, worker:
        # The worker hears notices once its LISTEN is up (it heard its own probe): a
        # notice sent before that is lost, and only its minute-long poll would look.
        listener = store_of(worker)._listener  # type: ignore[attr-defined]
        assert listener is not None
        assert listener.heard.wait(TIMEOUT)
        web.pause_queue("q")
        with looks._changed:
            seen = looks.count  # before the invoke: the look its notice causes counts
        inv = web.invoke("job", 5, instance_id="notified")  # its NOTIFY kicks the worker
        with looks._changed:
            assert looks._changed.wait_for(lambda: looks.count > seen, TIMEOUT)
        assert inv.state == Queued()
        web.resume_queue("q")
        assert inv.result(TIMEOUT) == 5
    assert ran == [5]


def test_a_pause_is_stored_and_outlives_the_engine(shared_store: dict[str, Any]) -> None:
    """A pause made by an engine that then closes is stored: a new engine on the same store
    keeps the queue's instances queued, ``memable queues --json`` lists it paused with one
    queued, and it runs them once resumed."""
    first = Engine.open(**shared_store)
    first.queue("q")
    first.pause_queue("q")
    first.close()
    ran: list[int] = []
    again = _consumer(lambda **o: build(**shared_store, **o).engine, ran)
    looks = Looks(again)
    with again:
        inv = again.invoke("job", 3, instance_id="after-reopen")
        looks.twice_more()
        assert inv.state == Queued()
        [listed] = json.loads(_ok(shared_store, "queues", "--json"))
        assert (listed["name"], listed["paused"], listed["queued"]) == ("q", True, 1)
        again.resume_queue("q")
        assert inv.result(TIMEOUT) == 3
    assert ran == [3]


# ---------------------------------------------------------------------- the command line


def _args(store: dict[str, Any], *args: str) -> list[str]:
    """``args`` with the store's target after the command (and its --schema)."""
    command, *rest = args
    sub = [command, rest.pop(0)] if command == "queue" else [command]
    schema = ["--schema", store["schema"]] if "schema" in store else []
    return [*sub, str(store["target"]), *rest, *schema]


def _ok(store: dict[str, Any], *args: str) -> str:
    result = cli(*_args(store, *args))
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    return result.stdout


def _refused(store: dict[str, Any], *args: str) -> str:
    result = cli(*_args(store, *args))
    assert (result.exit_code, result.stdout) == (2, ""), result.output
    assert result.stderr.startswith("memable: error: ")
    assert result.stderr.count("\n") == 1
    return result.stderr.removeprefix("memable: error: ").rstrip("\n")


def test_memable_queue_pause_and_resume_act_on_the_engines_of_the_store(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """``memable queue pause`` stops a running engine on the store starting the queue's
    instances and ``memable queue resume`` lets it start them; each says what it did, and
    says so when there was nothing to do."""
    ran: list[int] = []
    worker = _consumer(open_shared, ran)
    looks = Looks(worker)
    with worker:
        assert _ok(shared_store, "queue", "pause", "q") == (
            "queue q paused: no engine starts another of its instances until "
            "'memable queue resume' (runs in flight finish)\n")
        assert _ok(shared_store, "queue", "pause", "q") == "queue q is paused already\n"
        inv = worker.invoke("job", 1, instance_id="c-1")
        looks.twice_more()
        assert inv.state == Queued()
        assert ran == []
        said = _ok(shared_store, "queue", "resume", "q")
        assert said.startswith("queue q resumed: the engines that consume it start")
        assert inv.result(TIMEOUT) == 1
        assert _ok(shared_store, "queue", "resume", "q") == (
            "queue q is not paused: nothing to resume\n")
    assert ran == [1]


def test_memable_queues_lists_queued_running_paused_and_limits(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """Queues known from instances (``old``, no engine consumes it), from a live
    engine's declaration (``q``, with its limits) and from a pause."""
    entered, release = threading.Event(), threading.Event()

    def held(ctx: Context) -> None:
        entered.set()
        assert release.wait(TIMEOUT)

    web = open_shared(queues=())
    web.queue("old")
    web.register("ignored", lambda ctx: None, queue="old")
    worker = open_shared(poll_interval=0.05)
    worker.queue("q", concurrency=2, per_process=1, rate=(10, 60.0))
    worker.register("held", held, queue="q")
    with web, worker:
        web.invoke("ignored", instance_id="o-1")
        worker.invoke("held", instance_id="h-1")
        assert entered.wait(TIMEOUT)
        worker.pause_queue("q")
        worker.invoke("held", instance_id="h-2")
        found = json.loads(_ok(shared_store, "queues", "--json"))
        table = _ok(shared_store, "queues").splitlines()
        release.set()
    assert [q["name"] for q in found] == ["old", "q"]
    old, paused = found
    assert old == {"name": "old", "queued": 1, "running": 0,
                   "oldest_queued_at": old["oldest_queued_at"], "paused": False,
                   "paused_at": None, "limits": None, "engines": 0}
    assert old["oldest_queued_at"] is not None
    assert (paused["queued"], paused["running"], paused["paused"], paused["engines"]) == (
        1, 1, True, 1)
    assert paused["limits"] == {"concurrency": 2, "per_process": 1, "rate": [10, 60.0],
                                "per_key": None}
    assert paused["paused_at"] is not None
    header, *rows = table
    assert header.split() == ["QUEUE", "QUEUED", "RUNNING", "PAUSED", "OLDEST", "LIMITS",
                              "ENGINES"]
    cells = [row.split("  ") for row in rows]
    cells = [[c.strip() for c in row if c.strip()] for row in cells]
    assert cells[0][:4] == ["old", "1", "0", "no"]
    assert cells[0][5:] == ["no running engine consumes it", "0"]
    assert cells[1][:3] == ["q", "1", "1"]
    assert cells[1][3].startswith("since ")
    assert cells[1][5:] == ["concurrency 2, 1 per process, rate 10 per 60 s", "1"]


def test_memable_queues_of_a_store_without_queues_says_so(
    shared_store: dict[str, Any],
) -> None:
    """``memable queues`` on a store with no queue says there are none, and ``--json`` gives
    an empty list."""
    Engine.open(**shared_store).close()
    assert _ok(shared_store, "queues") == (
        "no queues: no instance is on one, no running engine consumes one, and none is "
        "paused\n")
    assert json.loads(_ok(shared_store, "queues", "--json")) == []


def test_a_queue_the_store_does_not_know_is_refused_with_the_closest_name(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """``memable queue pause`` and ``resume`` of a queue the store does not know are refused
    suggesting the closest known name, and pause nothing."""
    web = open_shared(queues=())
    web.queue("emails")
    web.register("send", lambda ctx: None, queue="emails")
    with web:
        web.invoke("send")
        for verb in ("pause", "resume"):
            assert _refused(shared_store, "queue", verb, "emial") == (
                "the store knows no queue 'emial' (no instance is on it, no running engine "
                "consumes it); did you mean 'emails'?")
        assert store_of(web).paused_queues() == {}


def test_the_queue_commands_refuse_a_missing_file(tmp_path: Path) -> None:
    """``memable queues`` and ``memable queue pause|resume`` on a missing file exit 2 naming
    it and create no file."""
    missing = tmp_path / "nothing.db"
    for args in (["queues", missing], ["queue", "pause", missing, "q"],
                 ["queue", "resume", missing, "q"]):
        result = cli(*args)
        assert (result.exit_code, result.stderr) == (
            2, f"memable: error: no such file: {missing}\n")
    assert list(tmp_path.iterdir()) == []


def test_show_of_a_queued_instance_of_a_paused_queue_says_paused(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """``memable show`` of an instance queued on a paused queue gives the pause, since when,
    as the reason it waits, in text and in ``--json``."""
    web = open_shared(queues=())
    web.queue("emails")
    web.register("send", lambda ctx: None, queue="emails")
    with web:
        web.pause_queue("emails")
        web.invoke("send", instance_id="s-1")
        view = json.loads(_ok(shared_store, "show", "send", "s-1", "--json"))
        text = _ok(shared_store, "show", "send", "s-1").splitlines()
        [paused_at] = store_of(web).paused_queues().values()
    why = f"queue paused since {paused_at}: nothing of it starts until it is resumed"
    assert view["queue"] == {"name": "emails", "priority": 0, "concurrency_key": None,
                             "position": 1, "running": 0, "waiting_because": why}
    assert f"waiting    {why}" in text


# ---------------------------------------------------------------------- the dashboard


def _csrf(page: TestResponse) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found is not None, "the page has no form with a CSRF token"
    return found.group(1)


def _queue_row(page: TestResponse, name: str) -> list[str]:
    """The text of each cell of the row of queue ``name`` in the overview's table."""
    body = page.text.split('id="queues"')[1].split("</table>")[0]
    for row in re.findall(r"<tr>(.*?)</tr>", body, re.S):
        cells = [re.sub(r"<[^>]+>", "", cell).strip()
                 for cell in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        if cells and cells[0] == name:
            return [re.sub(r"\s+", " ", cell) for cell in cells]
    raise AssertionError(f"no queue {name}")


def _gauge(client: Client, queue: str) -> str:
    metrics = client.get("/metrics").text
    [line] = [m for m in metrics.splitlines()
              if m.startswith(f'memable_queue_paused{{queue="{queue}"}}')]
    return line.rsplit(" ", 1)[1]


@pytest.fixture
def consuming(make_engine: Callable[..., Engine]) -> Iterator[tuple[Engine, list[int]]]:
    ran: list[int] = []
    engine = _consumer(make_engine, ran)
    with engine:
        yield engine, ran


def test_the_dashboard_pauses_and_resumes_a_queue(
    consuming: tuple[Engine, list[int]],
) -> None:
    """The dashboard with actions allowed pauses a queue from its form (the row says since
    when, the ``memable_queue_paused`` gauge reads 1, a new instance stays queued) and
    resumes it (the instance runs, the gauge reads 0)."""
    engine, ran = consuming
    looks = Looks(engine)
    client = Client(app(engine, allow_actions=True))
    assert engine.invoke("job", 0).result(TIMEOUT) == 0  # the queue is known
    page = client.get("/")
    assert _queue_row(page, "q")[6:] == ["no", "Pause"]
    assert _gauge(client, "q") == "0"

    paused = client.post("/queue/pause", data={"csrf": _csrf(page), "queue": "q"})
    assert paused.status_code == 303
    assert paused.headers["Location"].endswith("/?done=pause-queue#queues")
    page = client.get("/?done=pause-queue")
    assert "Queue paused" in page.text
    row = _queue_row(page, "q")
    assert re.fullmatch(r"paused since \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", row[6]), row
    assert row[7] == "Resume"
    assert _gauge(client, "q") == "1"
    inv = engine.invoke("job", 1, instance_id="waits")
    looks.twice_more()
    assert inv.state == Queued()

    resumed = client.post("/queue/resume", data={"csrf": _csrf(page), "queue": "q"})
    assert resumed.status_code == 303
    assert inv.result(TIMEOUT) == 1
    assert _queue_row(client.get("/"), "q")[6:] == ["no", "Pause"]
    assert _gauge(client, "q") == "0"
    assert ran == [0, 1]


def test_a_read_only_dashboard_shows_no_form_and_refuses_to_pause(
    consuming: tuple[Engine, list[int]],
) -> None:
    """A read-only dashboard shows no pause form and answers 403 to a pause or resume post,
    even with a valid CSRF token; nothing is paused."""
    engine, _ = consuming
    engine.invoke("job", 0).result(TIMEOUT)
    client = Client(app(engine))
    page = client.get("/")
    assert _queue_row(page, "q")[6:] == ["no"]
    assert '<form method="post"' not in page.text
    csrf = client.get_cookie("memable_csrf")
    assert csrf is not None
    for path in ("/queue/pause", "/queue/resume"):
        refused = client.post(path, data={"csrf": csrf.value, "queue": "q"})
        assert refused.status_code == 403
        assert "read-only" in refused.text
    assert store_of(engine).paused_queues() == {}


def test_the_dashboard_refuses_a_bad_pause_and_changes_nothing(
    consuming: tuple[Engine, list[int]],
) -> None:
    """The dashboard refuses a pause without or with a forged CSRF token (403), of an
    unknown queue (404), without a queue (400) and by GET (405), and pauses nothing."""
    engine, _ = consuming
    engine.invoke("job", 0).result(TIMEOUT)
    client = Client(app(engine, allow_actions=True))
    page = client.get("/")
    token = _csrf(page)
    assert client.post("/queue/pause", data={"queue": "q"}).status_code == 403  # no CSRF
    assert client.post("/queue/pause", data={"csrf": "forged", "queue": "q"}
                       ).status_code == 403
    unknown = client.post("/queue/pause", data={"csrf": token, "queue": "emial"})
    assert unknown.status_code == 404
    assert "the store knows no queue &#39;emial&#39;" in unknown.text
    assert client.post("/queue/pause", data={"csrf": token}).status_code == 400
    assert client.get("/queue/pause").status_code == 405
    assert store_of(engine).paused_queues() == {}


# ---------------------------------------------------------------------- processes


@pytest.fixture(params=["file", "postgres"])
def pause_store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, str]:
    """The environment that points ``_pause_app`` at a file or a PostgreSQL schema."""
    if request.param == "file":
        return {"MEMABLE_PAUSE_DB": str(tmp_path / "db"), "MEMABLE_PAUSE_SCHEMA": ""}
    return {"MEMABLE_PAUSE_DB": POSTGRES_URL,
            "MEMABLE_PAUSE_SCHEMA": request.getfixturevalue("pg_schema")}


def test_a_worker_process_starts_nothing_of_a_paused_queue_until_resumed(
    pause_store: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """This process (an enqueue-only engine) pauses ``jobs`` and enqueues five; a
    ``memable worker`` process runs the probes sent after them (each claimed in a look
    that found ``jobs`` paused first) and none of the jobs; ``memable queue resume``
    from here, and the worker runs them all, in the queue's order."""
    log = tmp_path / "log"
    env = {**os.environ, **pause_store, "MEMABLE_PAUSE_LOG": str(log),
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.syspath_prepend(str(TESTS))
    from _pause_app import make

    web = make(lambda *args, **o: build(*args, **o).engine, queues=())
    web.start()
    worker: subprocess.Popen[bytes] | None = None
    try:
        web.pause_queue("jobs")
        ids = [web.invoke("job", n, instance_id=f"j{n}", priority=-n).instance_id
               for n in range(5)]
        worker = subprocess.Popen(
            [sys.executable, "-m", "memable", "worker", "_pause_app:engine"],
            cwd=TESTS, env=env, stderr=subprocess.DEVNULL,
        )
        pids = {web.invoke("probe", instance_id=f"p{i}").result(60) for i in range(2)}
        assert pids == {worker.pid}
        assert _states(web, "job", ids) == ["queued"] * 5
        assert not log.exists()
        [(running,)] = query(web, "SELECT count(*) FROM memable_instances WHERE queue = 'jobs' "
                             "AND status <> 'queued'")
        assert running == 0

        where = [pause_store["MEMABLE_PAUSE_DB"]]
        if pause_store["MEMABLE_PAUSE_SCHEMA"]:
            where += ["--schema", pause_store["MEMABLE_PAUSE_SCHEMA"]]
        resumed = cli("queue", "resume", *where[:1], "jobs", *where[1:])
        assert resumed.exit_code == 0, resumed.output
        assert [web.invocation("job", i).result(60) for i in ids] == list(range(5))
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
        web.close()
    lines = log.read_text().splitlines()
    assert [line.split()[1] for line in lines] == ["j4", "j3", "j2", "j1", "j0"]
    assert {int(line.split()[0]) for line in lines} == {worker.pid}
