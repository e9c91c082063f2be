"""What the store says about an instance and its steps: values, no I/O."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

import attrs

#: Stored instance statuses, as written in the ``instances.status`` column.
StatusName = Literal["queued", "running", "suspended", "completed", "failed", "cancelled"]


@attrs.frozen
class MetadataStatus:
    """Base and namespace of the stored status of an instance.

    The variants are ``MetadataStatus.Queued()``, ``.Running()``, ``.Suspended(message)``,
    ``.Completed()``, ``.Failed(message)`` and ``.Cancelled()``; each has ``message`` (None where
    it carries none) and ``is_terminal``.

    >>> from memable import MetadataStatus
    >>> status = MetadataStatus.Failed("boom")
    >>> status, status.message, status.is_terminal
    (MetadataStatus.Failed(message='boom'), 'boom', True)
    >>> isinstance(status, MetadataStatus), MetadataStatus.Running().is_terminal
    (True, False)
    """

    Queued: ClassVar[type[_Queued]]
    Running: ClassVar[type[_Running]]
    Suspended: ClassVar[type[_Suspended]]
    Completed: ClassVar[type[_Completed]]
    Failed: ClassVar[type[_Failed]]
    Cancelled: ClassVar[type[_Cancelled]]

    #: The name stored in the ``status`` column; set on each variant.
    name: ClassVar[StatusName]

    @property
    def is_terminal(self) -> bool:
        """True for Completed, Failed and Cancelled.

        >>> from memable import MetadataStatus
        >>> MetadataStatus.Completed().is_terminal
        True
        """
        return self.name in ("completed", "failed", "cancelled")

    @property
    def message(self) -> str | None:
        """The message this status carries, or None.

        >>> from memable import MetadataStatus
        >>> MetadataStatus.Suspended("waiting").message
        'waiting'
        """
        return None

    @staticmethod
    def from_row(name: str, message: str | None) -> MetadataStatus:
        """Rebuild a status from its stored ``status`` and ``message`` columns.

        >>> from memable import MetadataStatus
        >>> MetadataStatus.from_row("suspended", "wait:v1")
        MetadataStatus.Suspended(message='wait:v1')
        """
        cls = _BY_NAME[name]
        if cls in (_Suspended, _Failed):
            return cls(message or "")
        return cls()


@attrs.frozen
class _Queued(MetadataStatus):
    name: ClassVar[StatusName] = "queued"


@attrs.frozen
class _Running(MetadataStatus):
    name: ClassVar[StatusName] = "running"


@attrs.frozen
class _Suspended(MetadataStatus):
    name: ClassVar[StatusName] = "suspended"
    message: str  # a field where the base has a property


@attrs.frozen
class _Completed(MetadataStatus):
    name: ClassVar[StatusName] = "completed"


@attrs.frozen
class _Failed(MetadataStatus):
    name: ClassVar[StatusName] = "failed"
    message: str  # a field where the base has a property


@attrs.frozen
class _Cancelled(MetadataStatus):
    name: ClassVar[StatusName] = "cancelled"


_BY_NAME: dict[str, type[MetadataStatus]] = {}
for _variant in (_Queued, _Running, _Suspended, _Completed, _Failed, _Cancelled):
    # Named as users spell them, like classes nested in MetadataStatus: reprs and tracebacks
    # read MetadataStatus.Failed, pickle finds them there.
    _label = _variant.name.capitalize()
    _variant.__name__ = _label
    _variant.__qualname__ = f"MetadataStatus.{_label}"
    setattr(MetadataStatus, _label, _variant)
    _BY_NAME[_variant.name] = _variant


@attrs.frozen
class WorkflowMetadata:
    """The stored status and timestamps of one instance.

    Timestamps are aware UTC datetimes; ``completed_at`` is set once the instance is terminal and
    cleared when a resume runs it again.

    >>> from memable import Engine, MetadataStatus
    >>> engine = Engine.in_memory()
    >>> engine.register("wf", lambda ctx: None)
    >>> with engine:
    ...     inv = engine.invoke("wf")
    ...     _ = inv.wait()
    ...     meta = engine.get_metadata("wf", inv.instance_id)
    >>> meta.status == MetadataStatus.Completed(), meta.completed_at is not None
    (True, True)
    >>> def report(ctx):
    ...     ctx.set_status("halfway")
    ...     ctx.suspend("go-on:v1")
    >>> engine = Engine.in_memory()
    >>> engine.register("report", report)
    >>> with engine:
    ...     _ = engine.invoke("report", instance_id="r").wait()
    ...     engine.get_metadata("report", "r").status_message
    'halfway'
    """

    status: MetadataStatus
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None = None
    #: ``(workflow, instance_id)`` of the instance that started this one as a child, or None.
    parent: tuple[str, str] | None = None
    #: The text last given to ``ctx.set_status`` (stored when set, on every run), or None.
    status_message: str | None = None


StepKind = Literal["step", "signal", "timer", "child"]
StepState = Literal["completed", "failed", "waiting", "timed_out"]


@attrs.frozen
class StepRecord:
    """One key an instance reached, as stored.

    ``result`` is the stored value as decoded JSON (not rebuilt into its type), None unless
    ``state`` is ``"completed"``. ``error`` is the last error of a failed step, ``traceback`` its
    traceback (else None). ``attempts`` counts every execution that started, including one lost
    with a dead engine if its heartbeat had named the step in flight.

    >>> from memable import Engine
    >>> def wf(ctx):
    ...     ctx.set_status("fetching")
    ...     ctx.step("fetch:v1").run(lambda: {"n": 1})
    >>> engine = Engine.in_memory()
    >>> engine.register("wf", wf)
    >>> with engine:
    ...     inv = engine.invoke("wf")
    ...     _ = inv.wait()
    ...     [record] = engine.steps("wf", inv.instance_id)
    >>> record.key, record.kind, record.state, record.result, record.status, record.attempts
    ('fetch:v1', 'step', 'completed', {'n': 1}, 'fetching', 1)
    """

    key: str
    kind: StepKind
    state: StepState
    result: Any
    status: str | None
    error: str | None
    attempts: int
    completed_at: datetime | None
    traceback: str | None = None
