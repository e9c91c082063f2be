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
    # For a run of an instance created by this invoke: the input, already
    # validated; the run then needs to read nothing from the store.
    fresh_input: tuple[Any] | None = None
    # For a run that goes straight on from the one before it (what it waited
    # for had arrived): the instance is still claimed, its steps already read.
    snapshot: RunSnapshot | None = None
    # Set by this run when it ends at a wait whose key had completed: the
    # snapshot its successor starts from, and the wait (to release the
    # instance with, should the engine stop first).
    go_on: RunSnapshot | None = None
    waited: Suspension | None = None
    # How the run claims its instance (see Store.begin_run).
    claim: Claim = "resume"
    # Set when the caller (resume) made the claim before the run was submitted,
    # so the call returned with it committed: ``snapshot`` is what it returned
    # (None: nothing to run here).
    claimed: bool = False
    # Set under the runner's lock (Registry.lock) when a signal or timer completed
    # a key while this run was active: if it ends Suspended, run the instance again.
    rerun: bool = False
    # Set under the runner's lock when the instance was cancelled; read without the
    # lock by the run's thread (a stale read is caught by the store's check).
    cancel_requested: bool = False
    # Set when the run must stop waiting (a cancel, or the engine stopping).
    interrupt: threading.Event = attrs.Factory(threading.Event)
    # Keys this engine stored signals for while the run was active (under
    # the runner's lock): a step reaching one refuses it, without a read.
    signalled: set[str] = attrs.Factory(set)
    # The run's Context while its function runs (for the key in flight).
    ctx: Context | None = None
    # The output this run stored when it recorded a Completed end (text, type tag).
    output: tuple[str, str | None] | None = None
    # For a run of an instance created here: the trace context it stored (its span's
    # parent). Other runs read it with the instance.
    traceparent: str | None = None
    # Why the run began, when its starter knows (else judged from what it read).
    reason: RunReason | None = None


#: Draws the random part of new instance ids: a generator of memable's own, so an
#: application's ``random.seed`` cannot make two processes draw the same ids; seeded
#: from the OS here and again in each forked child. Its ``getrandbits`` is one call
#: into C, atomic under the interpreter lock.
_ID_BITS = random.Random()
os.register_at_fork(after_in_child=_ID_BITS.seed)


def new_instance_id(clock: Clock) -> str:
    """A time-ordered (by ``clock``), random instance id (lists read oldest first).

    The 48 random bits come from ``_ID_BITS``, not from ``os.urandom``: a
    system call per id hands the interpreter lock to another thread and waits
    to win it back, on the path of every invoke. An id needs to be unique, not
    secret."""
    return f"{int(clock.wall() * 1000):013d}-{_ID_BITS.getrandbits(48):012x}"


def release(store: RunStore, run: Run, clock: Clock) -> WorkflowState | None:
    """The engine stopped before a run could go on past a satisfied wait: let go.

    The instance is stored suspended on that key, which is complete, and
    marked ready (``children_pending`` 0), so the next engine's poll runs it on.
    """
    waited = run.waited
    assert waited is not None
    try:
        store.finish(run.workflow.name, run.instance_id, RunEnd(
            "suspended", clock.wall(), waited.message, waiting_for=waited.key,
        ))
    except BaseException:
        log.exception("could not release the instance",
                      extra=where(run.workflow.name, run.instance_id))
        return None
    return Suspended(waited.message)


def stored_state(store: RunStore, run: Run) -> WorkflowState | None:
    """What the store says of an instance this run no longer holds.

    None while it is running (another engine has it): the run's watchers
    then follow the instance in the store, whichever engine ends it.
    """
    row = store.get_instance(run.workflow.name, run.instance_id)
    if row is None:
        return Failed("the instance vanished")
    return None if row.status == "running" else state_of(row)
