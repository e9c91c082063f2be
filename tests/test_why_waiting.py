"""Why is it waiting: ``memable show`` of a queued instance names its queue, priority,
position among the queue's runnable instances and the reason it has not started, judged by
what the live engines declare (stored with their owner rows); on a file and PostgreSQL."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from helpers import cli

from memable import Context, Engine, Queued

TIMEOUT = 10.0


def shown(store: dict[str, Any], workflow: str, instance_id: str) -> tuple[dict[str, Any], str]:
    """``memable show``'s JSON view and its text, of one instance."""
    where = [str(store["target"])]
    schema = ["--schema", store["schema"]] if "schema" in store else []
    as_json = cli("show", *where, workflow, instance_id, "--json", *schema)
    assert as_json.exit_code == 0, as_json.output
    text = cli("show", *where, workflow, instance_id, *schema)
    return json.loads(as_json.stdout), text.stdout


def _declaring(
    open_shared: Callable[..., Engine], queue: str, workflow: str, **options: Any
) -> Engine:
    """An engine on the shared store that declares ``queue`` and registers ``workflow`` on
    it (a workflow that does nothing)."""
    engine = open_shared(**options)
    engine.queue(queue)
    engine.register(workflow, lambda ctx: None, queue=queue)
    return engine


def _enqueue(web: Engine, name: str, instance_id: str, **options: Any) -> None:
    inv = web.invoke(name, instance_id=instance_id, **options)
    assert inv.state == Queued()


def test_a_queue_no_running_engine_consumes_is_named(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """A typo'd queue: the only running engine consumes another one."""
    web = _declaring(open_shared, "emails", "send", queues=())
    other = _declaring(open_shared, "emial", "send")
    with web, other:
        _enqueue(web, "send", "s-1")
        view, text = shown(shared_store, "send", "s-1")
    assert view["queue"] == {
        "name": "emails", "priority": 0, "concurrency_key": None, "position": 1,
        "running": 0, "waiting_because": "no running engine consumes the queue 'emails'",
    }
    assert "queue      emails (priority 0, position 1)" in text.splitlines()
    assert "waiting    no running engine consumes the queue 'emails'" in text.splitlines()


def test_a_consumer_without_the_workflow_is_named(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """An instance waits because the only running engine that consumes its queue does not
    register its workflow, and ``memable show`` says so, naming both."""
    web = _declaring(open_shared, "emails", "send", queues=())
    worker = _declaring(open_shared, "emails", "other")
    with web, worker:
        _enqueue(web, "send", "s-1")
        view, _ = shown(shared_store, "send", "s-1")
    assert view["queue"]["waiting_because"] == (
        "no running engine that consumes the queue 'emails' registers the workflow 'send'"
    )


def test_a_full_queue_says_so_and_gives_each_its_position(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """Concurrency 1 held by a running instance: the others are queue full, in order of
    priority, then of when they became runnable."""
    inside, release = threading.Event(), threading.Event()

    def job(ctx: Context) -> None:
        if ctx.instance_id == "busy":
            ctx.step("hold").run(lambda: (inside.set(), release.wait(TIMEOUT)))

    worker = open_shared()
    worker.queue("q", concurrency=1)
    worker.register("job", job, queue="q")
    try:
        with worker:
            worker.invoke("job", instance_id="busy")
            assert inside.wait(TIMEOUT)
            for instance_id, priority in (("a", 5), ("b", 0), ("c", 5)):
                _enqueue(worker, "job", instance_id, priority=priority)
            places = {i: shown(shared_store, "job", i)[0]["queue"] for i in ("a", "b", "c")}
            release.set()
    finally:
        release.set()
    assert {i: (q["priority"], q["position"]) for i, q in places.items()} == {
        "b": (0, 1), "a": (5, 2), "c": (5, 3),
    }
    assert {q["waiting_because"] for q in places.values()} == {"queue full: 1 of 1 running"}
    assert {q["running"] for q in places.values()} == {1}


def test_a_rate_limit_says_so(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """An instance queued behind a rate limit of one start per 600 s, reached by the one
    before it, is shown waiting because of the rate limit, with the count started and the
    window."""
    worker = open_shared()
    worker.queue("q", rate=(1, 600))
    worker.register("job", lambda ctx: ctx.instance_id, queue="q")
    worker.start()  # closed by the fixture: wait_all would wait out the rate limit
    assert worker.invoke("job", instance_id="first").result(TIMEOUT) == "first"
    _enqueue(worker, "job", "second")
    view, _ = shown(shared_store, "job", "second")
    assert view["queue"]["waiting_because"] == (
        "rate limit: 1 started in the last 600 s (at most 1)")
