"""What an engine reports to tracing and metrics, and the version that does nothing.

``memable._observe.telemetry()`` gives what an engine reports through: with the extra
``memable-engine[otel]`` (``opentelemetry-api``) installed, spans and
metrics made through the global tracer and meter providers (whatever the
application configured with the SDK; with none configured, no span is
made); without it, ``Telemetry``, which does nothing. ``import memable``
imports no OpenTelemetry module: ``telemetry()`` imports it (and
``memable._observe.otel``) when an engine is made.

Spans: ``invoke <workflow>`` (PRODUCER) where an instance is invoked,
signalled, resumed, started as a child or fired as a tick, whose W3C
``traceparent`` is stored with the instance (no baggage: it often carries
user data); ``workflow <name>`` (CONSUMER) for each run, a child of the stored
context, ended when the run ends (at a suspension too); ``step <key>`` for each
executed attempt. Metrics: a ``Meter`` named ``memable``; no data point is
labelled by a step key or an instance id (user strings, unbounded).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import attrs

#: Why a run of an instance began.
RunReason = Literal[
    "invoke", "signal", "timer", "retry", "child", "recovery", "resume", "schedule"
]


@attrs.frozen
class QueueStats:
    """What the queue gauges show of one queue, read when the meter collects."""

    queue: str
    queued: int
    running: int
    #: Seconds the oldest runnable instance has waited (0 when none waits).
    oldest_age: float


class StepTrace:
    """One executed attempt of a step; this one records nothing."""

    def failed(self, exc: BaseException) -> None:
        """The attempt raised ``exc`` (or timed out)."""

    def end(self) -> None:
        """The attempt is over."""


class RunTrace:
    """One run of an instance; this one records nothing."""

    #: Whether anything is recorded (an application configured tracing).
    recording = False

    @contextmanager
    def current(self) -> Iterator[None]:
        """The run's span is the active one within (spans made there are its children)."""
        yield

    def step(self, key: str, attempt: int) -> StepTrace:
        """An attempt of ``key`` starts, as a child of the run."""
        return _NO_STEP

    def end(self, outcome: str | None, replayed_steps: int) -> None:
        """The run ended in ``outcome`` (None: not recorded here, its instance lost), after
        replaying ``replayed_steps`` stored steps."""


class Produced:
    """A PRODUCER span started but not yet ended (this one records nothing)."""

    #: Its W3C trace context, to store with the instance (None: nothing to store).
    traceparent: str | None = None

    def end(self) -> None:
        """End it: only for an instance that was made (one never ended is never exported)."""


_NO_PRODUCED = Produced()
_NO_STEP = StepTrace()
_NO_RUN = RunTrace()


class Telemetry:
    """What an engine reports: spans and metrics. This one, without OpenTelemetry, does
    nothing, at the cost of a method call.

    >>> telemetry = Telemetry()
    >>> with telemetry.producing("wf") as traceparent:
    ...     print(traceparent)
    None
    >>> telemetry.run("wf", "i-1", None, "invoke").recording
    False
    """

    @property
    def tracing(self) -> bool:
        """Whether spans are recorded (an application set a tracer provider): else no
        ``traceparent`` is stored, and none is read to continue a trace."""
        return False

    @contextmanager
    def producing(
        self, workflow: str, parent: str | None = None, instance_id: str | None = None
    ) -> Iterator[str | None]:
        """A PRODUCER span ``invoke <workflow>`` around the block; yield its traceparent to
        store with the instance (None: nothing to store). Its parent is the active span,
        else ``parent`` (the instance's stored context), else none."""
        yield None

    def produce(self, workflow: str, instance_id: str | None = None) -> Produced:
        """A PRODUCER span ``invoke <workflow>`` started with no parent (a schedule's tick),
        ended by the caller if the instance was made."""
        return _NO_PRODUCED

    def run(
        self, workflow: str, instance_id: str, traceparent: str | None, reason: RunReason
    ) -> RunTrace:
        """A run of the instance begins (a CONSUMER span, child of ``traceparent``)."""
        return _NO_RUN

    def run_ended(self, workflow: str, outcome: str, seconds: float) -> None:
        """``memable.runs`` and ``memable.run.duration``."""

    def step_ended(self, workflow: str, outcome: str, seconds: float) -> None:
        """``memable.steps`` (outcome ``completed``, ``failed``, ``timed_out``) and
        ``memable.step.duration``."""

    def step_retried(self, workflow: str) -> None:
        """``memable.step.retries``."""

    def ticks(self, schedule: str, outcome: str, count: int) -> None:
        """``memable.schedule.ticks`` (outcome ``fired``, ``skipped``, ``missed``)."""

    def queue_waited(self, queue: str, seconds: float) -> None:
        """``memable.queue.wait``: from runnable to started."""

    def timer_fired(self, lag: float) -> None:
        """``memable.timer.lag``: from due to fired."""

    def observe_queues(self, read: Callable[[], list[QueueStats]]) -> Callable[[], None]:
        """The queue gauges read ``read()`` each time the meter collects, until the
        returned function is called."""
        return lambda: None
