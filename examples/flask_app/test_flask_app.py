"""The Flask example, through its test client: start, watch, approve, finish."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient
from freezegun import freeze_time
from memable import Engine
from memable.testing import advance, running

from app import WORKFLOW, create_app
from worker import engine as worker_engine
from workflows import SUMMARY


def settle(engine: Engine, order_id: str) -> None:
    """Wait until the run a request started has ended (suspended or finished)."""
    engine.invocation(WORKFLOW, order_id).wait(timeout=10)


def test_an_order_waits_for_approval_ships_and_asks_for_a_review_3_days_later(
    client: FlaskClient, engine: Engine
) -> None:
    with freeze_time("2026-03-02 09:00:00") as clock:
        started = client.post("/orders", json={"item": "tea", "quantity": 2})
        assert started.status_code == 202
        order_id = started.json["id"]
        assert started.headers["Location"] == f"/orders/{order_id}"
        settle(engine, order_id)

        assert client.get(f"/orders/{order_id}").json == {
            "id": order_id,
            "state": "suspended",
            "status": "waiting for a manager's approval",
            "steps_done": ["reserve:v1"],
        }

        approved = client.post(f"/orders/{order_id}/approve", json={"approver": "alice"})
        assert approved.status_code == 202
        settle(engine, order_id)
        shipped = client.get(f"/orders/{order_id}").json
        assert shipped["state"] == "suspended"
        assert shipped["status"] == "timer review-delay:v1"
        assert shipped["steps_done"] == ["reserve:v1", "approval:v1", "ship:v1"]

        assert advance(engine, clock, timedelta(days=2)) == 0  # not due yet
        advance(engine, clock, timedelta(days=1))
        assert engine.invocation(WORKFLOW, order_id).result(timeout=10) == "parcel-tea-2"

        done = client.get(f"/orders/{order_id}").json
        assert done["state"] == "completed"
        assert done["result"] == "parcel-tea-2"
        assert done["steps_done"][-2:] == ["review-delay:v1", "review-request:v1"]


def test_an_unknown_order_is_404(client: FlaskClient) -> None:
    assert client.get("/orders/no-such-order").status_code == 404
    approve = client.post("/orders/no-such-order/approve", json={"approver": "alice"})
    assert approve.status_code == 404


@pytest.mark.parametrize(
    "body",
    [
        None,
        ["tea", 2],
        {"quantity": 2},
        {"item": "", "quantity": 2},
        {"item": "tea"},
        {"item": "tea", "quantity": "2"},
        {"item": "tea", "quantity": 0},
        {"item": "tea", "quantity": True},
    ],
)
def test_a_bad_order_is_400_and_starts_nothing(
    client: FlaskClient, engine: Engine, body: Any
) -> None:
    response = client.post("/orders", json=body)
    assert response.status_code == 400
    assert "error" in response.json
    assert engine.list_instances(WORKFLOW) == []


@pytest.mark.parametrize("key", ["", "_reserved", "a/b", "x" * 65])
def test_a_bad_idempotency_key_is_400(client: FlaskClient, engine: Engine, key: str) -> None:
    response = client.post(
        "/orders", json={"item": "tea", "quantity": 1}, headers={"Idempotency-Key": key}
    )
    assert response.status_code == 400
    assert engine.list_instances(WORKFLOW) == []


@pytest.mark.parametrize("body", [None, {}, {"approver": ""}, {"approver": 7}])
def test_an_approval_without_an_approver_is_400(
    client: FlaskClient, engine: Engine, body: Any
) -> None:
    order_id = client.post("/orders", json={"item": "tea", "quantity": 1}).json["id"]
    settle(engine, order_id)
    assert client.post(f"/orders/{order_id}/approve", json=body).status_code == 400
    assert client.get(f"/orders/{order_id}").json["state"] == "suspended"


def test_a_second_approval_is_409(client: FlaskClient, engine: Engine) -> None:
    order_id = client.post("/orders", json={"item": "tea", "quantity": 1}).json["id"]
    first = client.post(f"/orders/{order_id}/approve", json={"approver": "alice"})
    second = client.post(f"/orders/{order_id}/approve", json={"approver": "bob"})
    assert (first.status_code, second.status_code) == (202, 409)
    settle(engine, order_id)
    assert client.get(f"/orders/{order_id}").json["steps_done"][-1] == "ship:v1"


def test_a_retried_request_with_the_same_idempotency_key_starts_one_order(
    client: FlaskClient, engine: Engine
) -> None:
    headers = {"Idempotency-Key": "cart-41"}
    first = client.post("/orders", json={"item": "tea", "quantity": 1}, headers=headers)
    again = client.post("/orders", json={"item": "tea", "quantity": 1}, headers=headers)
    assert first.json == again.json == {"id": "cart-41"}
    assert [order_id for order_id, _ in engine.list_instances(WORKFLOW)] == ["cart-41"]


def test_the_web_process_only_enqueues_and_the_worker_runs_the_orders(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without an engine the app opens the configured file to enqueue on (``queues=()``):
    an order stays queued until a worker (``worker.engine``) consumes the queue."""
    path = tmp_path / "orders.db"
    app = create_app(MEMABLE_DB=str(path))
    web: Engine = app.extensions["memable"]
    monkeypatch.setenv("MEMABLE_DB", str(path))
    worker = worker_engine()
    try:
        client = app.test_client()
        order_id = client.post("/orders", json={"item": "cups", "quantity": 6}).json["id"]
        assert client.get(f"/orders/{order_id}").json["state"] == "queued"
        worker.start()
        settle(web, order_id)  # the web engine follows the run the worker makes
        assert client.get(f"/orders/{order_id}").json["state"] == "suspended"
        client.post(f"/orders/{order_id}/approve", json={"approver": "alice"})
        settle(web, order_id)
        assert client.get(f"/orders/{order_id}").json["steps_done"][-1] == "ship:v1"
    finally:
        worker.close()
        web.close()  # what atexit does at the end of a real process
    assert path.exists()


def test_the_daily_summary_runs_once_a_day_whichever_process_fires_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The web process and the worker both declare the schedule (``configure``): at 07:00
    in Paris either may fire the tick, one instance is made, and the worker runs it.

    Both engines start under the frozen clock: a schedule counts its ticks from
    the start of the engines that declare it.
    """
    path = tmp_path / "orders.db"
    monkeypatch.setenv("MEMABLE_DB", str(path))
    with freeze_time("2026-06-02 04:59:59") as clock:
        web: Engine = create_app(MEMABLE_DB=str(path)).extensions["memable"]
        try:
            with running(worker_engine()) as worker:
                clock.tick(1)  # 07:00 in Paris is 05:00 UTC in summer
                # What the engines' timer threads do by themselves; one of them may
                # have fired the tick already, so the counts these return vary.
                web.fire_due_timers()
                worker.fire_due_timers()
                tick = f"{SUMMARY}@2026-06-02T05:00:00Z"
                summary = worker.invocation("daily_summary", tick)
                assert summary.result(timeout=10) == "summary of 2026-06-01 sent"
                assert [tick_id for tick_id, _ in web.list_instances("daily_summary")] == [tick]
        finally:
            web.close()  # what atexit does at the end of a real process


def test_the_dashboard_is_for_staff_only_and_acts_under_ops(
    client: FlaskClient, engine: Engine
) -> None:
    started = client.post("/orders", json={"item": "tea", "quantity": 1})
    order_id = started.json["id"]
    settle(engine, order_id)
    assert client.get("/ops/").status_code == 403  # not logged in as staff
    with client.session_transaction() as session:
        session["staff"] = True
    listing = client.get(f"/ops/instances?workflow={WORKFLOW}")
    assert listing.status_code == 200
    assert f'href="/ops/instance?workflow={WORKFLOW}&amp;id={order_id}"' in listing.text
    page = client.get(f"/ops/instance?workflow={WORKFLOW}&id={order_id}")
    csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
    signalled = client.post("/ops/instance/signal", data={
        "csrf": csrf, "workflow": WORKFLOW, "id": order_id, "key": "approval:v1",
        "payload": '"ada"'})
    assert signalled.status_code == 303
    assert signalled.headers["Location"].startswith("/ops/instance?")
    settle(engine, order_id)
    steps = [s.key for s in engine.steps(WORKFLOW, order_id) if s.state == "completed"]
    assert "approval:v1" in steps
