"""The shop's workflows, which both example apps run (``flask_app`` and
``django_project``, each importing this module from its ``workflows``): an order that
waits for a manager's approval, and a daily summary on a schedule.

The step functions stand in for calls to other services (stock, shipping,
mail); a real application would make those calls there.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import attrs
from memable import Context, Engine


@attrs.frozen
class Order:
    """What a customer asked for: the workflow's input, stored with the instance."""

    item: str
    quantity: int


def reserve_stock(order: Order) -> str:
    return f"reservation of {order.quantity} x {order.item}"


def ship(order: Order) -> str:
    return f"parcel-{order.item}-{order.quantity}"


def ask_for_review(order: Order, tracking: str) -> str:
    return f"review request for {tracking} sent"


def place_order(ctx: Context, order: Order) -> str:
    """Reserve stock, wait for approval, ship, and ask for a review 3 days later."""
    ctx.set_status("reserving stock")
    ctx.step("reserve:v1").run(reserve_stock, order)
    # Ends this run (and frees its thread) until a request signals "approval:v1".
    approver = ctx.suspend("approval:v1", status="waiting for a manager's approval")
    ctx.set_status(f"approved by {approver}; shipping")
    tracking = ctx.step("ship:v1").run(ship, order)
    # A durable sleep: the deadline is in the store, not in a thread.
    ctx.timer("review-delay:v1", timedelta(days=3))
    ctx.step("review-request:v1").run(ask_for_review, order, tracking)
    return tracking


#: The zone the shop's days are counted in.
SHOP_TIMEZONE = "Europe/Paris"


def send_summary(day: date) -> str:
    return f"summary of {day:%Y-%m-%d} sent"


def daily_summary(ctx: Context, tick: datetime) -> str:
    """Send the summary of the shop's day before ``tick`` (its schedule's tick, in UTC)."""
    day = tick.astimezone(ZoneInfo(SHOP_TIMEZONE)).date() - timedelta(days=1)
    return ctx.step("send-summary:v1").run(send_summary, day)


#: Every workflow of the app by name: the app registers these on its engine.
WORKFLOWS: dict[str, Callable[..., Any]] = {
    "place_order": place_order,
    "daily_summary": daily_summary,
}


#: The queue the workflows go through: web processes only enqueue; workers run them, at
#: most 5 at once and 100 a minute (say, what the payment provider allows).
QUEUE = "orders"
#: The schedule of the daily summary: each morning at 07:00, shop time.
SUMMARY = "daily-summary"


def configure(engine: Engine) -> None:
    """Declare the queue, register every workflow on it and declare the daily summary's
    schedule: the same in every process."""
    engine.queue(QUEUE, concurrency=5, rate=(100, 60))
    for name, fn in WORKFLOWS.items():
        engine.register(name, fn, queue=QUEUE)
    # Whichever engine fires a tick (a web process's too), its instance goes on the
    # queue, and a worker runs it: once a day, however many processes declare it.
    engine.schedule(SUMMARY, "0 7 * * *", "daily_summary", timezone=SHOP_TIMEZONE)
