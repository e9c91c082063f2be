"""Engine lifecycle, invocation handles, keys and the errors bad calls get."""

from __future__ import annotations

import functools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from helpers import PATIENCE, build, dump, runner_of, shared_store_only

from memable import (
    AlreadyStarted,
    Completed,
    Context,
    DuplicateStepKey,
    Engine,
    EngineError,
    Failed,
    InProgress,
    InstanceNotFound,
    InvalidKey,
    Invocation,
    MetadataStatus,
    NotStarted,
    Retry,
    Started,
    StorageError,
    WorkflowFailed,
    WorkflowNotFound,
)
from memable._clock import Clock
from memable._run.options import Options
from memable._sqlite.store import SQLiteStore


def engine_threads() -> list[threading.Thread]:
    """The engine's threads; not a PostgreSQL store's pool, which lives until close()."""
    return [
        t for t in threading.enumerate()
        if t.name.startswith("memable") and not t.name.startswith("memable-pool")
    ]


def noop(ctx: Context) -> None:
    """A workflow with nothing to do."""


def test_register_after_start_raises_already_started(engine: Engine) -> None:
    """register() on a started engine raises AlreadyStarted naming the workflow."""
    engine.start()
    with pytest.raises(AlreadyStarted, match="'late'"):
        engine.register("late", noop)


def test_second_start_raises_already_started(engine: Engine) -> None:
    """start() twice raises AlreadyStarted, and so does start() after stop()."""
    engine.start()
    with pytest.raises(AlreadyStarted):
        engine.start()
    engine.stop()
    with pytest.raises(AlreadyStarted):
        engine.start()


def test_register_same_name_twice_raises(engine: Engine) -> None:
    """A second workflow under a taken name is refused, not silently swapped in."""
    engine.register("wf", noop)
    with pytest.raises(ValueError, match="'wf' is already registered"):
        engine.register("wf", noop)


def test_register_rejects_a_function_of_the_wrong_shape(engine: Engine) -> None:
    """A workflow takes (ctx) or (ctx, input); three parameters are refused."""
    with pytest.raises(TypeError, match="must take"):
        engine.register("wf", lambda ctx, a, b: None)


async def fetch_async(*args: object) -> str:
    """An async workflow, or step function: calling it makes a coroutine."""
    return "fetched"


class AsyncCallable:
    """An object whose __call__ is async: calling it makes a coroutine."""

    async def __call__(self, *args: object) -> str:
        return "fetched"


#: The async callables memable must refuse, as a workflow or as a step function.
ASYNC = {
    "async-def": fetch_async,
    "partial": functools.partial(fetch_async),
    "callable-object": AsyncCallable(),
}


@pytest.mark.parametrize("how", ["register", "decorator"])
@pytest.mark.parametrize("fn", ASYNC.values(), ids=ASYNC.keys())
def test_register_refuses_an_async_workflow(engine: Engine, how: str, fn: Any) -> None:
    """An async def workflow (also through a partial, or an object with an async __call__)
    is a TypeError at register naming it and saying to make it a def, and is not
    registered; by register() and by @engine.workflow alike."""
    register = (engine.register if how == "register"
                else lambda name, fn: engine.workflow(name)(fn))
    with pytest.raises(TypeError) as raised:
        register("fetch", fn)
    assert str(raised.value).startswith("workflow 'fetch' is an async function (")
    assert "make it a def, or call the async code inside one with asyncio.run()" in str(
        raised.value)
    engine.register("fetch", noop)  # the name is free


def order_total(order_id: int) -> int:
    return order_id


def input_first(order: dict[str, int], ctx: Context) -> None: ...


@pytest.mark.parametrize(("fn", "says"), [
    (order_total, "workflow 'fetch' must take the Context as its first positional parameter, "
                  "but 'order_id' is annotated int: write def order_total(ctx, order_id)"),
    (input_first, "workflow 'fetch' must take the Context as its first positional parameter, "
                  "but 'order' is annotated dict[str, int]: put the Context first, then "
                  "the input"),
], ids=["no-ctx", "ctx-second"])
def test_register_refuses_a_first_parameter_that_cannot_take_the_context(
    engine: Engine, fn: Any, says: str
) -> None:
    """A workflow whose first positional parameter is annotated with a type a Context is
    not is a TypeError at register (and at @engine.workflow) saying what to write."""
    with pytest.raises(TypeError) as raised:
        engine.register("fetch", fn)
    assert str(raised.value) == says
    with pytest.raises(TypeError) as decorated:
        engine.workflow("fetch")(fn)
    assert str(decorated.value) == says


def loose(ctx: object, n: Any) -> None: ...


def optional(ctx: Context | None, n: int) -> None: ...


def anything(ctx: Any) -> None: ...


def forward(ctx: "Context") -> None: ...  # noqa: UP037  (a string annotation on purpose)


def test_annotations_that_can_take_a_context_are_registered(engine: Engine) -> None:
    """object, Any, a union holding Context, and a string naming it are all accepted."""
    for name, fn in [("loose", loose), ("optional", optional), ("anything", anything),
                     ("forward", forward)]:
        engine.register(name, fn)
    with engine:
        assert engine.invoke("forward").result(timeout=10) is None


def test_an_input_to_a_workflow_whose_one_parameter_is_the_context_says_so(
    engine: Engine,
) -> None:
    """fn(n) registered and invoked with 5: the TypeError says n receives the Context and
    to write fn(ctx, n), rather than only that it takes no input."""

    def double(n):  # type: ignore[no-untyped-def]  # the mistake: no ctx
        return n * 2

    engine.register("double", double)
    with engine:
        with pytest.raises(TypeError) as raised:
            engine.invoke("double", 5)
        assert engine.list_instances("double") == []
    assert str(raised.value) == (
        "workflow 'double' takes no input, got int (its one parameter, 'n', receives the "
        "Context; to take an input, make it fn(ctx, n))"
    )


@pytest.mark.parametrize("how", ["run", "map"])
@pytest.mark.parametrize("fn", ASYNC.values(), ids=ASYNC.keys())
def test_an_async_step_function_is_a_type_error_at_run(
    engine: Engine, how: str, fn: Any
) -> None:
    """ctx.step(key).run(fn) (and .map) with an async fn fails the run with a TypeError
    naming workflow, instance and step and saying what to do; no step is recorded and
    nothing mentions storing a coroutine."""

    def wf(ctx: Context) -> object:
        step = ctx.step("fetch:v1")
        return step.run(fn) if how == "run" else step.map(fn, [1, 2])

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf", instance_id="i-1").wait(timeout=10)
        assert engine.steps("wf", "i-1") == []
    assert isinstance(state, Failed)
    assert state.message.startswith(
        "step 'fetch:v1' failed: TypeError: the function of step 'fetch:v1' (workflow 'wf', "
        "instance 'i-1') is an async function ("
    )
    assert "make it a def, or call the async code inside one with asyncio.run()" in (
        state.message)
    assert "coroutine" not in state.message


def test_a_plain_step_function_returning_a_coroutine_is_named_so(engine: Engine) -> None:
    """A lambda handing back an un-awaited coroutine is refused saying so, not as a value
    of an unknown type, and is not retried."""
    made: list[Coroutine[Any, Any, str]] = []

    def start() -> Coroutine[Any, Any, str]:
        made.append(fetch_async())
        return made[-1]

    def wf(ctx: Context) -> object:
        return ctx.step("fetch:v1").retry(Retry(max_attempts=3, initial_delay=0)).run(start)

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf", instance_id="i-1").wait(timeout=10)
    for coroutine in made:
        coroutine.close()
    assert len(made) == 1
    assert state == Failed(
        "step 'fetch:v1' failed after 1 attempt: SerializationError: cannot store a "
        "coroutine: the function returned an awaitable that nothing awaits, and memable runs "
        "plain synchronous functions; await it inside one with asyncio.run() and return its "
        "value: workflow 'wf', instance 'i-1', step 'fetch:v1'"
    )


def test_decorator_registers_and_returns_the_function(engine: Engine) -> None:
    """@engine.workflow(name) registers the function and leaves it callable as before."""

    @engine.workflow("twice")
    def twice(ctx: Context, n: int) -> int:
        return n * 2

    with engine:
        assert engine.invoke("twice", 4).result(timeout=10) == 8
    assert twice.__name__ == "twice"


def test_resume_and_invoke_before_start_raise_not_started(engine: Engine) -> None:
    """invoke() and resume() before start() raise NotStarted naming the workflow."""
    engine.register("wf", noop)
    with pytest.raises(NotStarted, match="'wf'"):
        engine.resume("wf", "some-id")


def test_resume_unknown_instance_raises_instance_not_found(engine: Engine) -> None:
    """resume() of an id never stored raises InstanceNotFound naming workflow and id."""
    engine.register("wf", noop)
    with engine, pytest.raises(InstanceNotFound, match=r"'wf'.*'nope'"):
        engine.resume("wf", "nope")


def test_resume_unknown_workflow_raises_workflow_not_found(engine: Engine) -> None:
    """resume() of an unregistered workflow raises WorkflowNotFound."""
    with engine, pytest.raises(WorkflowNotFound, match="'ghost'"):
        engine.resume("ghost", "x")


def test_invoke_with_existing_instance_id_runs_nothing_new(engine: Engine) -> None:
    """invoke(instance_id=existing) returns that instance and keeps its stored input."""
    seen: list[int] = []

    def record(ctx: Context, n: int) -> int:
        seen.append(n)
        return n

    engine.register("record", record)
    with engine:
        first = engine.invoke("record", 1, instance_id="order-1")
        assert first.result(timeout=10) == 1
        again = engine.invoke("record", 2, instance_id="order-1")
        assert again.instance_id == "order-1"
        assert again.result(timeout=10) == 1
    assert seen == [1]


def test_input_to_a_workflow_without_input_is_refused(engine: Engine) -> None:
    """A workflow fn(ctx) given an input raises TypeError and stores nothing."""
    engine.register("wf", noop)
    with engine:
        with pytest.raises(TypeError, match="takes no input"):
            engine.invoke("wf", 5)
        assert engine.list_instances("wf") == []


@pytest.mark.parametrize(
    ("key", "why"),
    [("", "non-empty"), (42, "non-empty str"), ("_internal", "reserved")],
)
def test_invalid_step_keys_fail_the_run(engine: Engine, key: object, why: str) -> None:
    """Empty, non-str and '_'-prefixed keys raise InvalidKey, which fails the run."""
    def wf(ctx: Context) -> None:
        ctx.step(key).run(lambda: 1)  # type: ignore[arg-type]

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        state = inv.wait(timeout=10)
        assert isinstance(state, Failed)
        assert "InvalidKey" in state.message
        assert why in state.message
        assert inv.instance_id in state.message
        assert engine.steps("wf", inv.instance_id) == []


def test_invalid_instance_id_is_refused(engine: Engine) -> None:
    """invoke(instance_id="") raises InvalidKey and stores nothing."""
    engine.register("wf", noop)
    with engine:
        with pytest.raises(InvalidKey):
            engine.invoke("wf", instance_id="")
        assert engine.list_instances("wf") == []


def test_generated_ids_are_time_ordered_and_a_forked_child_draws_its_own() -> None:
    """An id made by invoke is 13 digits of milliseconds and 12 hex digits; a process
    forked after making ids (a pre-fork server's worker) does not draw its parent's
    next id: the random part differs."""
    code = (
        "import os\n"
        "from memable._clock import SYSTEM_CLOCK\n"
        "from memable._run.run import new_instance_id\n"
        "new_instance_id(SYSTEM_CLOCK)\n"
        "r, w = os.pipe()\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    os.write(w, new_instance_id(SYSTEM_CLOCK).encode())\n"
        "    os._exit(0)\n"
        "os.waitpid(pid, 0)\n"
        "print(os.read(r, 100).decode(), new_instance_id(SYSTEM_CLOCK))\n"
    )
    ran = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=60)
    child, parent = ran.stdout.split()
    assert re.fullmatch(r"\d{13}-[0-9a-f]{12}", child), child
    assert re.fullmatch(r"\d{13}-[0-9a-f]{12}", parent), parent
    assert child.split("-")[1] != parent.split("-")[1]


def test_an_applications_random_seed_does_not_repeat_generated_ids() -> None:
    """Two processes that seed ``random`` alike (an application's ``random.seed(0)``)
    still draw different ids: memable draws them from a generator of its own."""
    import random

    from memable._clock import SYSTEM_CLOCK
    from memable._run.run import new_instance_id

    random.seed(0)
    first = new_instance_id(SYSTEM_CLOCK)
    random.seed(0)
    second = new_instance_id(SYSTEM_CLOCK)
    assert first.split("-")[1] != second.split("-")[1]


def test_duplicate_step_key_fails_the_run_and_keeps_the_first(engine: Engine) -> None:
    """A key used twice in one run raises DuplicateStepKey; the first result stays stored."""
    caught: list[DuplicateStepKey] = []

    def wf(ctx: Context) -> None:
        ctx.step("a").run(lambda: 1)
        try:
            ctx.step("a").run(lambda: 2)
        except DuplicateStepKey as exc:
            caught.append(exc)
            raise

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        state = inv.wait(timeout=10)
        assert isinstance(state, Failed)
        assert state.message.startswith("step 'a' failed: DuplicateStepKey")
        [exc] = caught
        assert (exc.workflow, exc.instance_id, exc.key) == ("wf", inv.instance_id, "a")
        [record] = engine.steps("wf", inv.instance_id)
        assert (record.key, record.state, record.result) == ("a", "completed", 1)


def test_failed_message_names_the_step_and_the_error(engine: Engine) -> None:
    """A step that raises fails the run with a message naming its key and the error."""
    def wf(ctx: Context) -> None:
        ctx.step("charge:v1").run(lambda: {}["missing"])

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        assert inv.wait(timeout=10) == Failed("step 'charge:v1' failed: KeyError: 'missing'")
        [record] = engine.steps("wf", inv.instance_id)
        assert (record.state, record.result, record.error, record.attempts) == (
            "failed", None, "KeyError: 'missing'", 1,
        )


def test_error_outside_a_step_fails_the_run(engine: Engine) -> None:
    """An exception raised by the workflow body itself fails the run and says so."""
    def wf(ctx: Context) -> None:
        raise RuntimeError("no step involved")

    engine.register("wf", wf)
    with engine:
        state = engine.invoke("wf").wait(timeout=10)
    assert state == Failed("workflow raised RuntimeError: no step involved")


def test_result_raises_workflow_failed_with_the_final_state(engine: Engine) -> None:
    """result() of a failed instance raises WorkflowFailed carrying the Failed state."""
    def wf(ctx: Context) -> None:
        ctx.step("s").run(lambda: 1 / 0)

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        with pytest.raises(WorkflowFailed) as info:
            inv.result(timeout=10)
    assert info.value.state == Failed("step 's' failed: ZeroDivisionError: division by zero")
    assert info.value.instance_id == inv.instance_id


def test_wait_and_result_time_out_while_a_run_is_blocked(engine: Engine) -> None:
    """wait(timeout) and result(timeout) raise TimeoutError while the run has not ended."""
    release = threading.Event()
    engine.register("blocked", lambda ctx: release.wait())
    with engine:
        inv = engine.invoke("blocked")
        with pytest.raises(TimeoutError, match="did not end"):
            inv.wait(timeout=0.05)
        with pytest.raises(TimeoutError, match="not terminal"):
            inv.result(timeout=0.05)
        release.set()
        assert inv.wait(timeout=10) == Completed()


def test_resume_of_a_running_instance_starts_no_second_run(engine: Engine) -> None:
    """resume() while a run is active returns an Invocation of it; nothing runs twice."""
    entered = threading.Event()
    release = threading.Event()
    runs: list[str] = []

    def wf(ctx: Context) -> str:
        runs.append(ctx.instance_id)
        entered.set()
        release.wait()
        return "done"

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        assert entered.wait(10)
        again = engine.resume("wf", inv.instance_id)
        assert again.state == Started()
        release.set()
        assert again.result(timeout=10) == "done"
        assert inv.wait(timeout=10) == Completed()
    assert runs == [inv.instance_id]


def test_state_is_live_while_running_and_stored_after(engine: Engine) -> None:
    """Invocation.state shows the live status during a run and the stored state after."""
    at_step = threading.Event()
    release = threading.Event()

    def wf(ctx: Context) -> None:
        ctx.set_status("working")
        at_step.set()
        release.wait()

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        assert at_step.wait(10)
        assert inv.state == InProgress("working")
        assert engine.get_metadata("wf", inv.instance_id).status == MetadataStatus.Running()  # type: ignore[union-attr]
        release.set()
        assert inv.wait(timeout=10) == Completed()
        assert inv.state == Completed()


def test_invocation_of_a_stored_instance_follows_it(engine: Engine) -> None:
    """engine.invocation() gives a handle on an instance created elsewhere."""
    engine.register("wf", lambda ctx: 41 + 1)
    with engine:
        engine.invoke("wf", instance_id="job-1").wait(timeout=10)
        assert engine.invocation("wf", "job-1").result(timeout=10) == 42
        with pytest.raises(InstanceNotFound):
            engine.invocation("wf", "job-2")


def test_updates_of_an_ended_run_yield_its_state_once(engine: Engine) -> None:
    """updates() on a run that already ended yields the stored state, once."""
    engine.register("wf", noop)
    with engine:
        inv = engine.invoke("wf")
        inv.wait(timeout=10)
        assert list(inv.updates()) == [Completed()]


def test_updates_yield_each_live_transition_then_the_end(engine: Engine) -> None:
    """updates() subscribed before the run reports yields every status, then Completed."""
    go = threading.Event()

    def wf(ctx: Context) -> None:
        go.wait()
        ctx.set_status("one")
        ctx.step("s1").run(lambda: 1)
        ctx.set_status("two")

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf")
        updates = inv.updates()
        go.set()
        assert list(updates) == [InProgress("one"), InProgress("two"), Completed()]


def test_stop_waits_for_active_runs_and_joins_threads(engine: Engine) -> None:
    """stop() lets the active run finish, then no engine thread is left."""
    before = engine_threads()
    started = threading.Event()

    def wf(ctx: Context) -> str:
        started.set()
        return ctx.step("s").run(lambda: "finished")

    engine.register("wf", wf)
    engine.start()
    inv = engine.invoke("wf")
    assert started.wait(10)
    engine.stop()
    assert engine_threads() == before
    assert inv.state == Completed()
    with pytest.raises(NotStarted):
        engine.invoke("wf")


def test_wait_all_leaves_no_engine_thread(engine: Engine) -> None:
    """After wait_all() every run has ended and no engine thread is alive."""
    before = engine_threads()
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda: 1))
    engine.start()
    invocations = [engine.invoke("wf") for _ in range(20)]
    engine.wait_all()
    assert engine_threads() == before
    assert [inv.state for inv in invocations] == [Completed()] * 20


def test_stop_wait_all_and_close_are_idempotent(engine: Engine) -> None:
    """stop, wait_all and close may be called repeatedly and in any order."""
    engine.start()
    engine.stop()
    engine.wait_all()
    engine.stop()
    engine.close()
    engine.close()
    engine.stop()


def test_reads_work_after_stop_but_not_after_close(engine: Engine) -> None:
    """stop() keeps the store open for reads; close() closes it."""
    from memable import StorageError

    engine.register("wf", noop)
    engine.start()
    inv = engine.invoke("wf")
    engine.stop()
    assert engine.get_metadata("wf", inv.instance_id) is not None
    engine.close()
    with pytest.raises(StorageError, match="closed"):
        engine.get_metadata("wf", inv.instance_id)


def test_context_manager_stops_without_draining_on_error(engine: Engine) -> None:
    """Leaving `with engine:` by an exception stops and closes it, and re-raises."""
    before = engine_threads()
    engine.register("wf", noop)

    def leave_with_an_error() -> None:
        with engine:
            engine.invoke("wf")
            raise KeyError("boom")

    with pytest.raises(KeyError):
        leave_with_an_error()
    assert engine_threads() == before
    with pytest.raises(NotStarted):
        engine.invoke("wf")


def test_builder_needs_a_store() -> None:
    """build() without .in_memory() or .open(path) says what is missing."""
    with pytest.raises(ValueError, match="in_memory"):
        Engine.builder().build()


@pytest.mark.parametrize(
    "options",
    [{"max_workers": 0}, {"synchronous": "off"}, {"poll_interval": 0}],
)
def test_bad_options_are_refused(options: dict[str, object], tmp_path: Path) -> None:
    """Options out of range raise ValueError before any file is created."""
    with pytest.raises(ValueError, match=next(iter(options))):
        Engine.open(tmp_path / "x.db", **options)  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- closed and stopped engines


def test_after_close_calls_say_the_engine_is_closed(make_engine: Callable[..., Engine]) -> None:
    """invoke and start on a closed engine say it is closed, not "call start()"."""
    engine = make_engine()
    engine.register("wf", lambda ctx: None)
    engine.start()
    engine.close()
    with pytest.raises(NotStarted, match="the engine is closed"):
        engine.invoke("wf")
    with pytest.raises(AlreadyStarted, match="closed and cannot start again"):
        engine.start()


def test_after_stop_start_says_make_a_new_engine(make_engine: Callable[..., Engine]) -> None:
    """start() after stop() says the engine cannot start again; invoke says it is stopped."""
    engine = make_engine()
    engine.register("wf", lambda ctx: None)
    engine.start()
    engine.stop()
    with pytest.raises(AlreadyStarted, match="stopped and cannot start again"):
        engine.start()
    with pytest.raises(NotStarted, match="the engine is stopped"):
        engine.invoke("wf")


def test_a_workflow_that_needs_an_input_refuses_an_invoke_without_one(
    make_engine: Callable[..., Engine],
) -> None:
    """No input for a parameter without a default: TypeError at invoke, nothing stored."""
    engine = make_engine()
    engine.register("needs", lambda ctx, order_id: order_id)
    engine.register("optional", lambda ctx, order_id=None: order_id)
    with engine:
        before = dump(engine)
        with pytest.raises(TypeError, match="'needs' takes an input and was invoked without one"):
            engine.invoke("needs")
        assert dump(engine) == before
        assert engine.invoke("needs", None).result(timeout=10) is None
        assert engine.invoke("optional").result(timeout=10) is None


@pytest.mark.parametrize(
    "options",
    [{"poll_interval": timedelta(seconds=0.5)}, {"lease": timedelta(seconds=30)}],
)
def test_engine_durations_take_a_timedelta(
    make_engine: Callable[..., Engine], options: dict[str, object]
) -> None:
    """poll_interval and lease take a timedelta as well as seconds."""
    engine = make_engine(**options)
    engine.register("wf", lambda ctx: 1)
    with engine:
        assert engine.invoke("wf").result(timeout=timedelta(seconds=10)) == 1


@pytest.mark.parametrize(
    ("value", "error"),
    [("60", TypeError), (float("inf"), ValueError), (float("nan"), ValueError), (-1, ValueError)],
)
def test_bad_durations_are_refused_naming_the_argument(value: object, error: type) -> None:
    """Strings, infinity, NaN and negatives raise and name the argument."""
    with pytest.raises(error, match="poll_interval"):
        Engine.in_memory(poll_interval=value)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- stop, fork, other engines


def wait_until(check: Callable[[], bool], timeout: float = PATIENCE) -> None:
    """Poll ``check`` until it holds, for what no event can signal; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.005)


def stopping(engine: Engine, name: str, instance_id: str) -> bool:
    """True once ``engine`` takes no new work (an idempotent invoke raises NotStarted)."""
    try:
        engine.invoke(name, instance_id=instance_id)
    except NotStarted:
        return True
    return False


@shared_store_only
def test_run_passing_a_satisfied_wait_during_stop_goes_on_in_the_next_engine(
    make_engine: Callable[..., Engine],
) -> None:
    """A run that passes a due zero timer while stop() drains is not left running forever."""
    calls = {"a": 0, "b": 0}
    inside, release = threading.Event(), threading.Event()

    def step_a() -> int:
        calls["a"] += 1
        inside.set()
        release.wait(PATIENCE)
        return 1

    def wf(ctx: Context) -> str:
        ctx.step("a").run(step_a)
        ctx.timer("z", 0)
        return ctx.step("b").run(lambda: calls.__setitem__("b", calls["b"] + 1) or "done")

    first = make_engine(recover=False, poll_interval=0.2)
    first.register("wf", wf)
    first.start()
    instance_id = first.invoke("wf").instance_id
    stopper = threading.Thread(target=first.stop)
    try:
        assert inside.wait(PATIENCE)
        stopper.start()
        wait_until(lambda: stopping(first, "wf", instance_id))
    finally:
        release.set()
    stopper.join(PATIENCE)
    assert not stopper.is_alive()
    left = first.get_metadata("wf", instance_id)
    assert left is not None
    assert (left.status, left.completed_at) == (MetadataStatus.Suspended("timer z"), None)

    second = make_engine(recover=False, poll_interval=0.2)
    second.register("wf", wf)
    with second:
        assert second.invocation("wf", instance_id).result(timeout=PATIENCE) == "done"
    assert calls == {"a": 1, "b": 1}


@shared_store_only
def test_wait_from_another_engine_waits_for_the_run_to_end(
    make_engine: Callable[..., Engine],
) -> None:
    """An Invocation from an engine that is not running the instance never returns Started()."""
    inside, release, watching = threading.Event(), threading.Event(), threading.Event()

    def body() -> str:
        inside.set()
        release.wait(PATIENCE)
        return "ok"

    runner, watcher = make_engine(poll_interval=0.1), make_engine(poll_interval=0.1)
    for engine in (runner, watcher):
        engine.register("wf", lambda ctx: ctx.step("s").run(body))
        engine.start()
    got: list[object] = []

    def watch(inv: Invocation) -> None:
        watching.set()
        try:
            got.append(inv.wait(timeout=5))
        except BaseException as err:  # reported by the assertion below
            got.append(err)

    try:
        instance_id = runner.invoke("wf").instance_id
        assert inside.wait(PATIENCE)
        waiter = threading.Thread(target=watch, args=(watcher.invocation("wf", instance_id),))
        waiter.start()
        assert watching.wait(PATIENCE)
    finally:
        release.set()
    waiter.join(PATIENCE)
    runner.wait_all()
    assert got == [Completed()]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork is POSIX only")
@pytest.mark.filterwarnings("ignore:.*fork.*:DeprecationWarning")
@shared_store_only
def test_an_engine_started_before_fork_refuses_work_in_the_child(
    make_engine: Callable[..., Engine],
) -> None:
    """In a forked child, invoke raises EngineError saying to make the engine after the fork.

    The message leads a gunicorn --preload user to the fix (a post_fork hook,
    or no --preload).
    """
    engine = make_engine()
    engine.register("wf", lambda ctx: "ok")
    engine.start()
    pid = os.fork()
    if pid == 0:  # the child: leave through os._exit on every path
        code = 3
        try:
            engine.invoke("wf")
            code = 1  # not refused
        except EngineError as err:
            says = ("before os.fork()", "after the fork", "post_fork", "--preload")
            code = 0 if all(words in str(err) for words in says) else 2
        except BaseException:
            code = 4
        finally:
            os._exit(code)
    deadline = time.monotonic() + PATIENCE
    while (reaped := os.waitpid(pid, os.WNOHANG))[0] == 0:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            reaped = os.waitpid(pid, 0)
            break
        time.sleep(0.01)
    outcomes = {
        0: "refused", 1: "invoke worked", 2: "another EngineError", 4: "another error",
        -signal.SIGKILL: f"hung, killed after {PATIENCE} s",
    }
    code = os.waitstatus_to_exitcode(reaped[1])
    assert code == 0, f"the child's invoke: {outcomes.get(code, code)}"
    assert engine.invoke("wf").result(timeout=PATIENCE) == "ok"
    engine.wait_all()


# ---------------------------------------------------------------------- start, stop, wait_all


#: Upper bound for any wait in these tests; a healthy run ends in milliseconds.
TIMEOUT = 10.0


def test_invoke_before_start_fails(engine: Engine) -> None:
    """Invoking on an engine that was never started raises NotStarted and stores nothing."""
    runs: list[str] = []
    engine.register("noop", lambda ctx: runs.append(ctx.instance_id))

    with pytest.raises(NotStarted):
        engine.invoke("noop")

    assert engine.list_instances("noop") == []
    assert runs == []


def test_invoke_unknown_workflow_fails(engine: Engine) -> None:
    """Invoking a name nobody registered raises WorkflowNotFound naming it, and stores nothing."""
    engine.start()

    with pytest.raises(WorkflowNotFound, match="nonexistent"):
        engine.invoke("nonexistent")

    assert engine.list_instances("nonexistent") == []


def test_an_engine_whose_start_failed_stops_and_closes_cleanly(tmp_path: Path) -> None:
    """Registering as an owner fails: start raises it, and stop and close still work."""
    engine, store = build(tmp_path / "db")

    def register_owner(lease: float, now: float, declares: str | None = None) -> None:
        raise StorageError("cannot register the engine (forced)")

    store.register_owner = register_owner  # type: ignore[method-assign]
    with pytest.raises(StorageError, match="forced"):
        engine.start()
    engine.stop()
    engine.close()
    assert not [t for t in threading.enumerate() if t.name == "memable-timers"]


def test_stop_leaves_an_engine_stopped_for_good() -> None:
    """stop() on a new engine or a started one: it says stopped, and it cannot start (again)."""
    for start_first in (False, True):
        engine = Engine.in_memory()
        if start_first:
            engine.start()
        engine.stop()
        assert repr(engine).startswith("<Engine stopped ")
        with pytest.raises(EngineError):
            engine.start()
        engine.close()
        assert repr(engine).startswith("<Engine closed ")


def test_wait_all_waits_for_completion(engine: Engine) -> None:
    """wait_all blocks while runs are still going and returns once every one of them has ended."""
    gate = threading.Event()
    calls: list[str] = []

    def step(instance_id: str) -> int:
        gate.wait(TIMEOUT)
        calls.append(instance_id)
        return 1

    def wf(ctx: Context) -> None:
        ctx.step("x").run(step, ctx.instance_id)

    engine.register("wf", wf)
    engine.start()

    ids = [engine.invoke("wf").instance_id for _ in range(3)]

    drained = threading.Event()

    def drain() -> None:
        engine.wait_all()
        drained.set()

    waiter = threading.Thread(target=drain, name="test-wait-all")
    waiter.start()
    try:
        # Every run is held at the gate, so wait_all must still be waiting.
        assert not drained.wait(0.2), "wait_all returned while runs were still active"
        assert calls == []
    finally:
        gate.set()
        waiter.join(TIMEOUT)
    assert drained.is_set()

    assert sorted(calls) == sorted(ids)
    for instance_id in ids:
        meta = engine.get_metadata("wf", instance_id)
        assert meta is not None
        assert meta.status == MetadataStatus.Completed()


def test_invoke_after_wait_all_fails(engine: Engine) -> None:
    """Once wait_all has drained the engine, invoke raises NotStarted and stores nothing."""
    runs: list[str] = []
    engine.register("noop", lambda ctx: runs.append(ctx.instance_id))
    engine.start()

    engine.wait_all()

    with pytest.raises(NotStarted):
        engine.invoke("noop")
    assert engine.list_instances("noop") == []
    assert runs == []


def test_wait_all_with_no_active_tasks(engine: Engine) -> None:
    """wait_all on a started engine with nothing running returns at once and leaves no thread."""
    before = {t for t in threading.enumerate() if t.name.startswith("memable")}
    engine.start()

    waiter = threading.Thread(target=engine.wait_all, name="test-wait-all")
    waiter.start()
    waiter.join(TIMEOUT)

    assert not waiter.is_alive(), "wait_all did not return with no active runs"
    assert {t for t in threading.enumerate() if t.name.startswith("memable")} <= before
    assert engine.list_instances("anything") == []


def test_wait_all_waits_for_a_timer_firing_that_another_caller_started() -> None:
    """Two callers fire timers at once; the one that found nothing ends first. wait_all must
    still wait for the other, whose run it then drains (it drained nothing and stopped)."""
    now = [1_800_000_000.0]
    store = SQLiteStore(None, "full")
    engine = Engine(store, Options(poll_interval=60, lease=600, clock=Clock(wall=lambda: now[0])))
    engine.register("wf", lambda ctx: ctx.timer("t", 3600) or "woke")
    entered, release = threading.Event(), threading.Event()
    real = store.fire_due_timers

    def held(*args: Any) -> Any:
        fired = real(*args)
        if fired:
            entered.set()
            assert release.wait(10)
        return fired

    store.fire_due_timers = held  # type: ignore[method-assign]
    engine.start()
    try:
        inv = engine.invoke("wf", instance_id="x")
        assert str(inv.wait(timeout=10)) == "suspended: timer t"
        now[0] += 3601
        first = threading.Thread(target=engine.fire_due_timers)
        first.start()
        assert entered.wait(10)
        assert engine.fire_due_timers() == 0  # the second caller: nothing left to fire
        waiter = threading.Thread(target=engine.wait_all)
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive()  # the first caller's firing is still under way
        release.set()
        waiter.join(10)
        first.join(10)
        assert engine.get_metadata("wf", "x") is not None
        assert inv.result(timeout=10) == "woke"
    finally:
        release.set()
        engine.close()


class _NotingWaits:
    """A runner's idle condition that says when a caller begins to wait on it."""

    def __init__(self, cond: threading.Condition) -> None:
        self._cond = cond
        self.waiting = threading.Event()

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None = None) -> bool:
        self.waiting.set()
        return self._cond.wait_for(predicate, timeout)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._cond, name)


def test_wait_all_takes_no_new_work_while_it_drains() -> None:
    """While wait_all waits for a run held in its step, invoke raises NotStarted; the run it
    waits for still completes."""
    engine = Engine.in_memory()
    entered, release = threading.Event(), threading.Event()
    engine.register("wf", lambda ctx: ctx.step("s").run(lambda: entered.set() or release.wait(10)))
    runs = runner_of(engine).runs
    idle = _NotingWaits(runs._idle)
    runs._idle = idle  # type: ignore[assignment]
    engine.start()
    try:
        inv = engine.invoke("wf", instance_id="x")
        assert entered.wait(10)
        drain = threading.Thread(target=engine.wait_all)
        drain.start()
        assert idle.waiting.wait(10)
        with pytest.raises(NotStarted):
            engine.invoke("wf", instance_id="y")
        release.set()
        drain.join(10)
        assert inv.result(timeout=10) is True
    finally:
        release.set()
        engine.close()
