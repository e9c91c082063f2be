"""Metrics, read back through the OpenTelemetry SDK's in-memory reader: the SPEC's
instruments, in seconds where they are durations, and no data point labelled by a step
key or an instance id."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from freezegun import freeze_time
from helpers import T0, store_of
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, Metric

from memable import Context, Engine, Queued, Retry, Suspended
from memable._observe.otel import OpenTelemetry
from memable.testing import advance

TIMEOUT = 10


@pytest.fixture
def reader(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemoryMetricReader]:
    """Engines made in the test report to a meter provider of the test's own."""
    metrics = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[metrics])
    telemetry = OpenTelemetry(meter_provider=provider)
    monkeypatch.setattr("memable._engine.engine.telemetry", lambda: telemetry)
    yield metrics
    provider.shutdown()


def collected(reader: InMemoryMetricReader) -> dict[str, Metric]:
    data = reader.get_metrics_data()
    assert data is not None
    return {
        metric.name: metric
        for resource in data.resource_metrics
        for scope in resource.scope_metrics if scope.scope.name == "memable"
        for metric in scope.metrics
    }


def points(metric: Metric) -> list[tuple[dict[str, Any], Any]]:
    """(attributes, value) of each data point: a sum's value, a histogram's count, a
    gauge's value."""
    found = []
    for point in metric.data.data_points:
        value = getattr(point, "value", None)
        if value is None:
            value = point.count  # type: ignore[union-attr]
        found.append((dict(point.attributes or {}), value))
    return sorted(found, key=repr)


def test_runs_steps_and_retries_are_counted_by_workflow_and_outcome(
    make_engine: Callable[..., Engine], reader: InMemoryMetricReader,
) -> None:
    """Runs and step attempts are counted by workflow and outcome (a retried step's failed first
    attempt too), retries by workflow, and run and step durations are histograms in seconds."""
    engine = make_engine()
    calls: list[int] = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise ConnectionError("later")
        return 1

    def boom() -> None:
        raise ValueError("no")

    engine.register("ok", lambda ctx: ctx.step("s").retry(
        Retry(max_attempts=2, initial_delay=0.01, jitter=False)).run(flaky))
    engine.register("bad", lambda ctx: ctx.step("s").run(boom))
    with engine:
        engine.invoke("ok", instance_id="order-17").result(TIMEOUT)
        engine.invoke("bad", instance_id="order-18").wait(TIMEOUT)
        metrics = collected(reader)
    assert points(metrics["memable.runs"]) == [
        ({"workflow": "bad", "outcome": "failed"}, 1),
        ({"workflow": "ok", "outcome": "completed"}, 1),
    ]
    assert points(metrics["memable.steps"]) == [
        ({"workflow": "bad", "outcome": "failed"}, 1),
        ({"workflow": "ok", "outcome": "completed"}, 1),
        ({"workflow": "ok", "outcome": "failed"}, 1),
    ]
    assert points(metrics["memable.step.retries"]) == [({"workflow": "ok"}, 1)]
    assert metrics["memable.run.duration"].unit == "s"
    assert metrics["memable.step.duration"].unit == "s"
    assert points(metrics["memable.run.duration"]) == [
        ({"workflow": "bad"}, 1), ({"workflow": "ok"}, 1)]
    assert points(metrics["memable.step.duration"]) == [
        ({"workflow": "bad"}, 1), ({"workflow": "ok"}, 2)]


def test_a_timed_out_attempt_is_counted_timed_out(
    make_engine: Callable[..., Engine], reader: InMemoryMetricReader,
) -> None:
    """A step attempt that overruns its timeout is counted with the outcome timed_out."""
    engine = make_engine()
    release = threading.Event()
    engine.register("wf", lambda ctx: ctx.step("slow").timeout(0.05).run(
        lambda: release.wait(TIMEOUT)))
    with engine:
        engine.invoke("wf").wait(TIMEOUT)
        release.set()
        metrics = collected(reader)
    assert points(metrics["memable.steps"]) == [({"workflow": "wf", "outcome": "timed_out"}, 1)]


def test_a_suspended_run_is_counted_and_a_timer_reports_its_lag(
    make_engine: Callable[..., Engine], reader: InMemoryMetricReader,
) -> None:
    """A run that suspends on a timer is counted suspended and its next run completed; the
    timer, fired 30 s past its deadline on a frozen clock, reports a lag of 30 s."""
    engine = make_engine(poll_interval=60)
    engine.register("wf", lambda ctx: ctx.timer("t", 60))
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf", instance_id="w")
        assert inv.wait(TIMEOUT) == Suspended("timer t")
        advance(engine, clock, 90)  # fired 30 s after its deadline
        inv.result(TIMEOUT)
        metrics = collected(reader)
    assert points(metrics["memable.runs"]) == [
        ({"workflow": "wf", "outcome": "completed"}, 1),
        ({"workflow": "wf", "outcome": "suspended"}, 1),
    ]
    [lag] = metrics["memable.timer.lag"].data.data_points
    assert (lag.count, lag.sum) == (1, 30.0)  # type: ignore[union-attr]
    assert metrics["memable.timer.lag"].unit == "s"


def test_a_timer_judged_due_after_the_clock_moved_reports_the_lag_since_its_deadline(
    make_engine: Callable[..., Engine], reader: InMemoryMetricReader,
) -> None:
    """The clock moves 90 s (30 s past the deadline) after the look read the time, before
    the store judges the timer due: the lag is 30 s, by a reading after the firing, not 0
    by the one before it (the timer thread met this under CI)."""
    engine = make_engine(poll_interval=60)
    engine.register("wf", lambda ctx: ctx.timer("t", 60))
    store: Any = store_of(engine)
    fire, caller = store.fire_due_timers, threading.current_thread()
    fired = threading.Event()  # set once this thread's firing returned

    def moved_then_fired(*args: Any) -> Any:
        if threading.current_thread() is not caller:
            # The timer thread's looks find nothing due until this thread fired: the
            # firing measured is the one that read the time before the clock moved.
            return fire(*args) if fired.is_set() else []
        clock.tick(90)
        try:
            return fire(*args)
        finally:
            fired.set()

    store.fire_due_timers = moved_then_fired  # (before any look of the timer thread)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf", instance_id="w")
        assert inv.wait(TIMEOUT) == Suspended("timer t")
        assert engine.fire_due_timers() == 1
        inv.result(TIMEOUT)
        metrics = collected(reader)
    [lag] = metrics["memable.timer.lag"].data.data_points
    assert (lag.count, lag.sum) == (1, 30.0)  # type: ignore[union-attr]


def test_schedule_ticks_are_counted_fired_skipped_and_missed(
    make_engine: Callable[..., Engine], reader: InMemoryMetricReader,
) -> None:
    """A schedule's ticks are counted by outcome: fired, skipped (the previous tick's instance
    has not ended, overlap=skip) and missed (catch_up=none, the clock jumping past three
    ticks)."""
    engine = make_engine(poll_interval=60)
    engine.register("job", lambda ctx, tick: ctx.suspend("done"))
    engine.schedule("hourly", "0 * * * *", "job", overlap="skip", catch_up="none")
    with freeze_time("2026-06-01 09:59:00") as clock, engine:
        advance(engine, clock, 60)  # 10:00 fires
        advance(engine, clock, 3600)  # 11:00 skipped: 10:00 has not ended
        advance(engine, clock, 3 * 3600 + 600)  # 12:00 .. 14:00 missed
        metrics = collected(reader)
    assert points(metrics["memable.schedule.ticks"]) == [
        ({"schedule": "hourly", "outcome": "fired"}, 1),
        ({"schedule": "hourly", "outcome": "missed"}, 3),
        ({"schedule": "hourly", "outcome": "skipped"}, 1),
    ]


def test_a_queue_reports_its_wait_and_its_gauges(
    make_engine: Callable[..., Engine], reader: InMemoryMetricReader,
) -> None:
    """One slot, held by a run waiting on an event; a second instance queued behind it."""
    engine = make_engine(poll_interval=60)
    engine.queue("serial", concurrency=1)
    release = threading.Event()
    started = threading.Event()

    def slow(ctx: Context) -> None:
        started.set()
        ctx.step("work").run(lambda: release.wait(TIMEOUT))

    engine.register("job", slow, queue="serial")
    with engine:
        first = engine.invoke("job", instance_id="first")
        assert started.wait(TIMEOUT)
        second = engine.invoke("job", instance_id="second")
        assert second.state == Queued()
        gauges = collected(reader)
        release.set()
        first.result(TIMEOUT)
        second.result(TIMEOUT)
        metrics = collected(reader)
    assert points(gauges["memable.queue.queued"]) == [({"queue": "serial"}, 1)]
    assert points(gauges["memable.queue.running"]) == [({"queue": "serial"}, 1)]
    [(attrs, age)] = points(gauges["memable.queue.oldest_age"])
    assert attrs == {"queue": "serial"}
    assert age >= 0
    assert points(metrics["memable.queue.wait"]) == [({"queue": "serial"}, 2)]
    assert metrics["memable.queue.wait"].unit == "s"


def test_no_data_point_carries_a_step_key_or_an_instance_id(
    make_engine: Callable[..., Engine], reader: InMemoryMetricReader,
) -> None:
    """No data point is labelled with anything but workflow, outcome, queue or schedule: neither
    an instance id (here an e-mail address) nor a step key shows up."""
    engine = make_engine()
    engine.queue("q")
    engine.register("wf", lambda ctx, n: ctx.step(f"charge-{n}:v1").run(lambda: n),
                    queue="q")
    with engine:
        for n in range(3):
            engine.invoke("wf", n, instance_id=f"customer-{n}@example.com").result(TIMEOUT)
        metrics = collected(reader)
    assert metrics
    labels = {
        (key, str(value))
        for metric in metrics.values() for attributes, _ in points(metric)
        for key, value in attributes.items()
    }
    assert {key for key, _ in labels} <= {"workflow", "outcome", "queue", "schedule"}
    assert not [v for _, v in labels if "customer" in v or "charge" in v]
