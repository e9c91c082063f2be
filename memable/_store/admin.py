"""Signal, resume, cancel and purge as store operations, shared by the engine and the CLI.

Each is one transaction on the store and needs no running engine: the
engine calls them and then wakes its own runs; the command line calls them
on a store that an engine elsewhere acts on within its poll interval.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .._validate import check_key, seconds_of
from .protocol import Store
from .rows import Ended, StepWrite, utcnow
from .serde import store_form


def store_signal(
    store: Store, workflow: str, instance_id: str, key: str, payload: Any,
    traceparent: str | None = None,
) -> None:
    """Store ``payload`` as the value of the suspend point ``key`` (with the trace context
    its next run continues, if given).

    Raise ``InvalidKey``, ``SerializationError``, ``InstanceNotFound``,
    ``InstanceFinished`` or ``SignalRejected``; each writes nothing.
    """
    check_key(key, workflow, instance_id)
    text, tag, _ = store_form(workflow, instance_id, key, payload)
    store.deliver_signal(
        StepWrite(
            workflow=workflow, instance_id=instance_id, key=key, seq=0, kind="signal",
            state="completed", result=text, result_type=tag, status=None, error=None,
            at=utcnow().isoformat(),
        ),
        traceparent,
    )


def resume_instance(store: Store, workflow: str, instance_id: str) -> str:
    """Mark a failed, suspended or completed instance to run again, for an engine on the
    store that runs its workflow; return the status it had (a running or queued one is
    left as it is). ``InstanceNotFound``; ``InstanceFinished`` for a Cancelled one."""
    return store.mark_resumable(workflow, instance_id, utcnow().isoformat())


def cancel_instance(store: Store, workflow: str, instance_id: str) -> Ended:
    """Mark the instance and its descendants Cancelled and drop their timers
    (``InstanceFinished`` if it ended)."""
    return store.cancel(workflow, instance_id, now=utcnow().isoformat())


def purge_finished(store: Store, older_than: float | timedelta) -> int:
    """Delete instances that finished more than ``older_than`` ago; return how many."""
    seconds = seconds_of(older_than, "purge age")
    try:
        # An instance completed this very microsecond counts as older than 0 s.
        cutoff = utcnow() - timedelta(seconds=seconds) + timedelta(microseconds=1)
    except OverflowError:  # older than the calendar goes: nothing is that old
        return 0
    return store.purge(cutoff.isoformat())
