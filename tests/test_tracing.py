"""Spans, in one process, read back with the OpenTelemetry SDK's in-memory exporter.

Each test's engines report to providers of the test's own (the global ones stay
unset: the rest of the suite runs without tracing).
"""

from __future__ import annotations

import re
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from freezegun import freeze_time
from helpers import T0, store_of, write
from opentelemetry import baggage, trace
from opentelemetry import context as otel_context
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from memable import Context, Engine, InstanceFinished, Retry, Suspended
from memable._observe.otel import OpenTelemetry
from memable.testing import advance

TIMEOUT = 10
TRACEPARENT = re.compile(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """Engines made in the test report to an in-memory exporter; yields the exporter."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reader = InMemoryMetricReader()
    telemetry = OpenTelemetry(provider, MeterProvider(metric_readers=[reader]))
    monkeypatch.setattr("memable._engine.engine.telemetry", lambda: telemetry)
    monkeypatch.setattr(sys.modules[__name__], "_TRACER", provider.get_tracer("test"))
    yield exporter
    provider.shutdown()


_TRACER: trace.Tracer = trace.get_tracer("test")


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    [span] = named(exporter, name)
    return span


def parent_of(span: ReadableSpan) -> int | None:
    return None if span.parent is None else span.parent.span_id


def test_an_invoke_is_a_producer_span_and_its_run_a_consumer_child_with_its_steps(
    make_engine: Callable[..., Engine], spans: InMemorySpanExporter,
) -> None:
    """An invoke inside the caller's span is a producer span, child of it; the run is a consumer
    span, child of the invoke, with a span per step, all in the caller's trace, with the SPEC's
    attributes; the instance stores the invoke's traceparent."""
    engine = make_engine()
    engine.register("wf", lambda ctx: ctx.step("a").run(lambda: 1) + ctx.step("b").run(
        lambda: 2))
    with engine, _TRACER.start_as_current_span("POST /orders") as request:
        assert engine.invoke("wf", instance_id="w").result(TIMEOUT) == 3
        [stored] = [row for row, _ in store_of(engine).list_view("wf", None)]
    invoke, run = one(spans, "invoke wf"), one(spans, "workflow wf")
    a, b = one(spans, "step a"), one(spans, "step b")
    assert invoke.kind == SpanKind.PRODUCER
    assert run.kind == SpanKind.CONSUMER
    assert parent_of(invoke) == request.get_span_context().span_id
    assert parent_of(run) == invoke.context.span_id
    assert parent_of(a) == parent_of(b) == run.context.span_id
    assert {s.context.trace_id for s in (invoke, run, a, b)} == {
        request.get_span_context().trace_id}
    assert dict(run.attributes or {}) == {
        "memable.workflow": "wf", "memable.instance_id": "w", "memable.run.reason": "invoke",
        "memable.outcome": "completed", "memable.replayed_steps": 0,
    }
    assert dict(a.attributes or {}) == {"memable.step.key": "a", "memable.step.attempt": 1}
    assert stored.traceparent is not None
    assert TRACEPARENT.fullmatch(stored.traceparent)
    assert stored.traceparent.split("-")[2] == format(invoke.context.span_id, "016x")


def test_a_run_ends_its_span_at_a_suspension_and_a_signal_continues_the_trace(
    make_engine: Callable[..., Engine], spans: InMemorySpanExporter,
) -> None:
    """The first run ends Suspended; the signal's producer span (no active span: a child
    of the stored context) parents the second run, which replays step a and makes no span
    for it."""
    engine = make_engine()

    def wf(ctx: Context) -> str:
        first = ctx.step("a").run(lambda: "a")
        return first + str(ctx.suspend("go"))

    engine.register("wf", wf)
    with engine:
        with _TRACER.start_as_current_span("request"):
            assert engine.invoke("wf", instance_id="w").wait(TIMEOUT) == Suspended("go")
        first = one(spans, "workflow wf")
        assert first.attributes is not None
        assert first.attributes["memable.outcome"] == "suspended"
        assert engine.signal("wf", "w", "go", "!").result(TIMEOUT) == "a!"
    invokes = named(spans, "invoke wf")
    runs = named(spans, "workflow wf")
    assert len(invokes) == 2
    assert len(runs) == 2
    assert len(named(spans, "step a")) == 1  # replayed: no span
    second = runs[1]
    assert second.attributes is not None
    assert second.attributes["memable.run.reason"] == "signal"
    assert second.attributes["memable.replayed_steps"] == 1
    assert second.attributes["memable.outcome"] == "completed"
    signal = invokes[1]
    assert parent_of(signal) == invokes[0].context.span_id
    assert parent_of(second) == signal.context.span_id
    assert len({s.context.trace_id for s in spans.get_finished_spans()}) == 1


def test_a_failed_attempt_records_its_exception_and_each_attempt_is_a_span(
    make_engine: Callable[..., Engine], spans: InMemorySpanExporter,
) -> None:
    """Each attempt of a retried step is a span of its own numbered by attempt: the failed one
    has an error status and records its exception, the one that succeeds leaves the status
    unset."""
    engine = make_engine()
    calls: list[int] = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("gateway timed out")
        return "ok"

    engine.register("wf", lambda ctx: ctx.step("call").retry(
        Retry(max_attempts=2, initial_delay=0.01, jitter=False)).run(flaky))
    with engine:
        assert engine.invoke("wf").result(TIMEOUT) == "ok"
    failed, succeeded = named(spans, "step call")
    assert failed.attributes is not None
    assert succeeded.attributes is not None
    assert (failed.attributes["memable.step.attempt"],
            succeeded.attributes["memable.step.attempt"]) == (1, 2)
    assert failed.status.status_code == StatusCode.ERROR
    assert [e.name for e in failed.events] == ["exception"]
    assert failed.events[0].attributes is not None
    assert failed.events[0].attributes["exception.type"] == "ConnectionError"
    assert succeeded.status.status_code == StatusCode.UNSET


def test_a_failed_run_has_an_error_status(
    make_engine: Callable[..., Engine], spans: InMemorySpanExporter,
) -> None:
    """The span of a run that ends failed has an error status and the outcome failed."""
    engine = make_engine()

    def boom() -> None:
        raise ValueError("no")

    engine.register("wf", lambda ctx: ctx.step("s").run(boom))
    with engine:
        engine.invoke("wf").wait(TIMEOUT)
    run = one(spans, "workflow wf")
    assert run.status.status_code == StatusCode.ERROR
    assert run.attributes is not None
    assert run.attributes["memable.outcome"] == "failed"


@pytest.mark.parametrize("why", ["timer", "retry", "resume"])
def test_the_run_reason_names_what_started_the_run(
    make_engine: Callable[..., Engine], spans: InMemorySpanExporter, why: str,
) -> None:
    """The second run's span names why it began (timer, retry or resume) on a frozen clock; the
    first run's says invoke."""
    engine = make_engine(poll_interval=60)
    attempts: list[int] = []

    def flaky() -> int:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("later")
        return 1

    bodies: dict[str, Any] = {
        "timer": lambda ctx: ctx.timer("t", 60),
        "retry": lambda ctx: ctx.step("s").retry(
            Retry(max_attempts=2, initial_delay=5, jitter=False)).run(flaky),
        "resume": lambda ctx: ctx.step("s").run(flaky),
    }
    engine.register("wf", bodies[why])
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf", instance_id="w")
        inv.wait(TIMEOUT)
        if why == "resume":
            engine.resume("wf", "w").wait(TIMEOUT)
        else:
            advance(engine, clock, 60)
            inv.wait(TIMEOUT)
            engine.invocation("wf", "w").result(TIMEOUT)
    reasons = [s.attributes["memable.run.reason"] for s in named(spans, "workflow wf")
               if s.attributes is not None]
    assert reasons == ["invoke", why]


def test_a_child_start_is_a_producer_span_inside_its_parents_run(
    make_engine: Callable[..., Engine], spans: InMemorySpanExporter,
) -> None:
    """Starting a child is a producer span inside the parent's run; the child's run is its
    consumer child, and the parent's run that then goes on says reason child."""
    engine = make_engine()
    engine.register("child", lambda ctx: "done")
    engine.register("parent", lambda ctx: ctx.child("c", "child"))
    with engine:
        assert engine.invoke("parent", instance_id="p").result(TIMEOUT) == "done"
    parent_runs = named(spans, "workflow parent")
    start = one(spans, "invoke child")
    child_run = one(spans, "workflow child")
    assert parent_of(start) == parent_runs[0].context.span_id
    assert parent_of(child_run) == start.context.span_id
    assert parent_runs[-1].attributes is not None
    assert parent_runs[-1].attributes["memable.run.reason"] == "child"


def test_a_schedule_tick_is_the_root_of_a_trace_of_its_own(
    make_engine: Callable[..., Engine], spans: InMemorySpanExporter,
) -> None:
    """A schedule's tick makes a producer span with no parent, the root of a trace of its own,
    and the run it starts is its child with reason schedule."""
    engine = make_engine(poll_interval=60)
    engine.register("job", lambda ctx: None)
    engine.schedule("hourly", "0 * * * *", "job")
    with freeze_time("2026-06-01 09:59:00") as clock, engine:
        advance(engine, clock, 60)
        engine.invocation("job", "hourly@2026-06-01T10:00:00Z").wait(TIMEOUT)
    tick, run = one(spans, "invoke job"), one(spans, "workflow job")
    assert tick.parent is None
    assert parent_of(run) == tick.context.span_id
    assert run.attributes is not None
    assert run.attributes["memable.run.reason"] == "schedule"


def test_baggage_is_not_stored(
    make_engine: Callable[..., Engine], spans: InMemorySpanExporter,
) -> None:
    """Only the traceparent is stored with an instance: a caller's baggage often carries
    user data, and is left where it was."""
    engine = make_engine()
    engine.register("wf", lambda ctx: None)
    token = otel_context.attach(baggage.set_baggage("user.email", "ada@example.com"))
    try:
        with engine:
            engine.invoke("wf", instance_id="w").result(TIMEOUT)
            [row] = [row for row, _ in store_of(engine).list_view("wf", None)]
    finally:
        otel_context.detach(token)
    assert "ada@example.com" not in repr(row)
    assert row.traceparent is not None
    assert TRACEPARENT.fullmatch(row.traceparent)


def test_without_a_tracer_provider_nothing_is_stored(make_engine: Callable[..., Engine]) -> None:
    """The API installed, no SDK configured: spans are no-ops and no traceparent is kept."""
    engine = make_engine()
    engine.register("wf", lambda ctx: ctx.step("a").run(lambda: 1))
    with engine:
        engine.invoke("wf", instance_id="w").result(TIMEOUT)
        [row] = [row for row, _ in store_of(engine).list_view("wf", None)]
    assert row.traceparent is None


def test_without_a_tracer_provider_an_ambient_context_is_not_stored_either(
    make_engine: Callable[..., Engine],
) -> None:
    """No SDK configured, and the invoking code inside a trace it was handed (a valid
    span context, not recording, as a propagator leaves it): the instance keeps no
    traceparent, and its run sees no span of that trace."""
    seen: list[bool] = []
    engine = make_engine()
    engine.register("wf", lambda ctx: ctx.step("a").run(
        lambda: seen.append(trace.get_current_span().get_span_context().is_valid)))
    handed = trace.SpanContext(0x1234, 0x5678, is_remote=True,
                               trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED))
    with engine:
        token = otel_context.attach(trace.set_span_in_context(trace.NonRecordingSpan(handed)))
        try:
            engine.invoke("wf", instance_id="w").result(TIMEOUT)
        finally:
            otel_context.detach(token)
        [row] = [row for row, _ in store_of(engine).list_view("wf", None)]
    assert row.traceparent is None
    assert seen == [False]


def test_import_memable_imports_no_opentelemetry_module() -> None:
    """``import memable`` in a fresh process loads no opentelemetry module: tracing stays an
    optional dependency."""
    found = subprocess.run(
        [sys.executable, "-c",
         "import memable, sys; print(sorted(m for m in sys.modules "
         "if m.startswith('opentelemetry')))"],
        capture_output=True, text=True, check=True,
    )
    assert found.stdout == "[]\n"


def test_a_run_that_takes_over_a_dead_engines_instance_says_recovery(
    open_shared: Callable[..., Engine], spans: InMemorySpanExporter,
) -> None:
    """Engine a runs step s and is taken for dead (its owner row gone); engine b's poll
    recovers the instance: its run's span says so."""
    gate = threading.Event()
    entered = threading.Semaphore(0)

    def wf(ctx: Context) -> str:
        ctx.step("s").run(lambda: entered.release() or gate.wait(TIMEOUT))
        return "done"

    first = open_shared(poll_interval=60, lease=600)
    first.register("wf", wf)
    second = open_shared(poll_interval=0.05, lease=600)
    second.register("wf", wf)
    with first:
        first.invoke("wf", instance_id="w")
        assert entered.acquire(timeout=TIMEOUT)
        write(first, "DELETE FROM memable_owners WHERE id = ?", (store_of(first).owner,))
        with second:
            assert entered.acquire(timeout=TIMEOUT)  # b runs step s again
            gate.set()
            assert second.invocation("wf", "w").result(TIMEOUT) == "done"
    reasons = sorted(s.attributes["memable.run.reason"] for s in named(spans, "workflow wf")
                     if s.attributes is not None)
    assert reasons == ["invoke", "recovery"]


def test_a_run_a_resume_queued_says_resume(
    make_engine: Callable[..., Engine], spans: InMemorySpanExporter,
) -> None:
    """The resume's claim queues the instance; the queue's consumer runs it later: the run
    still says why it began (not the failed step it stopped at)."""
    engine = make_engine()
    engine.queue("q")
    calls: list[int] = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("no")
        return 1

    engine.register("wf", lambda ctx: ctx.step("s").run(flaky), queue="q")
    with engine:
        engine.invoke("wf", instance_id="w").wait(TIMEOUT)
        assert engine.resume("wf", "w").result(TIMEOUT) == 1
    reasons = [s.attributes["memable.run.reason"] for s in named(spans, "workflow wf")
               if s.attributes is not None]
    assert reasons == ["invoke", "resume"]


def test_a_rejected_signal_leaves_the_stored_context_and_its_span_says_error(
    make_engine: Callable[..., Engine], spans: InMemorySpanExporter,
) -> None:
    """A signal to a finished instance, refused with InstanceFinished, leaves the instance's
    stored traceparent as it was, and its producer span has an error status."""
    engine = make_engine()
    engine.register("wf", lambda ctx: str(ctx.suspend("go")))
    with engine:
        engine.invoke("wf", instance_id="w").wait(TIMEOUT)
        engine.signal("wf", "w", "go", "first").wait(TIMEOUT)
        [before] = [row.traceparent for row, _ in store_of(engine).list_view("wf", None)]
        with pytest.raises(InstanceFinished):
            engine.signal("wf", "w", "go", "again")
        [after] = [row.traceparent for row, _ in store_of(engine).list_view("wf", None)]
    assert after == before
    rejected = named(spans, "invoke wf")[-1]
    assert rejected.status.status_code == StatusCode.ERROR


def test_a_tick_another_engine_fired_or_a_skipped_tick_leaves_no_span(
    open_shared: Callable[..., Engine], spans: InMemorySpanExporter,
) -> None:
    """Two engines fire the 10:00 tick (one makes it); the 11:00 tick is skipped (10:00
    waits on a signal): one producer span in all, the one whose instance was made."""
    engines = []
    for _ in range(2):
        engine = open_shared(poll_interval=60)
        engine.register("job", lambda ctx, tick: ctx.suspend("done"))
        engine.schedule("hourly", "0 * * * *", "job", overlap="skip")
        engines.append(engine)
    with freeze_time("2026-06-01 09:59:00") as clock:
        for engine in engines:
            engine.start()
        for moment in ("2026-06-01 10:00:00", "2026-06-01 11:00:00"):
            clock.move_to(moment)
            for engine in engines:
                engine.fire_due_timers()
        for engine in engines:
            engine.close()
    [tick] = named(spans, "invoke job")
    assert tick.attributes is not None
    assert tick.attributes["memable.instance_id"] == "hourly@2026-06-01T10:00:00Z"
