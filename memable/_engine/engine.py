"""The engine's public face: registry, lifecycle, invoking, signalling and reading."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from datetime import timezone as dt_timezone
from types import TracebackType
from typing import Any, TypeVar

import attrs

from .._clock import Clock, iso_utc
from .._errors import InstanceFinished, InstanceNotFound, SerializationError, WorkflowNotFound
from .._log import log, where
from .._observe import telemetry
from .._queues import QueueSpec, check_consumed
from .._records import StepRecord, WorkflowMetadata
from .._retry import Retry
from .._run.context import Context
from .._run.invocation import Invocation
from .._run.invoking import NO_INPUT, new_instance
from .._run.options import Options
from .._run.runner import Runner
from .._run.workflow import Made, Workflow
from .._schedules.scheduler import Scheduler, tick_instance
from .._schedules.spec import CatchUp, Overlap, ScheduleSpec
from .._store import admin
from .._store.admin import cancel_instance, purge_finished, store_signal
from .._store.protocol import Store, Synchronous
from .._store.rows import InstanceRow, metadata_of
from .._store.sql.instances import START_KEY
from .._validate import check_deadline, positive_seconds, seconds_of
from .builder import EngineBuilder
from .stored import decode_output, stored_row

F = TypeVar("F", bound=Callable[..., Any])


class Engine:
    """The durable execution engine: registered workflows, run on a thread pool.

    Build it with ``Engine.in_memory()``, ``Engine.open(path)`` or ``Engine.builder()``; register
    workflows; ``start()``; invoke them by name; ``wait_all()`` or ``stop()``, then ``close()``.
    ``with engine:`` starts it, and on exit drains and closes it.

    >>> from memable import Completed, Context, Engine
    >>> def greet(ctx: Context) -> str:
    ...     name = ctx.step("fetch-name:v1").run(lambda: "world")
    ...     return f"hello {name}"
    >>> engine = Engine.in_memory()
    >>> engine.register("greet", greet)
    >>> with engine:
    ...     inv = engine.invoke("greet")
    ...     print(inv.wait(), inv.result())
    completed hello world
    """

    def __init__(self, store: Store, options: Options) -> None:
        """Use ``Engine.in_memory``, ``Engine.open`` or ``Engine.builder`` instead."""
        self._store = store
        self._telemetry = telemetry()  # through OpenTelemetry, if it is installed
        # The runner owns the lock, the registry, the runs and the threads.
        self._runner = Runner(store, options, self._telemetry)
        self._schedules = Scheduler(self._runner)
        self._runner.add_ticker(self._schedules)

    def __repr__(self) -> str:
        return f"<Engine {self._runner.phase} workflows={sorted(self._runner.workflows)}>"

    @staticmethod
    def builder() -> EngineBuilder[Engine]:
        """Start configuring an engine: ``.in_memory()`` or ``.open(path)``, then ``.build()``.

        >>> from memable import Engine
        >>> engine = Engine.builder().in_memory().max_workers(2).build()
        >>> engine
        <Engine new workflows=[]>
        >>> engine.close()
        """
        return EngineBuilder(factory=Engine)

    @classmethod
    def in_memory(
        cls, *, max_workers: int = 8, synchronous: Synchronous = "full",
        poll_interval: float | timedelta = 1.0, lease: float | timedelta = 15.0,
        recover: bool = True, retry: Retry | None = None,
        sleep: Callable[[float], None] | None = None, queues: Iterable[str] | None = None,
        retention: float | timedelta | None = None,
    ) -> Engine:
        """An in-memory engine, for tests: ``Engine.open``'s options (``synchronous`` unused).

        >>> from memable import Engine
        >>> engine = Engine.in_memory(max_workers=4)
        >>> engine.list_instances("anything")
        []
        >>> engine.close()
        """
        options = Options(max_workers, synchronous, poll_interval, lease, recover, retry, sleep,
                          queues=check_consumed(queues), retention=retention)
        return EngineBuilder(memory=True, options=options, factory=Engine).build()

    @classmethod
    def open(
        cls, target: str | os.PathLike[str], *, max_workers: int = 8,
        synchronous: Synchronous = "full", poll_interval: float | timedelta = 1.0,
        lease: float | timedelta = 15.0, recover: bool = True, retry: Retry | None = None,
        sleep: Callable[[float], None] | None = None, schema: str | None = None,
        queues: Iterable[str] | None = None, retention: float | timedelta | None = None,
    ) -> Engine:
        """An engine on the SQLite file ``target`` (created if missing) or a PostgreSQL URL.

        ``target`` is a path, a ``postgresql://``/``postgres://`` URL or a SQLite URL as
        SQLAlchemy spells it (``sqlite:///relative``, ``sqlite://`` for memory); another scheme
        raises ``StorageError`` and creates nothing.

        Options (durations in float seconds or a ``timedelta``): ``max_workers`` threads (8);
        ``synchronous`` ``"full"`` (survives power loss) or ``"normal"`` (survives process
        crashes); ``poll_interval`` between looks for other processes' writes (1.0); ``lease``,
        how long an engine counts as alive without a heartbeat (15.0); ``recover`` instances of
        dead engines (True); ``retry``, steps' default ``Retry`` (None); ``sleep``, what retry
        backoffs sleep with (tests); ``queues`` consumed (None: all; ``()``: none, it only
        enqueues); ``retention`` of finished instances (None: for ever; see
        ``EngineBuilder.retention``); ``schema``, PostgreSQL only (``"memable"``).

        Raise ``StorageError`` if the file is not SQLite or has a newer memable schema (left as
        it was; a file with other tables gets memable's beside them), or the server does not
        answer within its connect timeout (10 s by default).

        >>> import os, tempfile
        >>> from memable import Engine
        >>> path = os.path.join(tempfile.mkdtemp(), "workflows.db")
        >>> engine = Engine.open(path, synchronous="normal")
        >>> engine.close()
        >>> os.path.exists(path)
        True
        """
        options = Options(max_workers, synchronous, poll_interval, lease, recover, retry, sleep,
                          queues=check_consumed(queues), retention=retention)
        return EngineBuilder(path=target, schema=schema, options=options, factory=Engine).build()

    def queue(
        self, name: str, *, concurrency: int | None = None, per_process: int | None = None,
        rate: tuple[int, float | timedelta] | None = None, per_key: int | None = None,
    ) -> None:
        """Declare the queue ``name`` and its limits (before ``start``; None is unlimited).

        Across every engine on the store, at most ``concurrency`` of its instances run at once,
        ``count`` runs start in any window of ``period`` (``rate``), and ``per_key`` instances with
        one ``concurrency_key`` run at once; ``per_process`` limits this engine. Declare a queue
        the same way everywhere (see the queues how-to). A bad limit raises ``ValueError``; a
        declaration after ``start()``, ``AlreadyStarted``.

        >>> from memable import Engine, Queued
        >>> engine = Engine.in_memory()
        >>> engine.queue("payments", concurrency=5, rate=(100, 60))
        >>> engine.register("charge", lambda ctx, n: n * 2, queue="payments")
        >>> with engine:
        ...     inv = engine.invoke("charge", 21)
        ...     print(inv.result(timeout=10))
        42
        """
        self._runner.check_fork()
        self._runner.declare_queue(QueueSpec.declare(
            name, concurrency=concurrency, per_process=per_process, rate=rate, per_key=per_key))

    def schedule(
        self, name: str, cron: str, workflow: str, *, input: Any = None, timezone: str = "UTC",
        queue: str | None = None, catch_up: CatchUp = "latest", overlap: Overlap = "allow",
    ) -> None:
        """Invoke ``workflow`` at each tick of ``cron`` in ``timezone`` (before ``start``).

        ``cron`` has five fields or is ``@hourly``, ``@daily`` and the like; ``timezone`` is an
        IANA name. Each tick is the instance ``"{name}@{tick}"``, so it runs once however many
        engines declare the schedule. Its input is ``input`` if not None, else the tick (an aware
        UTC datetime) if the workflow takes one. ``catch_up`` (``"latest"``, ``"all"``,
        ``"none"``) says which missed ticks run; ``overlap="skip"`` skips a tick while an earlier
        one's instance has not ended (see the schedules how-to). A bad argument raises
        ``ValueError``; a declaration after ``start()``, ``AlreadyStarted``.

        >>> from datetime import datetime
        >>> from freezegun import freeze_time
        >>> from memable import Engine
        >>> def report(ctx, tick: datetime) -> str:
        ...     return f"report for {tick:%Y-%m-%d %H:%M}"
        >>> engine = Engine.in_memory(poll_interval=60)
        >>> engine.register("report", report)
        >>> engine.schedule("nightly", "0 2 * * *", "report", timezone="Europe/Paris")
        >>> with freeze_time("2026-06-01 23:59:59") as clock, engine:
        ...     _ = clock.tick(1)                    # 02:00 in Paris is 00:00 UTC
        ...     _ = engine.fire_due_timers()         # (or the timer thread) fires the tick
        ...     print(engine.invocation("report", "nightly@2026-06-02T00:00:00Z").result(10))
        report for 2026-06-02 00:00
        """
        self._runner.check_fork()
        spec = ScheduleSpec.declare(name, cron, workflow, input=input, timezone=timezone,
                                    queue=queue, catch_up=catch_up, overlap=overlap)
        registered = self._runner.workflows.get(spec.workflow)
        if registered is None:
            raise ValueError(f"workflow {workflow!r} of schedule {name!r} is not registered "
                             "(register it before declaring its schedule)")
        if spec.queue is not None and spec.queue not in self._runner.queues:
            raise ValueError(f"queue {queue!r} of schedule {name!r} is not declared "
                             "(engine.queue(name, ...))")
        _check_tick_input(spec, registered, self._runner.queues, self._runner.clock)
        with self._runner.declaring():
            self._schedules.add(spec)

    def register(
        self, name: str, fn: Callable[..., Any], queue: str | None = None, *,
        timeout: float | timedelta | None = None,
    ) -> None:
        """Register ``fn`` as the workflow ``name``; ``fn`` is ``fn(ctx)`` or ``fn(ctx, input)``.

        The annotations type the stored input and output. ``queue`` (declared, else
        ``ValueError``) and ``timeout`` are ``invoke``'s defaults. Raise ``AlreadyStarted`` after
        ``start()``, and ``TypeError`` for an async ``fn`` or a first parameter not a ``Context``.

        >>> from memable import Engine
        >>> def my_workflow(ctx, order_id: int) -> str:
        ...     return f"order {order_id}"
        >>> engine = Engine.in_memory()
        >>> engine.register("my-workflow", my_workflow)
        >>> with engine:
        ...     engine.invoke("my-workflow", 7).result()
        'order 7'
        """
        if not isinstance(name, str) or not name:
            raise TypeError(f"a workflow name is a non-empty str, not {name!r}")
        if not callable(fn):
            raise TypeError(f"workflow {name!r} must be callable, not {fn!r}")
        self._runner.check_fork()
        if queue is not None and queue not in self._runner.queues:
            raise ValueError(f"queue {queue!r} is not declared (engine.queue(name, ...))")
        seconds = (None if timeout is None
                   else positive_seconds(timeout, f"timeout of workflow {name!r}"))
        self._runner.register(Workflow.of(name, fn, queue, seconds, context=Context))

    def workflow(
        self, name: str, queue: str | None = None, *, timeout: float | timedelta | None = None,
    ) -> Callable[[F], F]:
        """Register the decorated function as the workflow ``name`` (see ``register``).

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> @engine.workflow("hello")
        ... def hello(ctx) -> str:
        ...     return "hi"
        >>> with engine:
        ...     engine.invoke("hello").result()
        'hi'
        """

        def decorate(fn: F) -> F:
            self.register(name, fn, queue, timeout=timeout)
            return fn

        return decorate

    def _configure(self, max_workers: int | None, queues: Iterable[str] | None,
                   retention: float | None = None) -> None:
        """Before ``start()``: ``memable worker --threads``, ``--queues``, ``--retention``."""
        if max_workers is not None:
            self._runner.set_options(max_workers=max_workers)
        if queues is not None:
            self._runner.set_options(queues=check_consumed(queues))
        if retention is not None:
            self._runner.set_options(retention=retention)

    def start(self) -> None:
        """Start taking invocations: the worker pool, and the queue thread if it consumes queues.

        ``AlreadyStarted`` if called twice; ``ValueError`` if ``queues`` names an undeclared one.

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.start()
        >>> engine
        <Engine started workflows=[]>
        >>> engine.close()
        """
        self._runner.start()

    def wait_all(self) -> None:
        """Take no new invocations; wait until its runs (queued ones too) end; then ``stop()``.

        >>> from memable import Engine
        >>> done = []
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", lambda ctx: done.append(ctx.instance_id))
        >>> engine.start()
        >>> for _ in range(3):
        ...     _ = engine.invoke("wf")
        >>> engine.wait_all()
        >>> len(done)
        3
        >>> engine.close()
        """
        self._runner.check_fork()
        self._runner.wait_all()

    def stop(self) -> None:
        """Take no new work, let active runs end, join its threads; idempotent (store stays open).

        >>> import threading
        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.start()
        >>> engine.stop()
        >>> [t.name for t in threading.enumerate() if t.name.startswith("memable")]
        []
        >>> engine.close()
        """
        self._runner.check_fork()
        self._runner.stop()

    def close(self) -> None:
        """Stop the engine and close its store; idempotent.

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.close()
        >>> engine.close()
        """
        self._runner.check_fork()
        if self._runner.close():
            self._store.close()

    def __enter__(self) -> Engine:
        if self._runner.phase == "new":
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if exc_type is None:
            self.wait_all()
        self.close()

    def invoke(
        self, name: str, input: Any = NO_INPUT, *, instance_id: str | None = None,
        queue: str | None = None, priority: int = 0,
        start_at: datetime | float | timedelta | None = None,
        timeout: float | timedelta | None = None, concurrency_key: str | None = None,
    ) -> Invocation:
        """Create an instance of workflow ``name`` with ``input`` and start running it.

        The input is stored typed by the workflow's annotation; a required input missing raises
        ``TypeError`` (``None`` counts as given), one that cannot be stored
        ``SerializationError``. If ``instance_id`` is already stored, return that instance's
        Invocation and start nothing.

        Onto a queue (``queue``, else the workflow's; undeclared: ``ValueError``) the instance is
        stored ``Queued()`` and this returns at once; an engine consuming the queue runs it, lower
        ``priority`` first. ``start_at`` (an aware datetime, or a duration from now) stores it
        ``Suspended("starts at <UTC time>")`` until a durable timer starts it. ``timeout`` (None:
        the workflow's) is a durable deadline from now, past which the instance is cancelled with
        the message ``"timed out after <duration>"``. ``concurrency_key`` counts against a queue's
        ``per_key`` (``ValueError`` on a queue without one).

        >>> from memable import Engine
        >>> runs = []
        >>> engine = Engine.in_memory()
        >>> engine.register("once", lambda ctx: runs.append(1))
        >>> with engine:
        ...     a = engine.invoke("once", instance_id="order-1")
        ...     _ = a.wait()
        ...     b = engine.invoke("once", instance_id="order-1")
        >>> b.instance_id, len(runs)
        ('order-1', 1)
        """
        workflow = self._runner.workflow(name)
        self._runner.require_accepting(name)
        starts = None if start_at is None else _start_deadline(start_at, self._runner.clock.wall())
        row, value = new_instance(workflow, input, instance_id, queue, priority,
                                  self._runner.queues, timeout=timeout,
                                  concurrency_key=concurrency_key, clock=self._runner.clock)
        instance_id = row.instance_id
        if starts is not None:  # nobody's, waiting on its start timer
            row = attrs.evolve(row, status="suspended", message=f"starts at {iso_utc(starts)}",
                               waiting_for=START_KEY, queued_at=None)
        created = False

        def make() -> list[Made]:
            nonlocal created, row
            with self._telemetry.producing(name, instance_id=instance_id) as traceparent:
                row = attrs.evolve(row, traceparent=traceparent)
                created = self._store.create_instance(row, starts)
            if not created or starts is not None or row.queue is not None:
                return []  # not made, or it waits: for its start, or a slot of its queue
            return [(workflow, instance_id, (value,), traceparent, None)]

        watches = self._runner.start_made(make, asked=True)
        if not created:
            return self.invocation(name, instance_id)
        log.debug("invoked", extra=where(name, instance_id))
        if starts is not None or row.timeout_at is not None:  # a new deadline
            self._runner.armed()
        if row.queue is not None and starts is None:
            self._runner.kick()
        return Invocation(self, watches[0] if watches else self._runner.watch(name, instance_id))

    def resume(self, name: str, instance_id: str) -> Invocation:
        """Run an instance again: stored steps return their results, the rest execute.

        A Completed instance replays to Completed, a Failed or Suspended one continues, a running
        one just returns its Invocation. Raise ``InstanceNotFound`` for an unknown id.

        >>> from memable import Engine
        >>> attempts = []
        >>> def flaky() -> str:
        ...     attempts.append(1)
        ...     if len(attempts) == 1:
        ...         raise ConnectionError("try again")
        ...     return "ok"
        >>> def wf(ctx) -> str:
        ...     return ctx.step("call:v1").run(flaky)
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", wf)
        >>> with engine:
        ...     inv = engine.invoke("wf")
        ...     print(inv.wait())
        ...     print(engine.resume("wf", inv.instance_id).result())
        failed: step 'call:v1' failed: ConnectionError: try again
        ok
        """
        workflow = self._runner.workflow(name)
        self._runner.require_accepting(name)
        row = self._stored_row(name, instance_id)
        if row.status == "cancelled":
            raise InstanceFinished(name, instance_id, "it is cancelled")
        if row.status not in ("running", "queued"):  # else nothing is resumed here
            self._continue_trace(name, instance_id, row.traceparent)
        watch = self._runner.start_run(workflow, instance_id, None, claim="resume")
        return Invocation(self, watch)

    def fork(
        self, name: str, instance_id: str, *, from_key: str | None = None,
        new_instance_id: str | None = None,
    ) -> Invocation:
        """Fork an instance: a new one with its input and the completed steps before ``from_key``.

        The new run executes ``from_key`` and what follows (None: every completed step is copied);
        the source is only read. ``new_instance_id`` defaults to
        ``"{instance_id}.fork-{8 hex digits}"``; one that exists, or a key the source never
        reached, raises ``ValueError``; an unknown source ``InstanceNotFound``.

        >>> from memable import Engine
        >>> charged = []
        >>> def order(ctx, amount: int) -> str:
        ...     ctx.step("charge:v1").run(lambda: charged.append(amount))
        ...     return ctx.step("ship:v1").run(lambda: f"shipped {amount}")
        >>> engine = Engine.in_memory()
        >>> engine.register("order", order)
        >>> with engine:
        ...     _ = engine.invoke("order", 5, instance_id="o-1").result()
        ...     again = engine.fork("order", "o-1", from_key="ship:v1",
        ...                         new_instance_id="o-1-reship")
        ...     print(again.instance_id, again.result(), charged)
        o-1-reship shipped 5 [5]
        """
        workflow = self._runner.workflow(name)
        self._runner.require_accepting(name)  # and not in a forked child
        new_id = ""

        def make() -> list[Made]:
            nonlocal new_id
            new_id, made = admin.fork_instance(self._store, name, instance_id, from_key,
                                               new_instance_id, clock=self._runner.clock)
            if not made:
                raise ValueError(
                    f"new_instance_id {new_id!r} is taken: workflow {name!r} has an instance "
                    "with that id (nothing was forked)")
            log.info("forked %s from %r", new_id, from_key, extra=where(name, instance_id))
            self._continue_trace(name, new_id, None)
            return [(workflow, new_id, None, None, None)]

        watches = self._runner.start_made(make, asked=True)
        return Invocation(self, watches[0] if watches else self._runner.watch(name, new_id))

    def resume_failed(
        self, name: str | None = None, *, since: datetime | None = None, limit: int = 1000
    ) -> int:
        """Resume failed instances of workflow ``name`` (None: every workflow); return how many.

        Those that failed at or after ``since`` (an aware datetime; None: any time), oldest first,
        at most ``limit``, each as ``memable resume`` does. A failed child whose parent has ended
        or caught its ``ChildFailed`` is left alone.

        >>> from memable import Engine
        >>> tries = {}
        >>> def flaky(ctx, n: int) -> int:
        ...     tries[n] = tries.get(n, 0) + 1
        ...     return ctx.step("call:v1").run(lambda: n if tries[n] > 1 else 1 // 0)
        >>> engine = Engine.in_memory()
        >>> engine.register("flaky", flaky)
        >>> with engine:
        ...     for n in (1, 2):
        ...         _ = engine.invoke("flaky", n, instance_id=f"f-{n}").wait()
        ...     print(engine.resume_failed("flaky"))
        ...     print(engine.invocation("flaky", "f-2").result(10))
        2
        2
        """
        self._runner.check_fork()
        if name is not None:
            self._runner.workflow(name)  # WorkflowNotFound for a name not registered
        if type(limit) is not int or limit < 1:
            raise ValueError(f"limit must be a whole number from 1, not {limit!r}")
        if since is not None and (not isinstance(since, datetime) or since.tzinfo is None):
            raise ValueError(f"since must be an aware datetime, not {since!r}")
        at = None if since is None else since.timestamp()
        resumed = admin.resume_failed(self._store, name, since=at, limit=limit,
                                      clock=self._runner.clock)
        for workflow, instance_id in resumed:
            log.info("resumed (failed)", extra=where(workflow, instance_id))
        self._runner.kick()  # this engine's look takes those it runs, now
        return len(resumed)

    def signal(self, name: str, instance_id: str, key: str, payload: Any) -> Invocation:
        """Store ``payload`` as the value of the suspend point ``key`` and run the instance.

        The instance's ``ctx.suspend(key)`` returns the payload; a signal that arrives while it
        runs is kept for it. An engine without the workflow only stores it, for the one that has it
        (within its poll interval). Raise ``InstanceNotFound``, ``InstanceFinished`` (Completed,
        Cancelled, or Failed: resume that instead), ``SignalRejected`` (``key`` already holds a
        value) or ``SerializationError``; each writes nothing.

        >>> from memable import Engine, SignalRejected
        >>> def wf(ctx) -> int:
        ...     return ctx.suspend("answer:v1") + 1
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", wf)
        >>> with engine:
        ...     inv = engine.invoke("wf")
        ...     _ = inv.wait()
        ...     print(engine.signal("wf", inv.instance_id, "answer:v1", 41).result())
        ...     try:
        ...         engine.signal("wf", inv.instance_id, "answer:v1", 0)
        ...     except Exception as err:
        ...         print(type(err).__name__)
        42
        InstanceFinished
        """
        self._runner.require_accepting(name)
        stored = None
        if self._telemetry.tracing:  # continue the instance's trace if no span is active
            row = self._store.get_instance(name, instance_id)
            stored = None if row is None else row.traceparent
        try:
            with (self._telemetry.producing(name, stored, instance_id) as traceparent,
                  self._runner.signalling(name, instance_id, key)):
                store_signal(self._store, name, instance_id, key, payload, traceparent,
                             clock=self._runner.clock)
        except InstanceNotFound:
            if name not in self._runner.workflows and not self._store.list_instances(name):
                raise WorkflowNotFound(name) from None
            raise
        log.info("signal stored", extra=where(name, instance_id, key))
        watch = self._runner.watch(name, instance_id)
        self._runner.wake(name, instance_id)
        return Invocation(self, watch)

    def fire_due_timers(self) -> int:
        """Fire the timers due now (wall clock), start the runs they resume; return how many fired.

        The timer thread does this by itself; call it in tests that move the clock with freezegun.

        >>> from datetime import datetime, timedelta, timezone
        >>> from freezegun import freeze_time
        >>> from memable import Engine
        >>> def wf(ctx) -> str:
        ...     ctx.timer("cool-off:v1", timedelta(days=3))
        ...     return "done"
        >>> engine = Engine.in_memory(poll_interval=60)
        >>> engine.register("wf", wf)
        >>> with freeze_time(datetime(2026, 1, 1, tzinfo=timezone.utc)) as clock, engine:
        ...     inv = engine.invoke("wf")
        ...     print(inv.wait())
        ...     _ = clock.tick(timedelta(days=2))
        ...     print(engine.fire_due_timers())
        ...     _ = clock.tick(timedelta(days=1))
        ...     _ = engine.fire_due_timers()
        ...     print(inv.result(timeout=10))
        suspended: timer cool-off:v1
        0
        done
        """
        return self._runner.fire_due()

    def cancel(self, name: str, instance_id: str) -> None:
        """Cancel an instance: it ends Cancelled, its timers are dropped, signals refused.

        A running instance stops at its next step boundary (in another process, within its poll
        interval); its unended children are cancelled with it. A Completed or Cancelled instance
        raises ``InstanceFinished``.

        >>> from memable import Cancelled, Engine, InstanceFinished
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", lambda ctx: ctx.suspend("approval:v1"))
        >>> with engine:
        ...     inv = engine.invoke("wf")
        ...     _ = inv.wait()
        ...     engine.cancel("wf", inv.instance_id)
        ...     print(inv.state)
        ...     try:
        ...         engine.signal("wf", inv.instance_id, "approval:v1", True)
        ...     except InstanceFinished as err:
        ...         print("refused")
        cancelled
        refused
        """
        self._runner.check_fork()
        self._runner.ended_by_cancel(name, instance_id,
            cancel_instance(self._store, name, instance_id, clock=self._runner.clock))
        log.info("cancelled", extra=where(name, instance_id))

    def purge(self, older_than: float | timedelta) -> int:
        """Delete finished instances completed more than ``older_than`` ago; return how many.

        Finished means Completed, Failed or Cancelled; their steps and timers go with them, in
        batches of 500, one transaction each. As with ``retention``, a finished instance still in
        use (its run in flight, a child not ended, its parent running) is kept.

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", lambda ctx: None)
        >>> with engine:
        ...     _ = engine.invoke("wf").wait()
        ...     engine.purge(older_than=0)
        1
        """
        self._runner.check_fork()
        deleted = purge_finished(self._store, older_than, clock=self._runner.clock)
        log.info("purged %d finished instances", deleted)
        return deleted

    def pause_queue(self, name: str) -> None:
        """Pause the queue ``name`` for every engine on the store, until ``resume_queue``.

        The pause is stored: no engine starts another of the queue's instances. Invokes onto it
        are still stored ``Queued()``, runs in flight finish, and ``wait_all`` does not wait for
        it. Raise ``ValueError`` for a queue this engine does not declare.

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.queue("emails")
        >>> engine.register("send", lambda ctx, to: f"sent to {to}", queue="emails")
        >>> with engine:
        ...     engine.pause_queue("emails")
        ...     inv = engine.invoke("send", "ada")     # accepted, and it waits
        ...     print(inv.state)
        ...     engine.resume_queue("emails")
        ...     print(inv.result(timeout=10))
        queued
        sent to ada
        """
        self._runner.check_fork()
        self._declared_queue(name)
        if admin.pause_queue(self._store, name, clock=self._runner.clock):
            log.info("queue %r paused", name)

    def resume_queue(self, name: str) -> None:
        """Let the paused queue ``name`` start instances again, in every engine on the store.

        Its queued instances start in their order, within its limits (other engines on a file at
        their next poll). ``ValueError`` for a queue this engine does not declare.

        >>> from memable import Engine
        >>> ran = []
        >>> engine = Engine.in_memory()
        >>> engine.queue("reports", concurrency=1)
        >>> engine.register("report", lambda ctx, n: ran.append(n), queue="reports")
        >>> with engine:
        ...     engine.pause_queue("reports")
        ...     invs = [engine.invoke("report", n, instance_id=f"r{n}", priority=p)
        ...             for n, p in ((1, 5), (2, 0), (3, 5))]
        ...     engine.resume_queue("reports")
        ...     _ = [inv.wait(timeout=10) for inv in invs]
        >>> ran                                        # lower priority first, then in order
        [2, 1, 3]
        """
        self._runner.check_fork()
        self._declared_queue(name)
        if admin.resume_queue(self._store, name, clock=self._runner.clock):
            log.info("queue %r resumed", name)
        self._runner.kick()

    def _declared_queue(self, name: str) -> None:
        """Raise ValueError unless this engine declares the queue ``name``."""
        if not isinstance(name, str) or name not in self._runner.queues:
            raise ValueError(f"queue {name!r} is not declared (engine.queue(name, ...))")

    def invocation(self, name: str, instance_id: str) -> Invocation:
        """An Invocation of a stored instance, e.g. to follow it from another request.

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", lambda ctx: 5)
        >>> with engine:
        ...     _ = engine.invoke("wf", instance_id="job-1").wait()
        ...     engine.invocation("wf", "job-1").result()
        5
        """
        self._runner.check_fork()
        self._stored_row(name, instance_id)
        return Invocation(self, self._runner.watch(name, instance_id))

    def get_metadata(self, name: str, instance_id: str) -> WorkflowMetadata | None:
        """The stored status and timestamps of an instance, or None if unknown.

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.get_metadata("wf", "no-such-id") is None
        True
        >>> engine.close()
        """
        self._runner.check_fork()
        row = self._store.get_instance(name, instance_id)
        return None if row is None else metadata_of(row)

    def list_instances(self, name: str) -> list[tuple[str, WorkflowMetadata]]:
        """Every stored instance of workflow ``name`` as (id, metadata), oldest first.

        >>> from memable import Engine
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", lambda ctx: None)
        >>> with engine:
        ...     _ = engine.invoke("wf", instance_id="a").wait()
        ...     _ = engine.invoke("wf", instance_id="b").wait()
        ...     [instance_id for instance_id, _ in engine.list_instances("wf")]
        ['a', 'b']
        """
        self._runner.check_fork()
        return [(row.instance_id, metadata_of(row)) for row in self._store.list_instances(name)]

    def steps(self, name: str, instance_id: str) -> list[StepRecord]:
        """An instance's stored keys, in the order first reached (``InstanceNotFound`` if unknown).

        >>> from memable import Engine
        >>> def wf(ctx):
        ...     ctx.step("a").run(lambda: 1)
        ...     ctx.step("b").run(lambda: 2)
        >>> engine = Engine.in_memory()
        >>> engine.register("wf", wf)
        >>> with engine:
        ...     _ = engine.invoke("wf", instance_id="x").wait()
        ...     [(s.key, s.result) for s in engine.steps("wf", "x")]
        [('a', 1), ('b', 2)]
        """
        self._runner.check_fork()
        self._stored_row(name, instance_id)
        return self._store.list_steps(name, instance_id)

    def _continue_trace(self, name: str, instance_id: str, stored: str | None) -> None:
        """A span ``invoke <name>`` for a resume (child of the active span, else of the stored
        context), stored as its next run's parent."""
        if not self._telemetry.tracing:
            return
        with self._telemetry.producing(name, stored, instance_id) as traceparent:
            if traceparent is not None:
                self._store.set_traceparent(name, instance_id, traceparent)

    def _stored_row(self, workflow: str, instance_id: str) -> InstanceRow:
        """The instance's row; raise InstanceNotFound if there is none (Invocation's too)."""
        self._runner.check_fork()
        return stored_row(self._store, workflow, instance_id)

    def _decode_output(
        self, workflow: str, instance_id: str, output: str | None, output_type: str | None
    ) -> Any:
        """The stored output of a Completed instance, as its workflow returns it (Invocation's)."""
        return decode_output(self._runner.workflows, workflow, instance_id, output, output_type)

    @property
    def _poll_interval(self) -> float:  # Invocation's
        return self._runner.poll_interval


def _check_tick_input(
    spec: ScheduleSpec, workflow: Workflow, queues: dict[str, QueueSpec], clock: Clock,
) -> None:
    """A tick's instance could be stored: the input given, or the tick, fits the workflow."""
    try:
        tick_instance(spec, workflow, datetime(2000, 1, 1, tzinfo=dt_timezone.utc), queues, clock)
    except TypeError as exc:  # an input it does not take, or none where it needs one
        raise ValueError(f"input of schedule {spec.name!r}: {exc}") from None
    except SerializationError:
        given = ("the input given" if spec.input is not None
                 else "its tick (an aware UTC datetime)")
        raise ValueError(
            f"input of schedule {spec.name!r}: {given} does not fit the input of workflow "
            f"{spec.workflow!r} (annotated {workflow.input_hint!r}); give input= a value "
            "of that type") from None


def _start_deadline(start_at: object, now: float) -> float:
    """``invoke``'s ``start_at`` as epoch seconds: an aware datetime, or a duration from ``now``.

    >>> from datetime import datetime, timezone
    >>> _start_deadline(90, 1000.0), _start_deadline(timedelta(minutes=1), 0.0)
    (1090.0, 60.0)
    >>> _start_deadline(datetime(2026, 1, 1, tzinfo=timezone.utc), 0.0)
    1767225600.0
    >>> _start_deadline(datetime(2026, 1, 1), 0.0)
    Traceback (most recent call last):
    ...
    ValueError: start_at must be an aware datetime (or a duration), not datetime.datetime(...
    """
    if isinstance(start_at, datetime):
        if start_at.tzinfo is None:
            raise ValueError(
                f"start_at must be an aware datetime (or a duration), not {start_at!r}")
        return check_deadline(start_at.timestamp(), "start_at", start_at)
    return check_deadline(now + seconds_of(start_at, "start_at"), "start_at", start_at)
