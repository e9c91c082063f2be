"""``Telemetry`` through the OpenTelemetry API: what an engine reports when it is installed.

Through the global providers, whatever the application set with the SDK, even after the engine
started. Until one is set, the API's no-op spans are not even made (they would cost each invoke
and run some microseconds, and carry an ambient span's context into the store)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import metrics, trace
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from .base import Produced, QueueStats, RunReason, RunTrace, StepTrace, Telemetry

#: The instrumentation scope of every span and instrument.
SCOPE = "memable"
_PROPAGATOR = TraceContextTextMapPropagator()
#: How long one read of the queues serves the three queue gauges of a collection.
_QUEUE_READ_FOR = 1.0


def _context_of(traceparent: str | None) -> otel_context.Context | None:
    return None if traceparent is None else _PROPAGATOR.extract({"traceparent": traceparent})


class _Step(StepTrace):
    def __init__(self, span: trace.Span) -> None:
        self._span = span

    def failed(self, exc: BaseException) -> None:
        self._span.record_exception(exc)
        self._span.set_status(Status(StatusCode.ERROR, f"{type(exc).__name__}: {exc}"))

    def end(self) -> None:
        self._span.end()


class _Run(RunTrace):
    def __init__(self, tracer: trace.Tracer, span: trace.Span) -> None:
        self._tracer = tracer
        self._span = span
        self._context = trace.set_span_in_context(span)
        self.recording = span.is_recording()

    @contextmanager
    def current(self) -> Iterator[None]:
        token = otel_context.attach(self._context)
        try:
            yield
        finally:
            otel_context.detach(token)

    def step(self, key: str, attempt: int) -> StepTrace:
        if not self.recording:
            return super().step(key, attempt)
        span = self._tracer.start_span(f"step {key}", context=self._context,
            attributes={"memable.step.key": key, "memable.step.attempt": attempt})
        return _Step(span)

    def end(self, outcome: str | None, replayed_steps: int) -> None:
        if outcome is not None:
            self._span.set_attribute("memable.outcome", outcome)
        self._span.set_attribute("memable.replayed_steps", replayed_steps)
        if outcome == "failed":
            self._span.set_status(Status(StatusCode.ERROR))
        self._span.end()


class _Produced(Produced):
    def __init__(self, span: trace.Span) -> None:
        self._span = span
        if span.get_span_context().is_valid:
            carrier: dict[str, str] = {}
            _PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
            self.traceparent = carrier.get("traceparent")

    def end(self) -> None:
        self._span.end()


class _QueueGauges:
    """The queues' reads of every engine in the process, read once per collection."""

    def __init__(self) -> None:
        # _lock guards _reads and the cache: the meter's thread collects as engines come and go.
        self._lock = threading.Lock()
        self._reads: list[Callable[[], list[QueueStats]]] = []
        self._cached: list[QueueStats] = []
        self._read_at = -_QUEUE_READ_FOR

    def add(self, read: Callable[[], list[QueueStats]]) -> Callable[[], None]:
        with self._lock:
            self._reads.append(read)

        def remove() -> None:
            with self._lock:
                if read in self._reads:
                    self._reads.remove(read)

        return remove

    def stats(self) -> list[QueueStats]:
        with self._lock:
            if time.monotonic() - self._read_at < _QUEUE_READ_FOR:
                return self._cached
            reads = list(self._reads)
        found: list[QueueStats] = []
        for read in reads:
            try:
                found.extend(read())
            except Exception:  # a closed store, say: that engine shows nothing
                continue
        with self._lock:
            self._cached, self._read_at = found, time.monotonic()
        return found

    def callback(self, field: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(getattr(s, field), {"queue": s.queue}) for s in self.stats()]

        return observe


class OpenTelemetry(Telemetry):
    """Spans and metrics through the OpenTelemetry API (one per process: ``instance()``).

    >>> telemetry = OpenTelemetry.instance()
    >>> with telemetry.producing("wf") as traceparent:  # no SDK configured here
    ...     print(traceparent)
    None
    """

    _one: OpenTelemetry | None = None
    _made = threading.Lock()  # guards _one

    @classmethod
    def instance(cls) -> OpenTelemetry:
        """The process's one (instruments are made once, whatever the engines)."""
        with cls._made:
            if cls._one is None:
                cls._one = cls()
            return cls._one

    def __init__(self, tracer_provider: trace.TracerProvider | None = None,
                 meter_provider: metrics.MeterProvider | None = None) -> None:
        """Through the global providers, unless given others (a test's, say)."""
        self._own_tracing = tracer_provider is not None
        self._tracer = trace.get_tracer(SCOPE, tracer_provider=tracer_provider)
        meter = (meter_provider.get_meter(SCOPE) if meter_provider is not None
                 else metrics.get_meter(SCOPE))
        self._runs = meter.create_counter("memable.runs", "{run}", "Runs ended, by outcome")
        self._steps = meter.create_counter(
            "memable.steps", "{attempt}", "Step attempts executed, by outcome")
        self._retries = meter.create_counter(
            "memable.step.retries", "{retry}", "Step attempts made again after a failure")
        self._ticks = meter.create_counter(
            "memable.schedule.ticks", "{tick}", "Schedule ticks fired, skipped or missed")
        self._run_duration = meter.create_histogram(
            "memable.run.duration", "s", "How long a run took, from claim to end")
        self._step_duration = meter.create_histogram(
            "memable.step.duration", "s", "How long a step attempt took")
        self._queue_wait = meter.create_histogram(
            "memable.queue.wait", "s", "From runnable on a queue to started")
        self._timer_lag = meter.create_histogram(
            "memable.timer.lag", "s", "From a timer's deadline to its firing")
        self._gauges = _QueueGauges()
        for name, field, unit, what in (
            ("memable.queue.queued", "queued", "{instance}", "Runnable instances waiting"),
            ("memable.queue.running", "running", "{instance}", "Instances holding a slot"),
            ("memable.queue.oldest_age", "oldest_age", "s", "Age of the oldest waiting"),
        ):
            meter.create_observable_gauge(name, [self._gauges.callback(field)], unit, what)

    @property
    def tracing(self) -> bool:
        """Whether an application set a tracer provider (else spans are the API's no-ops)."""
        return self._own_tracing or not isinstance(
            trace.get_tracer_provider(), trace.ProxyTracerProvider)

    @contextmanager
    def producing(
        self, workflow: str, parent: str | None = None, instance_id: str | None = None
    ) -> Iterator[str | None]:
        if not self.tracing:  # the API's no-op spans: skipped, and nothing to store
            yield None
            return
        current = trace.get_current_span().get_span_context().is_valid
        attributes: dict[str, Any] = {"memable.workflow": workflow}
        if instance_id is not None:
            attributes["memable.instance_id"] = instance_id
        with self._tracer.start_as_current_span(
                f"invoke {workflow}", context=None if current else _context_of(parent),
                kind=SpanKind.PRODUCER, attributes=attributes) as span:
            if not span.get_span_context().is_valid:
                yield None
                return
            carrier: dict[str, str] = {}
            _PROPAGATOR.inject(carrier)
            yield carrier.get("traceparent")

    def produce(self, workflow: str, instance_id: str | None = None) -> Produced:
        if not self.tracing:
            return super().produce(workflow, instance_id)
        attributes: dict[str, Any] = {"memable.workflow": workflow}
        if instance_id is not None:
            attributes["memable.instance_id"] = instance_id
        span = self._tracer.start_span(f"invoke {workflow}", context=otel_context.Context(),
                                       kind=SpanKind.PRODUCER, attributes=attributes)
        return _Produced(span)

    def run(
        self, workflow: str, instance_id: str, traceparent: str | None, reason: RunReason
    ) -> RunTrace:
        if not self.tracing:
            return super().run(workflow, instance_id, traceparent, reason)
        span = self._tracer.start_span(
            f"workflow {workflow}", context=_context_of(traceparent) or otel_context.Context(),
            kind=SpanKind.CONSUMER, attributes={"memable.workflow": workflow,
                "memable.instance_id": instance_id, "memable.run.reason": reason})
        return _Run(self._tracer, span)

    def run_ended(self, workflow: str, outcome: str, seconds: float) -> None:
        self._runs.add(1, {"workflow": workflow, "outcome": outcome})
        self._run_duration.record(seconds, {"workflow": workflow})

    def step_ended(self, workflow: str, outcome: str, seconds: float) -> None:
        self._steps.add(1, {"workflow": workflow, "outcome": outcome})
        self._step_duration.record(seconds, {"workflow": workflow})

    def step_retried(self, workflow: str) -> None:
        self._retries.add(1, {"workflow": workflow})

    def ticks(self, schedule: str, outcome: str, count: int) -> None:
        if count:
            self._ticks.add(count, {"schedule": schedule, "outcome": outcome})

    def queue_waited(self, queue: str, seconds: float) -> None:
        self._queue_wait.record(max(0.0, seconds), {"queue": queue})

    def timer_fired(self, lag: float) -> None:
        self._timer_lag.record(max(0.0, lag))

    def observe_queues(self, read: Callable[[], list[QueueStats]]) -> Callable[[], None]:
        return self._gauges.add(read)
