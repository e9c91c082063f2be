"""The pytest plugin memable.testing: its fixtures (through pytester), advance, running.

Inside tests/ the conftest's own ``engine`` fixture hides the plugin's, so the
plugin's fixtures are tested in inner pytest sessions (pytester), and
``advance`` and ``running`` directly. The freezegun facts docs/testing.md
states are each checked here, by the test the page names.
"""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from types import ModuleType
from typing import Any

import freezegun
import pytest
from freezegun import freeze_time
from freezegun.config import DEFAULT_IGNORE_LIST
from helpers import T0

import memable.testing
from memable import Context, Engine, Invocation, NotStarted, Retry, Suspended
from memable.testing import FrozenClock, advance, running

ROOT = Path(__file__).resolve().parent.parent
TESTING_PAGE = ROOT / "docs" / "testing.md"


def three_days(ctx: Context) -> str:
    ctx.timer("cool-off:v1", timedelta(days=3))
    return ctx.step("after").run(lambda: "done")


def memable_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("memable")}


def join_step_threads(before: set[threading.Thread]) -> None:
    """Wait for the threads of timed-out steps a test released (they end on their own)."""
    for thread in memable_threads() - before:
        if thread.name.startswith("memable-step"):
            thread.join(timeout=10)
    assert memable_threads() <= before


# ---------------------------------------------------------------------- the plugin API


def test_the_plugin_is_loaded_by_pytest_and_exports_its_api(
    pytestconfig: pytest.Config,
) -> None:
    """The pytest11 entry point loads memable.testing; __all__ is what the docs list."""
    assert pytestconfig.pluginmanager.is_registered(memable.testing)
    assert memable.testing.__all__ == [
        "FrozenClock", "advance", "engine", "memable_configure", "memable_options",
        "memable_workflows", "running",
    ]
    assert all(hasattr(memable.testing, name) for name in memable.testing.__all__)


_WITHOUT_PYTEST = """
import sys
sys.modules["pytest"] = sys.modules["_pytest"] = None  # import pytest: ImportError
from datetime import timedelta
from freezegun import freeze_time
import memable.testing
from memable import Engine
from memable.testing import advance, running
def remind(ctx):
    ctx.timer("cool-off:v1", timedelta(days=3))
    return "reminded"
with freeze_time("2026-01-01") as clock, running(
    Engine.in_memory(poll_interval=60), {"remind": remind}
) as engine:
    inv = engine.invoke("remind")
    print(inv.wait(timeout=10))
    print(advance(engine, clock, timedelta(days=3)), inv.result(timeout=10))
print(hasattr(memable.testing, "memable_engine"))
"""


def test_advance_and_running_work_with_freezegun_alone() -> None:
    """The docs' examples import memable.testing.advance with freezegun installed and
    pytest not: the module imports, advance and running work, and only the fixtures are
    left out."""
    done = subprocess.run([sys.executable, "-c", _WITHOUT_PYTEST], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["suspended: timer cool-off:v1", "1 reminded", "False"]


# ---------------------------------------------------------------------- advance


def test_advance_fires_a_three_day_timer_only_at_three_days(
    make_engine: Callable[..., Engine],
) -> None:
    """+2 days fires nothing and leaves the instance suspended; +1 more day fires it."""
    engine = make_engine(poll_interval=60)
    engine.register("wf", three_days)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf")
        assert inv.wait(timeout=10) == Suspended("timer cool-off:v1")
        assert advance(engine, clock, timedelta(days=2)) == 0
        assert inv.state == Suspended("timer cool-off:v1")
        assert advance(engine, clock, timedelta(days=1)) == 1
        assert inv.result(timeout=10) == "done"
        assert datetime.now(timezone.utc) == T0 + timedelta(days=3)


@pytest.mark.parametrize("by", [3600, 3600.0, timedelta(hours=1)])
def test_advance_takes_seconds_or_a_timedelta_and_counts_every_timer(
    make_engine: Callable[..., Engine], by: float | timedelta
) -> None:
    """Three 1-hour timers and one 2-hour timer: +1 h fires three, +1 h more fires one."""
    engine = make_engine(poll_interval=60)
    engine.register("wf", lambda ctx, hours: ctx.timer("t", timedelta(hours=hours)) or hours)
    with freeze_time(T0) as clock, engine:
        invs = [engine.invoke("wf", hours) for hours in (1, 1, 1, 2)]
        for inv in invs:
            assert inv.wait(timeout=10) == Suspended("timer t")
        assert advance(engine, clock, by) == 3
        assert [inv.result(timeout=10) for inv in invs[:3]] == [1, 1, 1]
        assert invs[3].state == Suspended("timer t")
        assert advance(engine, clock, by) == 1
        assert invs[3].result(timeout=10) == 2


@pytest.mark.parametrize(
    ("by", "error", "words"),
    [
        (-1, ValueError, "forward only, not by -1 s"),
        (-0.5, ValueError, "forward only"),
        (timedelta(days=-1), ValueError, "forward only, not by -86400 s"),
        (float("nan"), ValueError, "finite"),
        (float("inf"), ValueError, "finite"),
        ("60", TypeError, "timedelta or seconds, not str"),
        (True, TypeError, "not bool"),
        (None, TypeError, "not NoneType"),
    ],
)
def test_advance_refuses_what_is_not_a_forward_duration_and_leaves_the_clock(
    make_engine: Callable[..., Engine], by: Any, error: type[Exception], words: str
) -> None:
    """A negative, non-finite or non-duration ``by`` raises before the clock moves."""
    engine = make_engine()
    with freeze_time(T0) as clock, engine:
        with pytest.raises(error, match=re.escape(words)):
            advance(engine, clock, by)
        assert datetime.now(timezone.utc) == T0


@pytest.mark.parametrize("by", [0, 0.0, timedelta(0)])
def test_advance_by_zero_is_allowed_and_fires_nothing_not_due(
    make_engine: Callable[..., Engine], by: float | timedelta
) -> None:
    """by=0 is no error: the clock stays where it is and a timer not due stays waiting."""
    engine = make_engine(poll_interval=60)
    engine.register("wf", three_days)
    with freeze_time(T0) as clock, engine:
        inv = engine.invoke("wf")
        assert inv.wait(timeout=10) == Suspended("timer cool-off:v1")
        assert advance(engine, clock, by) == 0
        assert datetime.now(timezone.utc) == T0
        assert inv.state == Suspended("timer cool-off:v1")


@pytest.mark.parametrize("when", ["not started", "stopped"])
def test_advance_on_an_engine_not_running_raises_and_leaves_the_clock(
    make_engine: Callable[..., Engine], when: str
) -> None:
    """NotStarted, before the clock moves, on an engine never started or already stopped."""
    engine = make_engine()
    if when == "stopped":
        engine.start()
        engine.stop()
    with freeze_time(T0) as clock:
        with pytest.raises(NotStarted):
            advance(engine, clock, timedelta(days=1))
        assert datetime.now(timezone.utc) == T0


class TimerThreadFiresFirst:
    """A FrozenClock that, once moved, waits until the engine's timer thread has fired."""

    def __init__(self, frozen: FrozenClock, inv: Invocation) -> None:
        self._frozen = frozen
        self._inv = inv

    def tick(self, delta: timedelta, /) -> object:
        moved = self._frozen.tick(delta)
        # Only the timer thread can complete the instance before advance fires.
        self._inv.result(timeout=10)
        return moved


def test_advance_counts_a_timer_the_timer_thread_fired_first() -> None:
    """When the timer thread wins the race to a due timer, advance still reports it."""
    engine = Engine.in_memory(poll_interval=0.02)
    engine.register("wf", three_days)
    with freeze_time(T0) as frozen, running(engine):
        inv = engine.invoke("wf")
        assert inv.wait(timeout=10) == Suspended("timer cool-off:v1")
        assert advance(engine, TimerThreadFiresFirst(frozen, inv), timedelta(days=3)) == 1
        assert engine.fire_due_timers() == 0


def test_advance_counts_a_retry_backoff_the_timer_thread_fired_first(
    make_engine: Callable[..., Engine],
) -> None:
    """A step's durable retry backoff leaves no trace on its key when fired (the run makes
    the next attempt): advance counts it by its timer row, gone, whoever fired it. The
    engine's own firing stands in for the timer thread winning (it fires, reports 0)."""
    engine = make_engine(poll_interval=60)
    attempts: list[int] = []

    def flaky() -> str:
        attempts.append(1)
        if len(attempts) == 1:
            raise ConnectionError("try again later")
        return "ok"

    policy = Retry(max_attempts=2, initial_delay=5, jitter=False)
    engine.register("wf", lambda ctx: ctx.step("call").retry(policy).run(flaky))
    real = engine.fire_due_timers

    def timer_thread_won() -> int:
        real()
        return 0

    engine.fire_due_timers = timer_thread_won  # type: ignore[method-assign]
    with freeze_time(T0) as frozen, engine:
        inv = engine.invoke("wf", instance_id="w")
        assert inv.wait(timeout=10) == Suspended("retry call")
        assert advance(engine, frozen, timedelta(seconds=5)) == 1
        assert inv.result(timeout=10) == "ok"


@pytest.mark.parametrize(
    "freeze", [{}, {"tick": True}, {"auto_tick_seconds": 1}], ids=["frozen", "tick", "auto"]
)
def test_advance_moves_every_kind_of_freezegun_clock(
    make_engine: Callable[..., Engine], freeze: dict[str, Any]
) -> None:
    """FrozenDateTimeFactory, TickingDateTimeFactory and StepTickTimeFactory all work."""
    engine = make_engine(poll_interval=60)
    engine.register("wf", three_days)
    with freeze_time(T0, **freeze) as clock, engine:
        inv = engine.invoke("wf")
        assert inv.wait(timeout=10) == Suspended("timer cool-off:v1")
        assert advance(engine, clock, timedelta(days=2)) == 0
        assert advance(engine, clock, timedelta(days=1)) == 1
        assert inv.result(timeout=10) == "done"


# ---------------------------------------------------------------------- freezegun facts


def test_with_tick_false_even_a_short_timer_waits_for_advance() -> None:
    """Frozen time never reaches a 50 ms deadline by itself: the timer waits for advance."""
    engine = Engine.in_memory()
    engine.register("wf", lambda ctx: ctx.timer("short", 0.05) or "fired")
    with freeze_time(T0) as clock, running(engine):
        inv = engine.invoke("wf")
        with pytest.raises(TimeoutError):
            inv.result(timeout=0.5)
        assert advance(engine, clock, 0.05) == 1
        assert inv.result(timeout=10) == "fired"


def test_with_tick_true_a_short_timer_fires_by_itself() -> None:
    """A ticking clock reaches a 50 ms deadline on its own; no advance needed."""
    engine = Engine.in_memory()
    engine.register("wf", lambda ctx: ctx.timer("short", 0.05) or "fired")
    with freeze_time(T0, tick=True), running(engine):
        assert engine.invoke("wf").result(timeout=10) == "fired"


@pytest.mark.parametrize("freeze", [{}, {"ignore": ["myapp"]}], ids=["default", "ignore"])
def test_waits_time_out_in_real_seconds_while_the_clock_is_frozen(freeze: dict[str, Any]) -> None:
    """wait/result(timeout) time out though time.monotonic(), read from a test, is frozen.

    ``ignore=[...]`` adds to freezegun's ignore list: 'threading' stays in it.
    """
    release = threading.Event()
    engine = Engine.in_memory()
    engine.register("wf", lambda ctx: ctx.step("block").run(release.wait, 10) and "released")
    with freeze_time(T0, **freeze), running(engine):
        first = time.monotonic()
        inv = engine.invoke("wf")
        try:
            with pytest.raises(TimeoutError):
                inv.wait(timeout=0.2)
            with pytest.raises(TimeoutError, match=r"not terminal after 0\.2 s"):
                inv.result(timeout=0.2)
            assert time.monotonic() == first
        finally:
            release.set()
        assert inv.result(timeout=10) == "released"


@pytest.fixture
def threading_not_ignored() -> Iterator[None]:
    """freezegun configured with its default ignore list minus 'threading'."""
    freezegun.configure(
        default_ignore_list=[name for name in DEFAULT_IGNORE_LIST if name != "threading"]
    )
    try:
        yield
    finally:
        freezegun.config.reset_config()


@pytest.mark.usefixtures("threading_not_ignored")
def test_without_threading_in_the_ignore_list_waits_never_time_out() -> None:
    """With 'threading' frozen, result(timeout=0.1) is still blocked 1 s later."""
    engine = Engine.in_memory(poll_interval=60)
    engine.register("wf", lambda ctx: ctx.suspend("go:v1"))
    outcome: list[object] = []
    returned = threading.Event()

    def wait_for_the_result(inv: Invocation) -> None:
        try:
            outcome.append(inv.result(timeout=0.1))
        except TimeoutError as exc:
            outcome.append(exc)
        returned.set()

    with freeze_time(T0), running(engine):
        inv = engine.invoke("wf")
        assert inv.wait(timeout=10) == Suspended("go:v1")
        waiter = threading.Thread(target=wait_for_the_result, args=(inv,))
        waiter.start()
        assert not returned.wait(1.0)  # ten times its timeout, and still waiting
        engine.signal("wf", inv.instance_id, "go:v1", "released")  # what ends the wait
        assert returned.wait(10)
        waiter.join()
    assert outcome == ["released"]


def test_workflow_code_and_stored_dates_see_the_frozen_clock() -> None:
    """Steps reading datetime.now() or time.time(), and the stored dates, get frozen time."""
    engine = Engine.in_memory()

    def wf(ctx: Context) -> list[float]:
        now = ctx.step("now").run(lambda: datetime.now(timezone.utc).timestamp())
        return [now, ctx.step("time").run(time.time), time.time()]

    engine.register("wf", wf)
    with freeze_time(T0), running(engine):
        inv = engine.invoke("wf")
        assert inv.result(timeout=10) == [T0.timestamp()] * 3
        metadata = engine.get_metadata("wf", inv.instance_id)
        assert metadata is not None
        assert metadata.created_at == metadata.completed_at == T0


def test_a_step_with_a_timeout_reads_real_time_from_time_time() -> None:
    """In a step with .timeout(), time.time() is real (threading is near); datetime.now() not."""
    engine = Engine.in_memory()

    def wf(ctx: Context) -> list[float]:
        return [
            ctx.step("time").timeout(10).run(time.time),
            ctx.step("now").timeout(10).run(lambda: datetime.now(timezone.utc).timestamp()),
        ]

    engine.register("wf", wf)
    real_before = time.time()
    with freeze_time(T0), running(engine):
        in_timed_step, now_in_timed_step = engine.invoke("wf").result(timeout=10)
    assert in_timed_step >= real_before
    assert now_in_timed_step == T0.timestamp()


@pytest.mark.parametrize(
    "options",
    [{}, {"poll_interval": 3600, "lease": 0.3}],
    ids=["every-second", "lease-caps-the-poll"],
)
def test_the_timer_thread_fires_what_a_bare_clock_tick_made_due(options: dict[str, Any]) -> None:
    """Moved without advance, a due timer is fired by the timer thread at its next look.

    It looks every min(poll_interval, lease / 3) real seconds: 1 s by default,
    0.1 s with a lease of 0.3 s whatever the poll_interval.
    """
    engine = Engine.in_memory(**options)
    engine.register("wf", three_days)
    with freeze_time(T0) as clock, running(engine):
        inv = engine.invoke("wf")
        assert inv.wait(timeout=10) == Suspended("timer cool-off:v1")
        clock.tick(timedelta(days=3))
        assert inv.result(timeout=10) == "done"


# ---------------------------------------------------------------------- running


def test_running_registers_starts_drains_and_closes_a_file_engine(tmp_path: Path) -> None:
    """running() is the engine fixture's body: it works on an engine of one's own."""
    release = threading.Event()
    ended: list[str] = []

    def slow(ctx: Context) -> None:
        ctx.step("s").run(release.wait, 10)
        ended.append(ctx.instance_id)

    engine = Engine.open(tmp_path / "workflows.db")
    with running(engine, {"slow": slow}) as same:
        assert same is engine
        inv = engine.invoke("slow")
        release.set()
    # Drained: the run ended; closed: it takes no more work.
    assert ended == [inv.instance_id]
    with pytest.raises(NotStarted):
        engine.invoke("slow")
    assert (tmp_path / "workflows.db").exists()


def run_a_step_that_times_out(engine: Engine, thread_timeout: float) -> None:
    """Invoke "hang" under running() and see its step time out."""
    with running(engine, thread_timeout=thread_timeout):
        inv = engine.invoke("hang", instance_id="h-1")
        assert "timed out" in str(inv.wait(timeout=10))


def test_running_reports_a_timed_out_step_still_running_by_name() -> None:
    """A thread of a timed-out step that outlives thread_timeout fails the test, named."""
    release = threading.Event()
    before = memable_threads()
    engine = Engine.in_memory()
    engine.register("hang", lambda ctx: ctx.step("hang:v1").timeout(0.05).run(release.wait, 30))
    try:
        with pytest.raises(pytest.fail.Exception) as failure:
            run_a_step_that_times_out(engine, thread_timeout=0.05)
    finally:
        release.set()
    assert str(failure.value).splitlines() == [
        "1 memable thread(s) outlived the engine:",
        "  'memable-step hang/h-1/hang:v1': a timed-out step still running 0.05 s after "
        "the engine closed; release what it waits on before the test ends",
    ]
    join_step_threads(before)


def test_running_waits_for_a_released_step_thread_and_passes() -> None:
    """A timed-out step that ends within thread_timeout is no leak."""
    release = threading.Event()
    engine = Engine.in_memory()
    engine.register("hang", lambda ctx: ctx.step("hang:v1").timeout(0.05).run(release.wait, 30))
    with running(engine, thread_timeout=10):
        assert "timed out" in str(engine.invoke("hang").wait(timeout=10))
        release.set()  # the step thread ends during teardown's bounded join
    assert not [t for t in memable_threads() if t.name.startswith("memable-step hang")]


def test_running_reports_an_engine_left_open() -> None:
    """Threads of another engine started in the block and never closed are reported."""
    left_open = Engine.in_memory()
    leak = "'memable-timers': a thread of an engine that was started and never closed"
    try:
        with pytest.raises(pytest.fail.Exception, match=leak), running(Engine.in_memory()):
            left_open.start()
    finally:
        left_open.close()


def test_running_closes_the_engine_when_the_block_raises() -> None:
    """An error in the block propagates; the engine is closed, no leak check runs."""
    engine = Engine.in_memory()
    with pytest.raises(KeyError), running(engine, {"wf": lambda ctx: None}):
        raise KeyError("boom")
    with pytest.raises(NotStarted):
        engine.invoke("wf")


# ---------------------------------------------------------------------- inner sessions

STRICT_INI = """
[pytest]
addopts = -p no:cacheprovider
filterwarnings =
    error
"""


def example_files(variant: str = "") -> dict[str, str]:
    """The ``# name.py`` python blocks of docs/testing.md with the given variant suffix."""
    blocks = re.findall(
        r"^```python\n# (\w+\.py)([^\n]*)\n(.*?)^```$", TESTING_PAGE.read_text(), re.M | re.S
    )
    return {name: code for name, suffix, code in blocks if suffix == variant}


@pytest.fixture
def inner(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester directory whose inner sessions turn warnings into errors."""
    pytester.makeini(STRICT_INI)
    return pytester


def test_the_testing_page_example_passes_as_written(inner: pytest.Pytester) -> None:
    """docs/testing.md's conftest.py and test_reminders.py pass on the plugin's engine."""
    files = example_files()
    assert sorted(files) == ["conftest.py", "test_reminders.py"]
    for name, code in files.items():
        inner.makepyfile(**{name.removesuffix(".py"): code})
    inner.runpytest().assert_outcomes(passed=3)


def test_the_testing_page_file_backed_engine_passes_the_same_tests(
    inner: pytest.Pytester,
) -> None:
    """The page's file-backed conftest.py runs the same test_reminders.py, on a file."""
    files = example_files(", with a file-backed engine")
    assert sorted(files) == ["conftest.py"]
    inner.makepyfile(conftest=files["conftest.py"])
    inner.makepyfile(test_reminders=example_files()["test_reminders.py"])
    inner.makepyfile(
        test_on_a_file="""
        from pathlib import Path

        def test_the_engine_is_on_a_file(memable_engine, tmp_path: Path) -> None:
            memable_engine.invoke("remind", "x@example.com").wait(timeout=10)
            assert (tmp_path / "workflows.db").exists()
        """
    )
    inner.runpytest().assert_outcomes(passed=4)


def test_the_default_fixtures_give_an_empty_started_engine_closed_after(
    inner: pytest.Pytester,
) -> None:
    """No overrides: no workflows, no options; started during the test, stopped after."""
    inner.makepyfile(
        """
        import pytest
        from memable import Engine, NotStarted, WorkflowNotFound

        seen = []

        def test_defaults(memable_engine, memable_workflows, memable_options):
            assert isinstance(memable_engine, Engine)
            assert (memable_workflows, memable_options) == ({}, {})
            with pytest.raises(WorkflowNotFound):
                memable_engine.invoke("nothing")
            with pytest.raises(WorkflowNotFound):  # started: taken, and no such workflow
                memable_engine.signal("wf", "id", "key", 1)
            seen.append(memable_engine)

        def test_the_previous_engine_is_stopped():
            [previous] = seen
            with pytest.raises(NotStarted):
                previous.signal("wf", "id", "key", 1)
        """
    )
    inner.runpytest().assert_outcomes(passed=2)


def test_memable_configure_sets_up_the_engine_before_it_starts(inner: pytest.Pytester) -> None:
    """An override of memable_configure declares a queue and registers a workflow on it;
    it runs before the engine starts (the engine refuses both after), and the
    workflows of memable_workflows are registered too."""
    inner.makepyfile(
        """
        import pytest

        def configure(engine):
            engine.queue("jobs", concurrency=1)
            engine.register("double", lambda ctx, n: n * 2, queue="jobs")

        @pytest.fixture
        def memable_configure():
            return configure

        @pytest.fixture
        def memable_workflows():
            return {"plain": lambda ctx: "here"}

        def test_the_queue_and_both_workflows(memable_engine):
            assert memable_engine.invoke("double", 21).result(timeout=10) == 42
            assert memable_engine.invoke("plain").result(timeout=10) == "here"
            meta = memable_engine.list_instances("double")[0][1]
            assert meta.status.name == "completed"
        """
    )
    inner.runpytest().assert_outcomes(passed=1)


def test_overrides_in_a_conftest_a_module_and_a_parametrize(inner: pytest.Pytester) -> None:
    """memable_workflows / memable_options overridden at each level reach the engine."""
    inner.makeconftest(
        """
        import pytest
        from memable import Retry

        def flaky_twice(ctx):
            calls = []
            def call():
                calls.append(1)
                if len(calls) < 3:
                    raise ConnectionError("again")
                return len(calls)
            return ctx.step("call:v1").run(call)

        @pytest.fixture
        def memable_workflows():
            return {"flaky": flaky_twice}

        @pytest.fixture
        def slept():
            return []

        @pytest.fixture
        def memable_options(slept):
            retry = Retry(max_attempts=3, initial_delay=1.5, jitter=False)
            return {"retry": retry, "sleep": slept.append, "poll_interval": 60}
        """
    )
    inner.makepyfile(
        test_conftest_level="""
        def test_the_options_reach_the_engine(memable_engine, slept):
            assert memable_engine.invoke("flaky").result(timeout=10) == 3
            assert slept == [1.5, 3.0]  # the retry policy and the sleep of the options
        """,
        test_module_level="""
        import pytest
        from memable import WorkflowNotFound

        @pytest.fixture
        def memable_workflows():
            return {"double": lambda ctx, n: 2 * n}

        def test_the_module_workflows_replace_the_conftest_ones(memable_engine):
            assert memable_engine.invoke("double", 21).result(timeout=10) == 42
            with pytest.raises(WorkflowNotFound):
                memable_engine.invoke("flaky")
        """,
        test_parametrize_level="""
        import pytest
        from memable import Failed

        @pytest.mark.parametrize("memable_options", [{"max_workers": 1}])
        def test_options_for_one_test(memable_engine, memable_options):
            # No retry policy in these options: the first error fails the run.
            assert isinstance(memable_engine.invoke("flaky").wait(timeout=10), Failed)
        """,
    )
    inner.runpytest().assert_outcomes(passed=3)


def test_bad_options_are_an_error_of_the_fixture(inner: pytest.Pytester) -> None:
    """An option Engine.in_memory does not take errors the test at setup, naming it."""
    inner.makepyfile(
        """
        import pytest

        @pytest.fixture
        def memable_options():
            return {"pol_interval": 60}

        def test_x(memable_engine):
            pass
        """
    )
    result = inner.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*unexpected keyword argument 'pol_interval'*"])


@pytest.fixture
def gate(pytester: pytest.Pytester) -> Iterator[ModuleType]:
    """A module both this test and its inner session import: what the leaks wait on."""
    pytester.makepyfile(
        memable_leak_gate="""
        import threading

        RELEASE = threading.Event()
        ENGINES = []
        """
    )
    pytester.syspathinsert()
    importlib.invalidate_caches()
    module = importlib.import_module("memable_leak_gate")
    before = memable_threads()
    try:
        yield module
    finally:
        module.RELEASE.set()
        for engine in module.ENGINES:
            engine.close()
        join_step_threads(before)


def test_a_timed_out_step_left_running_is_reported_at_teardown(
    inner: pytest.Pytester, gate: ModuleType
) -> None:
    """The engine fixture fails the test at teardown naming the step thread still alive."""
    inner.makepyfile(
        """
        import pytest
        from memable_leak_gate import RELEASE

        def hang(ctx):
            return ctx.step("hang:v1").timeout(0.05).run(RELEASE.wait, 30)

        @pytest.fixture
        def memable_workflows():
            return {"hang": hang}

        def test_leaks(memable_engine):
            state = memable_engine.invoke("hang", instance_id="h-1").wait(timeout=10)
            assert "timed out" in state.message
        """
    )
    result = inner.runpytest("-o", "memable_thread_timeout=0.05")
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks*",
            "*1 memable thread(s) outlived the engine:",
            "*'memable-step hang/h-1/hang:v1': a timed-out step still running 0.05 s after"
            " the engine closed; release what it waits on before the test ends",
        ]
    )


def test_an_engine_the_test_started_and_left_open_is_reported(
    inner: pytest.Pytester, gate: ModuleType
) -> None:
    """Threads of an engine the test itself started and never closed fail it, by name."""
    inner.makepyfile(
        """
        from memable import Engine
        from memable_leak_gate import ENGINES

        def test_forgets_to_close(memable_engine):
            other = Engine.in_memory()
            ENGINES.append(other)
            other.register("wf", lambda ctx: 1)
            other.start()
            assert other.invoke("wf").result(timeout=10) == 1
        """
    )
    result = inner.runpytest()
    result.assert_outcomes(passed=1, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*memable thread(s) outlived the engine:",
            "*'memable-timers': a thread of an engine that was started and never closed",
        ]
    )
    result.stdout.fnmatch_lines(["*'memable-worker_0': a thread of an engine*"])


def test_a_released_step_thread_is_no_leak(inner: pytest.Pytester, gate: ModuleType) -> None:
    """A timed-out step released by the test ends within the bound: the test passes."""
    inner.makepyfile(
        """
        import pytest
        from memable_leak_gate import RELEASE

        @pytest.fixture
        def memable_workflows():
            return {"hang": lambda ctx: ctx.step("h").timeout(0.05).run(RELEASE.wait, 30)}

        def test_releases(memable_engine):
            assert "timed out" in memable_engine.invoke("hang").wait(timeout=10).message
            RELEASE.set()
        """
    )
    inner.runpytest().assert_outcomes(passed=1)


def test_a_bad_thread_timeout_setting_is_a_usage_error(inner: pytest.Pytester) -> None:
    """memable_thread_timeout must be a number of seconds >= 0."""
    inner.makepyfile("def test_x(memable_engine):\n    pass\n")
    result = inner.runpytest("-o", "memable_thread_timeout=soon")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*memable_thread_timeout must be a number of seconds*"])


def test_the_old_fixture_name_works_and_warns(inner: pytest.Pytester) -> None:
    """``engine`` is the same engine as ``memable_engine``, with a DeprecationWarning."""
    inner.makepyfile(
        """
        def test_old_name(engine, memable_engine):
            assert engine is memable_engine
        """
    )
    result = inner.runpytest("-W", "always::DeprecationWarning")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(
        ["*DeprecationWarning: the memable fixture 'engine' is now 'memable_engine'*"]
    )


def test_a_projects_own_engine_fixture_wins_over_the_old_name(inner: pytest.Pytester) -> None:
    """A conftest ``engine`` (SQLAlchemy's, say) is the one tests get; memable warns nothing."""
    inner.makeconftest(
        """
        import pytest

        @pytest.fixture
        def engine():
            return "the project's own"
        """
    )
    inner.makepyfile(
        """
        from memable import Engine

        def test_both(engine, memable_engine):
            assert engine == "the project's own"
            assert isinstance(memable_engine, Engine)
        """
    )
    result = inner.runpytest("-W", "error::DeprecationWarning")
    result.assert_outcomes(passed=1)


def test_the_plugin_loads_and_runs_without_freezegun(pytester: pytest.Pytester) -> None:
    """In a project where freezegun cannot be imported, the plugin and its engine work."""
    pytester.makepyfile(
        freezegun="raise ImportError('freezegun is not installed here')",
        test_no_freezegun="""
        import pytest
        from memable.testing import advance

        @pytest.fixture
        def memable_workflows():
            return {"hello": lambda ctx: "hello"}

        def test_without_freezegun(memable_engine):
            with pytest.raises(ImportError, match="not installed here"):
                import freezegun
            assert memable_engine.invoke("hello").result(timeout=10) == "hello"
        """,
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
