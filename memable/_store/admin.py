"""Operator actions as store operations, shared by the engine, the CLI and the dashboard.

Each is one transaction (a purge or a bulk resume, one per batch or instance) and needs no running
engine; each dates what it writes by its caller's ``clock`` (``Options.clock``, or
``SYSTEM_CLOCK``)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

from .._clock import Clock, utc
from .._errors import InvalidKey
from .._queues import check_queue_name
from .._validate import check_key, seconds_of
from .operator import OperatorStore
from .protocol import RunStore
from .rows import Ended, StepWrite
from .serde import store_form


def store_signal(
    store: RunStore, workflow: str, instance_id: str, key: str, payload: Any,
    traceparent: str | None = None, *, clock: Clock,
) -> None:
    """Store ``payload`` as the value of the suspend point ``key`` (and the trace context).

    Raise ``InvalidKey``, ``SerializationError``, ``InstanceNotFound``, ``InstanceFinished`` or
    ``SignalRejected``; each writes nothing."""
    check_key(key, workflow, instance_id)
    text, tag, _ = store_form(workflow, instance_id, key, payload)
    store.deliver_signal(StepWrite(workflow=workflow, instance_id=instance_id, key=key, seq=0,
        kind="signal", state="completed", result=text, result_type=tag, status=None, error=None,
        at=clock.wall()), traceparent)


def resume_instance(store: OperatorStore, workflow: str, instance_id: str, *, clock: Clock) -> str:
    """Mark a failed, suspended or completed instance to run again, for an engine on the
    store that runs its workflow; return the status it had (a running or queued one is
    left as it is). ``InstanceNotFound``; ``InstanceFinished`` for a Cancelled one."""
    return store.mark_resumable(workflow, instance_id, clock.wall())


def resume_failed(
    store: OperatorStore, workflow: str | None, *, id_prefix: str | None = None,
    since: float | None = None, until: float | None = None, limit: int = 1000,
    counted: list[tuple[str, str, str]] | None = None, clock: Clock,
) -> list[tuple[str, str]]:
    """Resume the failed instances of a filter (``OperatorStore.failed_instances``), oldest failure
    first, each as ``resume_instance`` does; return (workflow, id) of those resumed.

    It acts on exactly the failures counted (``counted``, as a caller that showed their number got
    them; None: counted here), at most ``limit``. One that is no longer that failure when its turn
    comes (resumed, failed again, purged or cancelled), or whose parent has handled it since, is
    passed over."""
    if counted is None:
        counted = store.failed_instances(
            workflow, id_prefix=id_prefix, since=since, until=until, limit=limit)
    now = clock.wall()
    return [(name, instance_id) for name, instance_id, failed_at in counted[:limit]
            if store.resume_failure(name, instance_id, failed_at, now)]


def fork_instance(
    store: RunStore, workflow: str, instance_id: str, from_key: str | None = None,
    new_instance_id: str | None = None, *, clock: Clock,
) -> tuple[str, bool]:
    """Fork the instance from ``from_key`` (``RunStore.fork_instance``) as ``new_instance_id``
    (None: ``"{id}.fork-{8 hex digits}"``, so a search by the source's id finds its forks); return
    the new id, and whether this call made it (False: that id existed; nothing was written).

    ``InvalidKey`` for a bad new id, ``InstanceNotFound``, ``StepNotFound``."""
    if from_key is not None and (not isinstance(from_key, str) or not from_key):
        raise InvalidKey(from_key, "keys are non-empty str", workflow=workflow,
                         instance_id=instance_id)
    new_id = (f"{instance_id}.fork-{uuid.uuid4().hex[:8]}" if new_instance_id is None
              else new_instance_id)
    check_key(new_id, workflow, instance_id)
    made = store.fork_instance(workflow, instance_id, new_id, from_key, clock.wall())
    return new_id, made


def cancel_instance(store: RunStore, workflow: str, instance_id: str, *, clock: Clock) -> Ended:
    """Mark the instance and its descendants Cancelled and drop their timers
    (``InstanceFinished`` if it ended)."""
    return store.cancel(workflow, instance_id, now=clock.wall())


#: Most instances one purge transaction deletes (retention's and a one-off purge's).
PURGE_BATCH = 500


def purge_batches(
    store: OperatorStore, completed_before: float, now: float,
    stop: Callable[[], bool] | None = None,
) -> Iterator[int]:
    """Purge what finished before ``completed_before`` (leases judged at ``now``; both epoch
    seconds, UTC) in batches of at most ``PURGE_BATCH``, one transaction each, so another engine's
    write waits at most one batch; yield each batch's count, going on while a batch was full and
    ``stop`` (asked between batches) says no.

    >>> from memable._sqlite.store import SQLiteStore
    >>> store = SQLiteStore(None, "full")
    >>> list(purge_batches(store, 1767225600.0, 1767225600.0))
    [0]
    >>> store.close()
    """
    while True:
        deleted = store.purge_batch(completed_before, PURGE_BATCH, now)
        yield deleted
        if deleted < PURGE_BATCH or (stop is not None and stop()):
            return


def purge_finished(store: OperatorStore, older_than: float | timedelta, *, clock: Clock) -> int:
    """Delete instances that finished more than ``older_than`` before ``clock``'s now, in
    batches of one transaction each; return how many."""
    seconds = seconds_of(older_than, "purge age")
    now = utc(clock)
    try:
        # An instance completed this very microsecond counts as older than 0 s.
        cutoff = now - timedelta(seconds=seconds) + timedelta(microseconds=1)
    except OverflowError:  # older than the calendar goes: nothing is that old
        return 0
    return sum(purge_batches(store, cutoff.timestamp(), now.timestamp()))


def pause_queue(store: OperatorStore, queue: str, *, clock: Clock) -> bool:
    """Store ``queue`` as paused (see ``Engine.pause_queue``); return whether it was running
    (False: nothing was written). ``ValueError`` for a name that is not a non-empty str."""
    return store.set_queue_paused(check_queue_name(queue), True, clock.wall())


def resume_queue(store: OperatorStore, queue: str, *, clock: Clock) -> bool:
    """Store ``queue`` as not paused: its consumers start its queued instances again; return
    whether it was paused (False: nothing was written)."""
    return store.set_queue_paused(check_queue_name(queue), False, clock.wall())
