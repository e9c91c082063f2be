"""A Flask app that starts a memable workflow per order and shows its status.

Run it from this directory with ``flask --app app run``, and the workers that
run the orders with ``memable worker worker:engine``. The workflows are
stored in the SQLite file named by the ``MEMABLE_DB`` setting (set it with
``FLASK_MEMABLE_DB=/path/to/orders.db`` in the environment; the worker reads
``MEMABLE_DB``).
"""

from __future__ import annotations

import atexit
import re
from typing import Any

import memable.web
from flask import Blueprint, Flask, abort, current_app, request, session, url_for
from flask.typing import ResponseReturnValue
from memable import Engine, InstanceFinished, InstanceNotFound, MetadataStatus, SignalRejected
from werkzeug.wrappers import Response

from workflows import Order, configure

WORKFLOW = "place_order"
#: What an Idempotency-Key header may hold: it becomes the instance id, and part of a URL.
IDEMPOTENCY_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")

orders = Blueprint("orders", __name__)
#: The memable dashboard, for the shop's staff only, under /ops.
ops = Blueprint("ops", __name__, url_prefix="/ops")


def create_app(engine: Engine | None = None, **config: Any) -> Flask:
    """Build the app. Without ``engine``, open ``MEMABLE_DB`` to enqueue orders on it.

    The web process's engine consumes no queue (``queues=()``): it stores
    orders, signals and reads (and may fire a tick of the daily summary onto
    the queue), and ``memable worker worker:engine`` processes run them. Tests
    pass an engine of their own, configured and started.
    """
    app = Flask(__name__)
    app.config["MEMABLE_DB"] = "memable.db"
    app.config["SECRET_KEY"] = None  # FLASK_SECRET_KEY=...: the session /ops relies on
    app.config.from_prefixed_env()  # FLASK_MEMABLE_DB=... in the environment
    app.config.update(config)
    if engine is None:
        engine = Engine.open(app.config["MEMABLE_DB"], queues=())
        configure(engine)
        engine.start()
        # At exit: take no new work, let the runs in flight end, close the file.
        atexit.register(engine.close)
    app.extensions["memable"] = engine
    # The dashboard reads and acts through the engine's store; staff may act.
    app.extensions["memable.web"] = memable.web.app(engine, allow_actions=True)
    app.register_blueprint(orders)
    app.register_blueprint(ops)
    return app


def get_engine() -> Engine:
    """The engine of the app handling the current request."""
    engine: Engine = current_app.extensions["memable"]
    return engine


def error(message: str, code: int) -> ResponseReturnValue:
    return {"error": message}, code


@orders.post("/orders")
def start_order() -> ResponseReturnValue:
    """Start a workflow for the order in the JSON body; 202 with the instance id."""
    data = request.get_json(silent=True)
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
    location = url_for(".order_status", order_id=inv.instance_id)
    return {"id": inv.instance_id}, 202, {"Location": location}


@orders.get("/orders/<order_id>")
def order_status(order_id: str) -> ResponseReturnValue:
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
    return body


@orders.post("/orders/<order_id>/approve")
def approve_order(order_id: str) -> ResponseReturnValue:
    """Signal the order's ``approval:v1`` suspend point with the approver's name."""
    data = request.get_json(silent=True)
    approver = data.get("approver") if isinstance(data, dict) else None
    if not isinstance(approver, str) or not approver:
        return error('send {"approver": "<name>"}', 400)
    try:
        get_engine().signal(WORKFLOW, order_id, "approval:v1", approver)
    except InstanceNotFound:
        return error(f"no order {order_id!r}", 404)
    except (SignalRejected, InstanceFinished) as err:  # approved already, or finished
        return error(str(err), 409)
    return {"id": order_id}, 202


@ops.before_request
def staff_only() -> None:
    """The app's own login guards the dashboard: here, a session the login view marked
    as staff (with Flask-Login: ``current_user.is_authenticated and
    current_user.is_staff``)."""
    if not session.get("staff"):
        abort(403)


@ops.route("/", defaults={"path": ""}, methods=["GET", "POST"])
@ops.route("/<path:path>", methods=["GET", "POST"])
def dashboard(path: str) -> Response:
    """Hand the request to the dashboard, mounted at /ops (its links and cookies say so)."""
    environ = dict(request.environ, SCRIPT_NAME=request.script_root + "/ops",
                   PATH_INFO="/" + path)
    return Response.from_app(current_app.extensions["memable.web"], environ)
