"""The workflows the Flask example runs: the shop's, written once in
``examples/shop_workflows.py`` for both example apps (an application of your own keeps
its workflows in a module of its own, as that one is)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from shop_workflows import QUEUE, SUMMARY, WORKFLOWS, Order, configure

__all__ = ["QUEUE", "SUMMARY", "WORKFLOWS", "Order", "configure"]
