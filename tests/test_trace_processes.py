"""One trace across processes: a web process invokes onto a queue inside a request span,
a ``memable worker`` runs the workflow to its wait, a third process signals it, the worker
finishes it. Every span shares the request's trace id, each exported by the process that
made it (tests/_trace_app.py)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from helpers import until

from memable import Engine, MetadataStatus

TESTS = Path(__file__).parent
APP = str(TESTS / "_trace_app.py")
TIMEOUT = 60


def spans_of(directory: Path, role: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for path in sorted(directory.glob(f"{role}-*.jsonl")):
        found.extend(json.loads(line) for line in path.read_text().splitlines())
    return found


def test_a_request_a_worker_and_a_signaller_make_one_trace(
    shared_store: dict[str, Any], tmp_path: Path,
) -> None:
    """A web process invoking inside a request span, a ``memable worker`` process running
    the workflow to its wait and on after the signal, and a third process signalling it
    export spans that all share the request's trace id, each from its own process; the chain
    is request > invoke > first run, and invoke > signal > second run."""
    env = {
        **os.environ, "MEMABLE_TRACE_DIR": str(tmp_path),
        "MEMABLE_TRACE_DB": str(shared_store["target"]),
        "MEMABLE_TRACE_SCHEMA": shared_store.get("schema") or "",
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
    }
    reader = Engine.open(**shared_store)
    worker = None
    try:
        web = subprocess.run([sys.executable, APP, "invoke"], env=env, cwd=TESTS,
                             capture_output=True, text=True, timeout=TIMEOUT, check=True)
        assert web.stdout == "order-1\n"
        worker = subprocess.Popen(
            [sys.executable, "-m", "memable", "worker", "_trace_app:engine", "--queues",
             "orders"], cwd=TESTS, env=env, stderr=subprocess.DEVNULL,
        )

        def status() -> Any:
            found = reader.get_metadata("order", "order-1")
            return None if found is None else found.status

        until(lambda: status() == MetadataStatus.Suspended("paid"), TIMEOUT)
        subprocess.run([sys.executable, APP, "signal", "order-1"], env=env, cwd=TESTS,
                       capture_output=True, text=True, timeout=TIMEOUT, check=True)
        until(lambda: status() == MetadataStatus.Completed(), TIMEOUT)
    finally:
        if worker is not None:
            worker.send_signal(signal.SIGTERM)
            worker.wait(TIMEOUT)
        reader.close()

    web_spans, worker_spans = spans_of(tmp_path, "web"), spans_of(tmp_path, "worker")
    signal_spans = spans_of(tmp_path, "signal")
    assert sorted(s["name"] for s in web_spans) == ["POST /orders", "invoke order"]
    assert sorted(s["name"] for s in worker_spans) == [
        "step charge", "step ship", "workflow order", "workflow order"]
    assert [s["name"] for s in signal_spans] == ["invoke order"]
    [request] = [s for s in web_spans if s["name"] == "POST /orders"]
    every = web_spans + worker_spans + signal_spans
    assert {s["trace_id"] for s in every} == {request["trace_id"]}
    # Each was exported by the process that made it.
    assert len({s["pid"] for s in web_spans}) == 1
    assert {s["pid"] for s in worker_spans} == {worker.pid}
    # The chain: request > invoke > first run; first invoke > signal > second run.
    [invoke] = [s for s in web_spans if s["name"] == "invoke order"]
    first, second = sorted((s for s in worker_spans if s["name"] == "workflow order"),
                           key=lambda s: s["attributes"]["memable.run.reason"])
    assert invoke["parent_id"] == request["span_id"]
    assert (first["attributes"]["memable.run.reason"], first["parent_id"]) == (
        "invoke", invoke["span_id"])
    [signalled] = signal_spans
    assert signalled["parent_id"] == invoke["span_id"]
    assert (second["attributes"]["memable.run.reason"], second["parent_id"]) == (
        "signal", signalled["span_id"])
    assert first["kind"] == second["kind"] == "CONSUMER"
    assert invoke["kind"] == signalled["kind"] == "PRODUCER"
