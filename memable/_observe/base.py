"""What an engine reports to tracing and metrics, and the version that does nothing.

Without ``opentelemetry-api``, ``telemetry()`` gives this ``Telemetry`` (the spans and
metrics: the tracing how-to). The stored ``traceparent`` carries no baggage (it often holds
user data); no data point is labelled by a step key or instance id (user strings, unbounded)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Literal

import attrs

#: Why a run of an instance began.
RunReason = Literal[
    "invoke", "signal", "timer", "retry", "child", "recovery", "resume", "schedule"]


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
        """The run ended in ``outcome`` (None: its instance lost) after ``replayed_steps``."""


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
    """What an engine reports: spans and metrics. This one does nothing, for a method call.

    >>> telemetry = Telemetry()
    >>> with telemetry.producing("wf") as traceparent:
    ...     print(traceparent)
    None
    >>> telemetry.run("wf", "i-1", None, "invoke").recording
    False
    """

    @property
    def tracing(self) -> bool:
        """Whether spans are recorded: else no ``traceparent`` is stored or read."""
        return False

    @contextmanager
    def producing(
        self, workflow: str, parent: str | None = None, instance_id: str | None = None
    ) -> Iterator[str | None]:
        """A PRODUCER span ``invoke <workflow>`` around the block, yielding its traceparent
        (None: nothing to store); its parent is the active span, else ``parent``, else none."""
        yield None

    def produce(self, workflow: str, instance_id: str | None = None) -> Produced:
        """A parentless PRODUCER span (a tick's), ended by the caller if the instance was made."""
        return _NO_PRODUCED

    def run(
        self, workflow: str, instance_id: str, traceparent: str | None, reason: RunReason
    ) -> RunTrace:
        """A run of the instance begins (a CONSUMER span, child of ``traceparent``)."""
        return _NO_RUN

    def run_ended(self, workflow: str, outcome: str, seconds: float) -> None:
        """``memable.runs`` and ``memable.run.duration``."""

    def step_ended(self, workflow: str, outcome: str, seconds: float) -> None:
        """``memable.steps`` (completed, failed, timed_out) and ``memable.step.duration``."""

    def step_retried(self, workflow: str) -> None:
        """``memable.step.retries``."""

    def ticks(self, schedule: str, outcome: str, count: int) -> None:
        """``memable.schedule.ticks`` (outcome ``fired``, ``skipped``, ``missed``)."""

    def queue_waited(self, queue: str, seconds: float) -> None:
        """``memable.queue.wait``: from runnable to started."""

    def timer_fired(self, lag: float) -> None:
        """``memable.timer.lag``: from due to fired."""

    def observe_queues(self, read: Callable[[], list[QueueStats]]) -> Callable[[], None]:
        """The queue gauges read ``read()`` at each collection, until the returned call."""
        return lambda: None
