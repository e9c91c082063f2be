"""The demo behind ``python -m memable demo``: a failure, then a resume."""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import attrs

from .._engine.engine import Engine
from .._log import log
from .._run.context import Context

T = TypeVar("T")


@attrs.frozen
class Order:
    """The demo workflow's input."""

    id: int
    items: tuple[str, ...]
    total: float


@attrs.frozen
class Receipt:
    """The demo workflow's output."""

    order_id: int
    charged: float


class _Shop:
    """Step functions that say when they execute; charging fails once per order."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self._say = say
        # _lock guards executions and _charged (step functions run on worker threads).
        self._lock = threading.Lock()
        self.executions: list[str] = []
        self._charged: set[int] = set()

    def executed(self, key: str) -> int:
        """How many times the step function of ``key`` has executed."""
        with self._lock:
            return self.executions.count(key)

    def fetch(self, order: Order) -> str:
        with self._lock:
            self.executions.append("fetch:v1")
        self._say(f"  fetch:v1   executing -> order #{order.id}: {', '.join(order.items)}")
        return f"order #{order.id}"

    def charge(self, order: Order) -> float:
        with self._lock:
            self.executions.append("charge:v1")
            first_attempt = order.id not in self._charged
            self._charged.add(order.id)
        if first_attempt:
            self._say("  charge:v1  executing -> payment gateway timed out (simulated, once)")
            raise ConnectionError("payment gateway timed out")
        self._say(f"  charge:v1  executing -> charged {order.total:.2f}")
        return order.total


class _OneLine(logging.Formatter):
    """A record as one line: its level and message, never a traceback or a stack."""

    def format(self, record: logging.LogRecord) -> str:
        left_out = " (traceback left out)" if record.exc_info or record.exc_text else ""
        return f"  log: {record.levelname} {record.name}: {record.getMessage()}{left_out}"


@contextmanager
def _one_line_logs() -> Iterator[None]:
    """While the demo runs, show the engine's warnings in one line on stderr, instead of the
    last-resort handler's traceback; where logging is configured, add nothing."""
    if log.hasHandlers():
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(_OneLine())
    log.addHandler(handler)
    try:
        yield
    finally:
        log.removeHandler(handler)


def run_demo(path: str | os.PathLike[str], say: Callable[[str], None] = print) -> int:
    """Run the demo on the store at ``path``; return 0 if it went as it should."""
    shop = _Shop(say)

    def reach(ctx: Context, key: str, fn: Callable[[Order], T], order: Order) -> T:
        # A step not executed was served from the store; either way, the line comes in order.
        before = shop.executed(key)
        result = ctx.step(key).run(fn, order)
        if shop.executed(key) == before:
            say(f"  {key:<10} served from the store (not executed again)")
        return result

    def checkout(ctx: Context, order: Order) -> Receipt:
        ctx.set_status("fetching the order")
        reach(ctx, "fetch:v1", shop.fetch, order)
        ctx.set_status("charging the card")
        charged = reach(ctx, "charge:v1", shop.charge, order)
        return Receipt(order.id, charged)

    engine = Engine.open(path)
    engine.register("checkout", checkout)
    with _one_line_logs(), engine:
        earlier = len(engine.list_instances("checkout"))
        order = Order(earlier + 1, ("tea", "cups"), 19.5)
        say(f"memable demo on {os.path.abspath(path)} ({earlier} earlier demo instances)")
        say("run 1: invoke 'checkout'")
        inv = engine.invoke("checkout", order)
        say(f"  instance {inv.instance_id} ended {inv.wait()}")
        say("run 2: resume the same instance")
        resumed = engine.resume("checkout", inv.instance_id)
        say(f"  ended {resumed.wait()}; result {resumed.result()!r}")
        say("stored steps:")
        for step in engine.steps("checkout", inv.instance_id):
            say(f"  {step.key:<10} {step.state:<9} attempts={step.attempts} "
                f"status={step.status!r} result={step.result!r}")
    ok = shop.executions == ["fetch:v1", "charge:v1", "charge:v1"]
    say("the demo went as it should" if ok else "the demo did NOT go as it should")
    return 0 if ok else 1
