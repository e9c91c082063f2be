"""One run of an instance, as the runner tracks it from submit to end."""

from __future__ import annotations

import os
import random
import threading
from typing import Any

import attrs

from .._clock import Clock
from .._log import log, where
from .._observe.base import RunReason
from .._states import Failed, Suspended, WorkflowState
from .._store.protocol import RunStore
from .._store.rows import Claim, RunEnd, RunSnapshot
from .context import Context
from .control import Suspension
from .invocation import Watch, state_of
from .workflow import Workflow


@attrs.define(eq=False)
class Run:
    """One execution of an instance's workflow function, from submit to end."""

    workflow: Workflow
    instance_id: str
    watch: Watch
    # The validated input of an instance this invoke created: the run reads nothing.
    fresh_input: tuple[Any] | None = None
    # For a run going straight on from the last (its wait met): still claimed, steps read.
    snapshot: RunSnapshot | None = None
    # Set at an end on a wait already met: the successor's snapshot, and the wait to release.
    go_on: RunSnapshot | None = None
    waited: Suspension | None = None
    claim: Claim = "resume"  # how the run claims its instance (see Store.begin_run)
    # The caller (resume) claimed first: ``snapshot`` is what that returned (None: no run).
    claimed: bool = False
    # Under Registry.lock: a key completed while the run was active; a Suspended end reruns.
    rerun: bool = False
    # Set under the lock on a cancel; read without it (the store's check catches stale reads).
    cancel_requested: bool = False
    # Set when the run must stop waiting (a cancel, or the engine stopping).
    interrupt: threading.Event = attrs.Factory(threading.Event)
    # Under the lock: keys signalled here while the run was active (a step refuses one unread).
    signalled: set[str] = attrs.Factory(set)
    ctx: Context | None = None  # while its function runs (for the key in flight)
    # The output this run stored when it recorded a Completed end (text, type tag).
    output: tuple[str, str | None] | None = None
    # The trace context stored with an instance created here (others read it with the row).
    traceparent: str | None = None
    # Why the run began, when its starter knows (else judged from what it read).
    reason: RunReason | None = None


#: Draws instance ids' random part: memable's own (an app's ``random.seed`` cannot make two
#: processes draw alike), seeded from the OS here and in each forked child; ``getrandbits``
#: is one call into C, atomic under the interpreter lock.
_ID_BITS = random.Random()
os.register_at_fork(after_in_child=_ID_BITS.seed)


def new_instance_id(clock: Clock) -> str:
    """A time-ordered (by ``clock``), random instance id (lists read oldest first). The 48
    random bits come from ``_ID_BITS``, not ``os.urandom``, whose system call per id gives up
    the interpreter lock on every invoke's path. An id is unique, not secret."""
    return f"{int(clock.wall() * 1000):013d}-{_ID_BITS.getrandbits(48):012x}"


def release(store: RunStore, run: Run, clock: Clock) -> WorkflowState | None:
    """The engine stopped before a run could go on past a met wait: store the instance
    suspended on that key and ready, so the next engine's poll runs it on."""
    waited = run.waited
    assert waited is not None
    try:
        store.finish(run.workflow.name, run.instance_id, RunEnd(
            "suspended", clock.wall(), waited.message, waiting_for=waited.key))
    except BaseException:
        log.exception("could not release the instance",
                      extra=where(run.workflow.name, run.instance_id))
        return None
    return Suspended(waited.message)


def stored_state(store: RunStore, run: Run) -> WorkflowState | None:
    """The stored state of an instance this run no longer holds; None while running
    elsewhere (the run's watchers then follow it in the store)."""
    row = store.get_instance(run.workflow.name, run.instance_id)
    if row is None:
        return Failed("the instance vanished")
    return None if row.status == "running" else state_of(row)
