"""The workflow the Flask example runs: an order that waits for a manager's approval.

The step functions stand in for calls to other services (stock, shipping,
mail); a real application would make those calls there.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

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


#: Every workflow of the app by name: the app registers these on its engine.
WORKFLOWS: dict[str, Callable[..., Any]] = {"place_order": place_order}


#: The queue orders go through: web processes only enqueue; workers run them, at most
#: 5 at once and 100 a minute (say, what the payment provider allows).
QUEUE = "orders"


def configure(engine: Engine) -> None:
    """Declare the queue and register every workflow on it: the same in every process."""
    engine.queue(QUEUE, concurrency=5, rate=(100, 60))
    for name, fn in WORKFLOWS.items():
        engine.register(name, fn, queue=QUEUE)
