"""Processes of one trace, for tests/test_trace_processes.py (not a test module).

Each process sets the OpenTelemetry SDK up with an exporter that appends its
finished spans, as JSON lines, to ``$MEMABLE_TRACE_DIR/{role}-{pid}.jsonl``. The
store comes from MEMABLE_TRACE_DB (and MEMABLE_TRACE_SCHEMA).

- ``memable worker _trace_app:engine --queues orders`` (role "worker") runs the
  workflow "order": a step, a wait for the signal "paid", a step.
- ``python _trace_app.py invoke`` (role "web") starts a request span and invokes
  "order" onto the queue from an engine that only enqueues; prints the id.
- ``python _trace_app.py signal ID`` (role "signal") signals "paid", with no
  span of its own around it.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from memable import Context, Engine


class FileExporter(SpanExporter):
    """Appends each finished span to a file, one JSON object a line."""

    def __init__(self, path: str) -> None:
        self._path = path

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        with open(self._path, "a") as out:
            for span in spans:
                out.write(json.dumps({
                    "name": span.name,
                    "kind": span.kind.name,
                    "trace_id": format(span.context.trace_id, "032x"),
                    "span_id": format(span.context.span_id, "016x"),
                    "parent_id": None if span.parent is None
                    else format(span.parent.span_id, "016x"),
                    "attributes": dict(span.attributes or {}),
                    "pid": os.getpid(),
                }) + "\n")
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def tracing(role: str) -> None:
    provider = TracerProvider()
    path = os.path.join(os.environ["MEMABLE_TRACE_DIR"], f"{role}-{os.getpid()}.jsonl")
    provider.add_span_processor(SimpleSpanProcessor(FileExporter(path)))
    trace.set_tracer_provider(provider)


def order(ctx: Context) -> str:
    ctx.step("charge").run(lambda: "charged")
    paid = ctx.suspend("paid")
    return str(ctx.step("ship").run(lambda: f"shipped after {paid}"))


def make(**options: object) -> Engine:
    schema = os.environ.get("MEMABLE_TRACE_SCHEMA") or None
    engine = Engine.open(os.environ["MEMABLE_TRACE_DB"], schema=schema, **options)  # type: ignore[arg-type]
    engine.queue("orders")
    engine.register("order", order, queue="orders")
    return engine


def engine() -> Engine:
    """What ``memable worker _trace_app:engine`` loads."""
    tracing("worker")
    return make(poll_interval=0.05)


def main(command: str, *args: str) -> None:
    if command == "invoke":
        tracing("web")
        web = make(queues=())
        with web, trace.get_tracer("web").start_as_current_span("POST /orders"):
            print(web.invoke("order", instance_id="order-1").instance_id, flush=True)
    elif command == "signal":
        tracing("signal")
        with make(queues=()) as signaller:
            signaller.signal("order", args[0], "paid", "card")


if __name__ == "__main__":
    main(*sys.argv[1:])
