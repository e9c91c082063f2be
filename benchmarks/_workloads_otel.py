"""W1 with tracing and metrics three ways (issue 24): what OpenTelemetry costs a step.

``step_throughput_otel`` runs W1 (``_workloads.step_throughput``, unchanged)
with ``p["otel"]``:

- ``none``: the engine gets the no-op ``Telemetry``, what a Python without
  OpenTelemetry gets (``memable._engine.engine.telemetry`` is replaced before
  the engine is made); checks that no ``opentelemetry`` module was imported.
- ``api``: the default, the OpenTelemetry API with no SDK provider configured
  (spans are the API's no-ops, nothing is stored); checks that the engine
  went through ``OpenTelemetry`` and that it saw no tracing.
- ``sdk``: the SDK's ``TracerProvider`` as the global provider, with a
  ``SimpleSpanProcessor`` over an exporter that only counts what it is given,
  and a ``MeterProvider`` with an ``InMemoryMetricReader``; checks that the
  timed instance's trace holds one invoke span, one run span and ``n`` step
  spans, and that ``memable.steps`` counted every step.

When the API (or for ``sdk`` the SDK) is not importable the record says so
(``unavailable``) instead of a figure. No module here imports OpenTelemetry at
import time: ``none`` must run without it.
"""

from __future__ import annotations

import importlib.util
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ._workloads import check, step_throughput


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its parent package is missing
        return False


def _use_no_telemetry() -> None:
    """Engines made from now on get the no-op ``Telemetry``."""
    import memable._engine.engine as engine_module
    from memable._observe.base import Telemetry

    engine_module.telemetry = Telemetry  # type: ignore[attr-defined]


def _configure_sdk() -> tuple[Any, Callable[[], dict[str, float]]]:
    """Global SDK providers: spans to a counting exporter, metrics to a memory reader."""
    from opentelemetry import metrics, trace
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import (
        SimpleSpanProcessor,
        SpanExporter,
        SpanExportResult,
    )

    class Counting(SpanExporter):
        """Keeps no span: counts them by trace and by the first word of their name."""

        def __init__(self) -> None:
            self.counts: Counter[tuple[int, str]] = Counter()
            self.trace_of: dict[Any, int] = {}  # instance id of a run -> its trace id

        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            for span in spans:
                kind, trace_id = span.name.partition(" ")[0], span.context.trace_id
                self.counts[trace_id, kind] += 1
                if kind == "workflow" and span.attributes is not None:
                    self.trace_of[span.attributes.get("memable.instance_id")] = trace_id
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            pass

    exporter = Counting()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(tracer_provider)
    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

    def sums() -> dict[str, float]:
        """Each counter's total over its data points."""
        data = reader.get_metrics_data()
        found: dict[str, float] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    points = metric.data.data_points
                    found[metric.name] = sum(getattr(pt, "value", 0) for pt in points)
        return found

    return exporter, sums


def step_throughput_otel(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """W1 with no telemetry, the API without an SDK, or the SDK recording spans."""
    otel, n, warm = p["otel"], p["n"], p["warm"]
    if otel != "none" and not _importable("opentelemetry.trace"):
        return {"unavailable": "opentelemetry not importable in this Python", "otel": otel}
    if otel == "sdk" and not _importable("opentelemetry.sdk.trace"):
        return {"unavailable": "opentelemetry-sdk not importable in this Python", "otel": otel}
    exporter = sums = None
    if otel == "none":
        _use_no_telemetry()
    elif otel == "sdk":
        exporter, sums = _configure_sdk()
    result = step_throughput(tmp, p)
    if otel == "none":
        check("opentelemetry" not in sys.modules, "otel none: opentelemetry was imported")
    else:
        from memable._observe.otel import OpenTelemetry

        telemetry = OpenTelemetry._one
        check(telemetry is not None, f"otel {otel}: the engine did not use OpenTelemetry")
        assert telemetry is not None
        check(telemetry.tracing == (otel == "sdk"), f"otel {otel}: tracing {telemetry.tracing}")
    if exporter is not None and sums is not None:
        trace_id = exporter.trace_of.get("w1")
        spans = {kind: exporter.counts[trace_id, kind] for kind in ("invoke", "workflow", "step")}
        check(spans == {"invoke": 1, "workflow": 1, "step": n},
              f"otel sdk: the timed instance's trace holds {spans}, not 1, 1 and {n}")
        steps = sums().get("memable.steps")
        check(steps == warm + n, f"otel sdk: memable.steps {steps}, not {warm + n}")
        result["spans"] = sum(exporter.counts.values())
    return {**result, "otel": otel}


OTEL_WORKLOADS = {"step_throughput_otel": step_throughput_otel}
