"""The Django example: its views through the test client, its worker as a process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from django.test import Client, override_settings
from freezegun import freeze_time
from memable import Engine, MetadataStatus, Suspended
from memable.testing import advance, running

from orders.engine import get_engine, open_engine, use_engine
from orders.views import WORKFLOW
from orders.workflows import SUMMARY, Order

HERE = Path(__file__).resolve().parent


def settle(engine: Engine, order_id: str) -> None:
    """Wait until the run a request started has ended (suspended or finished)."""
    engine.invocation(WORKFLOW, order_id).wait(timeout=10)


def test_an_order_waits_for_approval_ships_and_asks_for_a_review_3_days_later(
    client: Client, engine: Engine
) -> None:
    with freeze_time("2026-03-02 09:00:00") as clock:
        started = client.post("/orders", {"item": "tea", "quantity": 2}, "application/json")
        assert started.status_code == 202
        order_id = started.json()["id"]
        assert started["Location"] == f"/orders/{order_id}"
        settle(engine, order_id)

        assert client.get(f"/orders/{order_id}").json() == {
            "id": order_id,
            "state": "suspended",
            "status": "waiting for a manager's approval",
            "steps_done": ["reserve:v1"],
        }

        approved = client.post(
            f"/orders/{order_id}/approve", {"approver": "alice"}, "application/json"
        )
        assert approved.status_code == 202
        settle(engine, order_id)
        shipped = client.get(f"/orders/{order_id}").json()
        assert shipped["state"] == "suspended"
        assert shipped["status"] == "timer review-delay:v1"
        assert shipped["steps_done"] == ["reserve:v1", "approval:v1", "ship:v1"]

        assert advance(engine, clock, timedelta(days=2)) == 0  # not due yet
        advance(engine, clock, timedelta(days=1))
        assert engine.invocation(WORKFLOW, order_id).result(timeout=10) == "parcel-tea-2"

        done = client.get(f"/orders/{order_id}").json()
        assert done["state"] == "completed"
        assert done["result"] == "parcel-tea-2"
        assert done["steps_done"][-2:] == ["review-delay:v1", "review-request:v1"]


def test_an_unknown_order_is_404(client: Client) -> None:
    assert client.get("/orders/no-such-order").status_code == 404
    approve = client.post(
        "/orders/no-such-order/approve", {"approver": "alice"}, "application/json"
    )
    assert approve.status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        "not json",
        ["tea", 2],
        {"quantity": 2},
        {"item": "", "quantity": 2},
        {"item": "tea"},
        {"item": "tea", "quantity": "2"},
        {"item": "tea", "quantity": 0},
        {"item": "tea", "quantity": True},
    ],
)
def test_a_bad_order_is_400_and_starts_nothing(client: Client, engine: Engine, body: Any) -> None:
    response = client.post("/orders", body, "application/json")
    assert response.status_code == 400
    assert "error" in response.json()
    assert engine.list_instances(WORKFLOW) == []


@pytest.mark.parametrize("body", ["", {}, {"approver": ""}, {"approver": 7}])
def test_an_approval_without_an_approver_is_400(client: Client, engine: Engine, body: Any) -> None:
    started = client.post("/orders", {"item": "tea", "quantity": 1}, "application/json")
    order_id = started.json()["id"]
    settle(engine, order_id)
    response = client.post(f"/orders/{order_id}/approve", body, "application/json")
    assert response.status_code == 400
    assert client.get(f"/orders/{order_id}").json()["state"] == "suspended"


def test_a_second_approval_is_409(client: Client, engine: Engine) -> None:
    started = client.post("/orders", {"item": "tea", "quantity": 1}, "application/json")
    order_id = started.json()["id"]
    first = client.post(f"/orders/{order_id}/approve", {"approver": "alice"}, "application/json")
    second = client.post(f"/orders/{order_id}/approve", {"approver": "bob"}, "application/json")
    assert (first.status_code, second.status_code) == (202, 409)
    settle(engine, order_id)
    assert client.get(f"/orders/{order_id}").json()["steps_done"][-1] == "ship:v1"


@pytest.mark.parametrize("key", ["", "_reserved", "a/b", "x" * 65])
def test_a_bad_idempotency_key_is_400(client: Client, engine: Engine, key: str) -> None:
    body, headers = {"item": "tea", "quantity": 1}, {"Idempotency-Key": key}
    response = client.post("/orders", body, "application/json", headers=headers)
    assert response.status_code == 400
    assert engine.list_instances(WORKFLOW) == []


def test_a_retried_request_with_the_same_idempotency_key_starts_one_order(
    client: Client, engine: Engine
) -> None:
    body, headers = {"item": "tea", "quantity": 1}, {"Idempotency-Key": "cart-41"}
    first = client.post("/orders", body, "application/json", headers=headers)
    again = client.post("/orders", body, "application/json", headers=headers)
    assert first.json() == again.json() == {"id": "cart-41"}
    assert [order_id for order_id, _ in engine.list_instances(WORKFLOW)] == ["cart-41"]


def test_the_wrong_method_is_405(client: Client) -> None:
    assert client.get("/orders").status_code == 405
    assert client.get("/orders/x/approve").status_code == 405


def test_the_web_process_opens_its_engine_on_first_use_and_only_enqueues(
    tmp_path: Path,
) -> None:
    """The web engine consumes no queue: an order stays queued until a worker runs it."""
    path = tmp_path / "web.db"
    with override_settings(MEMABLE_DB=str(path)):
        use_engine(None)
        engine = get_engine()
        worker = open_engine()
        try:
            assert get_engine() is engine
            client = Client()
            started = client.post("/orders", {"item": "cups", "quantity": 6}, "application/json")
            assert client.get(started["Location"]).json()["state"] == "queued"
            worker.start()
            settle(engine, started.json()["id"])  # the web engine follows the worker's run
            assert client.get(started["Location"]).json()["state"] == "suspended"
        finally:
            worker.close()
            engine.close()  # what atexit does at the end of a real process
            use_engine(None)
    assert path.exists()


def test_the_daily_summary_runs_once_a_day_whichever_process_fires_it(tmp_path: Path) -> None:
    """A web process's engine and the worker's both declare the schedule (``configure``):
    at 07:00 in Paris either may fire the tick, one instance is made, and the worker runs
    it.

    Both engines start under the frozen clock: a schedule counts its ticks from
    the start of the engines that declare it.
    """
    with override_settings(MEMABLE_DB=str(tmp_path / "shop.db")):
        web_engine, worker_engine = open_engine(web=True), open_engine()
    with (
        freeze_time("2026-06-02 04:59:59") as clock,
        running(web_engine) as web,
        running(worker_engine) as worker,
    ):
        clock.tick(1)  # 07:00 in Paris is 05:00 UTC in summer
        # What the engines' timer threads do by themselves; one of them may have
        # fired the tick already, so the counts these return vary.
        web.fire_due_timers()
        worker.fire_due_timers()
        tick = f"{SUMMARY}@2026-06-02T05:00:00Z"
        summary = worker.invocation("daily_summary", tick)
        assert summary.result(timeout=10) == "summary of 2026-06-01 sent"
        assert [tick_id for tick_id, _ in web.list_instances("daily_summary")] == [tick]


def wait_until(check: Callable[[], bool], worker: subprocess.Popen[str], what: str) -> None:
    """Poll ``check()`` until it is true; fail at the deadline or if the worker died."""
    deadline = time.monotonic() + 30
    while not check():
        assert worker.poll() is None, f"the worker exited early: {worker.communicate()}"
        assert time.monotonic() < deadline, f"the worker did not {what} in 30 s"
        time.sleep(0.02)


def test_the_worker_command_runs_the_workflows_until_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "shop.db"
    # Two orders a worker that has stopped since ran. The first was placed and
    # approved three days ago: its review timer is due. The second waits for approval.
    three_days_ago = datetime.now(timezone.utc) - timedelta(days=3, minutes=1)
    with override_settings(MEMABLE_DB=str(path)):
        earlier_worker = open_engine()
        web_engine = open_engine(web=True)
    with freeze_time(three_days_ago), running(earlier_worker) as earlier:
        earlier.invoke(WORKFLOW, Order("tea", 2), instance_id="order-1").wait(timeout=10)
        approved = earlier.signal(WORKFLOW, "order-1", "approval:v1", "alice")
        assert approved.wait(timeout=10) == Suspended("timer review-delay:v1")
        earlier.invoke(WORKFLOW, Order("cups", 6), instance_id="order-2").wait(timeout=10)
    # A third, queued by a web process: no worker has run it yet.
    with running(web_engine) as web:
        assert str(web.invoke(WORKFLOW, Order("pot", 1), instance_id="order-3").state) == "queued"

    worker = subprocess.Popen(
        [sys.executable, "manage.py", "memable_worker"],
        cwd=HERE,
        env={**os.environ, "MEMABLE_DB": str(path)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        # An engine with no workflow registered only stores the signal; the worker
        # has the workflow, and takes the signal within its poll interval.
        with running(Engine.open(path)) as signaller:
            signaller.signal(WORKFLOW, "order-2", "approval:v1", "bob")

            def status(order_id: str) -> MetadataStatus | None:
                meta = signaller.get_metadata(WORKFLOW, order_id)
                return None if meta is None else meta.status

            # The worker fires the due timer on its own, and ships order-2.
            wait_until(lambda: status("order-1") == MetadataStatus.Completed(), worker, "finish")
            shipped = MetadataStatus.Suspended("timer review-delay:v1")
            wait_until(lambda: status("order-2") == shipped, worker, "ship order-2")
            waiting = MetadataStatus.Suspended("waiting for a manager's approval")
            wait_until(lambda: status("order-3") == waiting, worker, "start order-3")
            assert signaller.steps(WORKFLOW, "order-1")[-1].key == "review-request:v1"
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)

    assert worker.returncode == 0, err
    assert out.splitlines() == [
        f"memable worker running on {path}",
        "SIGTERM: letting the runs in flight end",
        "memable worker stopped",
    ]


def test_the_dashboard_is_for_operators_only_and_acts_under_ops(
    client: Client, engine: Engine
) -> None:
    started = client.post("/orders", {"item": "tea", "quantity": 1}, "application/json")
    order_id = started.json()["id"]
    settle(engine, order_id)
    assert client.get("/ops/").status_code == 403  # no operator signed in
    operator = Client(REMOTE_USER="ops")
    listing = operator.get(f"/ops/instances?workflow={WORKFLOW}")
    assert listing.status_code == 200
    assert listing.cookies["memable_csrf"]["path"] == "/ops"
    assert f'href="/ops/instance?workflow={WORKFLOW}&amp;id={order_id}"' in listing.text
    page = operator.get(f"/ops/instance?workflow={WORKFLOW}&id={order_id}")
    csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
    signalled = operator.post("/ops/instance/signal", {
        "csrf": csrf, "workflow": WORKFLOW, "id": order_id, "key": "approval:v1",
        "payload": '"ada"'})
    assert signalled.status_code == 303
    assert signalled["Location"].startswith("/ops/instance?")
    settle(engine, order_id)
    steps = [s.key for s in engine.steps(WORKFLOW, order_id) if s.state == "completed"]
    assert "approval:v1" in steps
