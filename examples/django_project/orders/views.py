"""Views that start an order's workflow, show its status and approve it."""

from __future__ import annotations

import json
import re
from typing import Any

from django.http import HttpRequest, JsonResponse
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST
from memable import InstanceFinished, InstanceNotFound, MetadataStatus, SignalRejected

from .engine import get_engine
from .workflows import Order

WORKFLOW = "place_order"
#: What an Idempotency-Key header may hold: it becomes the instance id, and part of a URL.
IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def error(message: str, status: int) -> JsonResponse:
    return JsonResponse({"error": message}, status=status)


def json_body(request: HttpRequest) -> Any:
    try:
        return json.loads(request.body)
    except ValueError:
        return None


@csrf_exempt  # a JSON API for other programs: authenticate them your own way
@require_POST
def start_order(request: HttpRequest) -> JsonResponse:
    """Start a workflow for the order in the JSON body; 202 with the instance id."""
    data = json_body(request)
    if not isinstance(data, dict):
        return error("send a JSON object", 400)
    item, quantity = data.get("item"), data.get("quantity")
    if not isinstance(item, str) or not item:
        return error("item must be a non-empty string", 400)
    if type(quantity) is not int or quantity < 1:
        return error("quantity must be a positive integer", 400)
    # A client that retries with the same Idempotency-Key gets the same order.
    key = request.headers.get("Idempotency-Key")
    if key is not None and not IDEMPOTENCY_KEY.fullmatch(key):
        return error("Idempotency-Key: up to 64 letters, digits, '-' or '_'", 400)
    inv = get_engine().invoke(WORKFLOW, Order(item, quantity), instance_id=key)
    response = JsonResponse({"id": inv.instance_id}, status=202)
    response["Location"] = reverse("order-status", args=[inv.instance_id])
    return response


@require_GET
def order_status(request: HttpRequest, order_id: str) -> JsonResponse:
    """What the store says about an order: state, status message, steps done, result."""
    engine = get_engine()
    meta = engine.get_metadata(WORKFLOW, order_id)
    if meta is None:
        return error(f"no order {order_id!r}", 404)
    steps = engine.steps(WORKFLOW, order_id)
    body: dict[str, Any] = {
        "id": order_id,
        "state": meta.status.name,  # queued, running, suspended, completed, failed, ...
        "status": meta.status.message,  # e.g. "waiting for a manager's approval"
        "steps_done": [step.key for step in steps if step.state == "completed"],
    }
    if meta.status == MetadataStatus.Completed():
        body["result"] = engine.invocation(WORKFLOW, order_id).result(timeout=0)
    return JsonResponse(body)


@csrf_exempt
@require_POST
def approve_order(request: HttpRequest, order_id: str) -> JsonResponse:
    """Signal the order's ``approval:v1`` suspend point with the approver's name."""
    data = json_body(request)
    approver = data.get("approver") if isinstance(data, dict) else None
    if not isinstance(approver, str) or not approver:
        return error('send {"approver": "<name>"}', 400)
    try:
        get_engine().signal(WORKFLOW, order_id, "approval:v1", approver)
    except InstanceNotFound:
        return error(f"no order {order_id!r}", 404)
    except (SignalRejected, InstanceFinished) as err:  # approved already, or finished
        return error(str(err), 409)
    return JsonResponse({"id": order_id}, status=202)
