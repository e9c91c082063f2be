"""The seed's suspend/signal, timer and step-timeout tests."""

from __future__ import annotations

import threading
from typing import Any

from memable import (
    Completed,
    Context,
    Engine,
    Failed,
    Invocation,
    MetadataStatus,
    StepError,
    StepRecord,
    Suspended,
    WorkflowState,
)

#: Upper bound for any wait in these tests; a healthy run ends in milliseconds.
TIMEOUT = 10.0


def _rows(records: list[StepRecord]) -> list[tuple[str, str, str, Any]]:
    """The (key, kind, state, result) of each stored record, in the order reached."""
    return [(r.key, r.kind, r.state, r.result) for r in records]


def _end_of_held_run(inv: Invocation, release: threading.Event) -> list[WorkflowState]:
    """Follow the run of ``inv`` that a step holds at ``release`` until it ends.

    The run cannot end before ``release`` is set, so subscribing first is sure to follow
    that run, not one a zero timer starts right after it: the list is everything the run
    published, its last item the state the run ended in.
    """
    updates = inv.updates()
    release.set()
    return list(updates)


def _metadata_status(engine: Engine, name: str, instance_id: str) -> MetadataStatus:
    meta = engine.get_metadata(name, instance_id)
    assert meta is not None
    return meta.status


# ---------------------------------------------------------------------- suspend and signal


def test_suspend_then_signal_completes(engine: Engine) -> None:
    """Ports seed test suspend_then_signal_completes.

    A run reaching an unsignalled suspend point ends Suspended(key); the signal stores the
    payload as the key's value and a new run returns it from suspend and completes.
    """
    calls: list[str] = []

    def s1() -> int:
        calls.append("s1")
        return 1

    def wf(ctx: Context) -> str:
        ctx.step("s1").run(s1)
        payload: str = ctx.suspend("wait:v1")
        return payload

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Suspended("wait:v1")
    assert _metadata_status(engine, "wf", inv.instance_id) == MetadataStatus.Suspended("wait:v1")
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("s1", "step", "completed", 1),
        ("wait:v1", "signal", "waiting", None),
    ]
    assert calls == ["s1"]

    signalled = engine.signal("wf", inv.instance_id, "wait:v1", "hello")
    assert signalled.instance_id == inv.instance_id
    assert signalled.wait(TIMEOUT) == Completed()
    assert signalled.result(TIMEOUT) == "hello"
    assert _metadata_status(engine, "wf", inv.instance_id) == MetadataStatus.Completed()
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("s1", "step", "completed", 1),
        ("wait:v1", "signal", "completed", "hello"),
    ]
    assert calls == ["s1"]


def test_suspend_with_custom_status(engine: Engine) -> None:
    """Ports seed test suspend_with_custom_status.

    A suspend with a status ends the run Suspended with that status (stored in the
    metadata too) instead of the key, and the signalled payload reaches the workflow.
    """

    def wf(ctx: Context) -> bool:
        approved: bool = ctx.suspend("approval:v1", status="Waiting for manager approval")
        return approved

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Suspended("Waiting for manager approval")
    assert _metadata_status(engine, "wf", inv.instance_id) == MetadataStatus.Suspended(
        "Waiting for manager approval"
    )

    signalled = engine.signal("wf", inv.instance_id, "approval:v1", True)
    assert signalled.wait(TIMEOUT) == Completed()
    assert signalled.result(TIMEOUT) is True
    assert _metadata_status(engine, "wf", inv.instance_id) == MetadataStatus.Completed()
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("approval:v1", "signal", "completed", True),
    ]


def test_memoised_steps_preserved_across_suspend(engine: Engine) -> None:
    """Ports seed test memoised_steps_preserved_across_suspend.

    The run a signal starts returns the step completed before the suspend from the store
    and executes only the step after it.
    """
    calls: list[str] = []

    def s1() -> int:
        calls.append("s1")
        return 42

    def s2() -> int:
        calls.append("s2")
        return 99

    def wf(ctx: Context) -> list[Any]:
        a = ctx.step("s1").run(s1)
        gate: str = ctx.suspend("gate:v1")
        b = ctx.step("s2").run(s2)
        return [a, gate, b]

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Suspended("gate:v1")
    assert calls == ["s1"]

    calls.clear()
    signalled = engine.signal("wf", inv.instance_id, "gate:v1", "go")
    assert signalled.wait(TIMEOUT) == Completed()
    assert calls == ["s2"]
    assert signalled.result(TIMEOUT) == [42, "go", 99]
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("s1", "step", "completed", 42),
        ("gate:v1", "signal", "completed", "go"),
        ("s2", "step", "completed", 99),
    ]


def test_resume_without_signal_stays_suspended(engine: Engine) -> None:
    """Ports seed test resume_without_signal_stays_suspended.

    Resuming an instance whose suspend point has no signal yet runs it again only to
    suspend at the same point, with nothing stored for the key but its waiting mark.
    """
    runs: list[str] = []

    def wf(ctx: Context) -> str:
        runs.append(ctx.instance_id)
        payload: str = ctx.suspend("wait:v1")
        return payload

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Suspended("wait:v1")

    resumed = engine.resume("wf", inv.instance_id)
    assert resumed.wait(TIMEOUT) == Suspended("wait:v1")
    assert runs == [inv.instance_id, inv.instance_id]
    assert _metadata_status(engine, "wf", inv.instance_id) == MetadataStatus.Suspended("wait:v1")
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("wait:v1", "signal", "waiting", None),
    ]


def test_multiple_suspend_points(engine: Engine) -> None:
    """Ports seed test multiple_suspend_points.

    Each signal moves the instance to the next suspend point; the second completes it with
    both payloads, each returned at its own suspend.
    """

    def wf(ctx: Context) -> int:
        a: int = ctx.suspend("first:v1")
        b: int = ctx.suspend("second:v1")
        return a * 10 + b

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Suspended("first:v1")

    assert engine.signal("wf", inv.instance_id, "first:v1", 1).wait(TIMEOUT) == Suspended(
        "second:v1"
    )
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("first:v1", "signal", "completed", 1),
        ("second:v1", "signal", "waiting", None),
    ]

    signalled = engine.signal("wf", inv.instance_id, "second:v1", 2)
    assert signalled.wait(TIMEOUT) == Completed()
    assert signalled.result(TIMEOUT) == 12
    assert _rows(engine.steps("wf", inv.instance_id)) == [
        ("first:v1", "signal", "completed", 1),
        ("second:v1", "signal", "completed", 2),
    ]


def test_suspend_after_failed_step_on_resume(engine: Engine) -> None:
    """Ports seed test suspend_after_failed_step_on_resume.

    A step that failed before a suspend point is re-run by resume, which then suspends
    there; the signal completes the instance without running the step a third time.
    """
    calls: list[str] = []

    def s1() -> int:
        calls.append("s1")
        if len(calls) == 1:
            raise StepError.retryable("transient")
        return 1

    def wf(ctx: Context) -> str:
        ctx.step("s1").run(s1)
        payload: str = ctx.suspend("gate:v1")
        return payload

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    state = inv.wait(TIMEOUT)
    assert isinstance(state, Failed)
    assert "'s1'" in state.message
    assert "transient" in state.message
    assert calls == ["s1"]
    assert _rows(engine.steps("wf", inv.instance_id)) == [("s1", "step", "failed", None)]

    assert engine.resume("wf", inv.instance_id).wait(TIMEOUT) == Suspended("gate:v1")
    assert calls == ["s1", "s1"]

    signalled = engine.signal("wf", inv.instance_id, "gate:v1", "done")
    assert signalled.wait(TIMEOUT) == Completed()
    assert signalled.result(TIMEOUT) == "done"
    assert calls == ["s1", "s1"]
    records = engine.steps("wf", inv.instance_id)
    assert _rows(records) == [
        ("s1", "step", "completed", 1),
        ("gate:v1", "signal", "completed", "done"),
    ]
    assert records[0].attempts == 2


# ---------------------------------------------------------------------- timers


def test_timer_fires_and_completes_workflow(engine: Engine) -> None:
    """Ports seed test timer_fires_and_completes_workflow.

    A zero timer ends the run Suspended("timer <key>"); the timer thread fires it by itself
    and the run it starts replays the step before the timer and executes the one after.
    """
    calls: list[str] = []
    release = threading.Event()

    def s1() -> int:
        calls.append("s1")
        release.wait(TIMEOUT)
        return 1

    def s2() -> int:
        calls.append("s2")
        return 2

    def wf(ctx: Context) -> int:
        a: int = ctx.step("s1").run(s1)
        ctx.timer("wait:v1", 0)
        b: int = ctx.step("s2").run(s2)
        return a + b

    engine.register("timer-wf", wf)
    engine.start()

    inv = engine.invoke("timer-wf")
    assert _end_of_held_run(inv, release) == [Suspended("timer wait:v1")]

    # No fire_due_timers() here: the engine's timer thread fires the zero timer.
    assert inv.result(TIMEOUT) == 3
    assert _metadata_status(engine, "timer-wf", inv.instance_id) == MetadataStatus.Completed()
    assert calls == ["s1", "s2"]
    assert _rows(engine.steps("timer-wf", inv.instance_id)) == [
        ("s1", "step", "completed", 1),
        ("wait:v1", "timer", "completed", None),
        ("s2", "step", "completed", 2),
    ]


def test_timer_memoised_on_resume(engine: Engine) -> None:
    """Ports seed test timer_memoised_on_resume.

    Resuming an instance completed past a fired timer replays both the step and the timer
    from the store: nothing executes and no new timer is armed.
    """
    calls: list[str] = []
    release = threading.Event()

    def s1() -> int:
        calls.append("s1")
        release.wait(TIMEOUT)
        return 1

    def wf(ctx: Context) -> str:
        ctx.step("s1").run(s1)
        ctx.timer("delay:v1", 0)
        return "done"

    engine.register("timer-memo", wf)
    engine.start()

    inv = engine.invoke("timer-memo")
    assert _end_of_held_run(inv, release) == [Suspended("timer delay:v1")]
    assert inv.result(TIMEOUT) == "done"
    assert calls == ["s1"]
    fired = engine.steps("timer-memo", inv.instance_id)

    calls.clear()
    resumed = engine.resume("timer-memo", inv.instance_id)
    assert resumed.wait(TIMEOUT) == Completed()
    assert resumed.result(TIMEOUT) == "done"
    assert calls == []
    assert engine.steps("timer-memo", inv.instance_id) == fired
    assert _rows(fired) == [
        ("s1", "step", "completed", 1),
        ("delay:v1", "timer", "completed", None),
    ]
    assert engine.fire_due_timers() == 0


def test_timer_skipped_when_workflow_not_suspended(engine: Engine) -> None:
    """Ports seed test timer_skipped_when_workflow_not_suspended.

    A run that fails before its timer arms none; the resume that gets past the failed step
    arms it, ends Suspended, and the timer thread's firing completes the instance.
    """
    calls: list[str] = []
    release = threading.Event()

    def s1() -> int:
        calls.append("s1")
        if len(calls) == 1:
            raise StepError.retryable("transient")
        release.wait(TIMEOUT)
        return 1

    def wf(ctx: Context) -> str:
        ctx.step("s1").run(s1)
        ctx.timer("delay:v1", 0)
        return "done"

    engine.register("timer-fail", wf)
    engine.start()

    inv = engine.invoke("timer-fail")
    state = inv.wait(TIMEOUT)
    assert isinstance(state, Failed)
    assert "'s1'" in state.message
    assert "transient" in state.message
    assert _rows(engine.steps("timer-fail", inv.instance_id)) == [
        ("s1", "step", "failed", None),
    ]
    assert engine.fire_due_timers() == 0  # the failed run never reached the timer

    resumed = engine.resume("timer-fail", inv.instance_id)
    assert _end_of_held_run(resumed, release) == [Suspended("timer delay:v1")]

    assert resumed.result(TIMEOUT) == "done"
    assert _metadata_status(engine, "timer-fail", inv.instance_id) == MetadataStatus.Completed()
    assert calls == ["s1", "s1"]
    assert _rows(engine.steps("timer-fail", inv.instance_id)) == [
        ("s1", "step", "completed", 1),
        ("delay:v1", "timer", "completed", None),
    ]


def test_timer_with_steps_before_and_after(engine: Engine) -> None:
    """Ports seed test timer_with_steps_before_and_after.

    Two zero timers between three steps each suspend the instance once and are fired by the
    timer thread; every step executes exactly once, in order.
    """
    calls: list[str] = []
    release = threading.Event()

    def step(name: str, value: int) -> int:
        calls.append(name)
        if name == "before":
            release.wait(TIMEOUT)
        return value

    def wf(ctx: Context) -> list[int]:
        before = ctx.step("before").run(step, "before", 1)
        ctx.timer("t1:v1", 0)
        between = ctx.step("between").run(step, "between", 2)
        ctx.timer("t2:v1", 0)
        after = ctx.step("after").run(step, "after", 3)
        return [before, between, after]

    engine.register("multi-timer", wf)
    engine.start()

    inv = engine.invoke("multi-timer")
    assert _end_of_held_run(inv, release) == [Suspended("timer t1:v1")]
    # No look at `calls` here: the zero timer may already have started "between".

    assert inv.result(TIMEOUT) == [1, 2, 3]
    assert _metadata_status(engine, "multi-timer", inv.instance_id) == MetadataStatus.Completed()
    assert calls == ["before", "between", "after"]
    assert _rows(engine.steps("multi-timer", inv.instance_id)) == [
        ("before", "step", "completed", 1),
        ("t1:v1", "timer", "completed", None),
        ("between", "step", "completed", 2),
        ("t2:v1", "timer", "completed", None),
        ("after", "step", "completed", 3),
    ]


# ---------------------------------------------------------------------- step timeouts


def test_step_with_timeout_completes(engine: Engine) -> None:
    """Ports seed test step_with_timeout_completes.

    A step that returns well within its timeout is stored and its value reaches the
    workflow; it ran on a daemon step thread of its own.
    """
    threads: list[threading.Thread] = []

    def answer() -> int:
        threads.append(threading.current_thread())
        return 42

    def wf(ctx: Context) -> int:
        value: int = ctx.step("s1").timeout(5).run(answer)
        return value

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Completed()
    assert inv.result(TIMEOUT) == 42

    [thread] = threads
    assert thread.name.startswith("memable-step")
    assert thread.daemon
    [record] = engine.steps("wf", inv.instance_id)
    assert (record.key, record.kind, record.state, record.result, record.attempts) == (
        "s1", "step", "completed", 42, 1,
    )


def test_step_timeout_exceeds_deadline(engine: Engine) -> None:
    """Ports seed test step_timeout_exceeds_deadline.

    A step still running at its deadline fails the workflow with a StepTimeout naming the
    step and "timed out", without waiting for the hung function.
    """
    release = threading.Event()
    returned = threading.Event()
    calls: list[str] = []

    def hang() -> int:
        calls.append("slow")
        release.wait(TIMEOUT)
        returned.set()
        return 1

    def wf(ctx: Context) -> int:
        value: int = ctx.step("slow").timeout(0.1).run(hang)
        return value

    engine.register("wf", wf)
    engine.start()

    try:
        inv = engine.invoke("wf")
        state = inv.wait(TIMEOUT)
        # The run ended on the deadline alone, while the function was still hanging.
        assert not returned.is_set()
        assert isinstance(state, Failed)
        assert state.message.startswith("step 'slow' failed: StepTimeout: timed out after 0.1 s")
        assert calls == ["slow"]

        [record] = engine.steps("wf", inv.instance_id)
        assert (record.key, record.state, record.result) == ("slow", "failed", None)
        assert record.error is not None
        assert "timed out" in record.error
        assert record.attempts == 1
    finally:
        release.set()


def test_timed_out_step_not_persisted(engine: Engine) -> None:
    """Ports seed test timed_out_step_not_persisted.

    A timed-out step is recorded failed and its late result is never stored, even once the
    function really returns; resume executes it again and stores that second result.
    """
    release = threading.Event()
    calls: list[threading.Thread] = []

    def flaky() -> int:
        calls.append(threading.current_thread())
        if len(calls) == 1:
            release.wait(TIMEOUT)
            return 1  # late: must never be stored
        return 42

    def wf(ctx: Context) -> int:
        value: int = ctx.step("flaky").timeout(0.1).run(flaky)
        return value

    engine.register("wf", wf)
    engine.start()

    try:
        inv = engine.invoke("wf")
        state = inv.wait(TIMEOUT)
        assert isinstance(state, Failed)
        assert "'flaky'" in state.message
        assert "timed out" in state.message
        assert len(calls) == 1

        [record] = engine.steps("wf", inv.instance_id)
        assert (record.key, record.state, record.result, record.attempts) == (
            "flaky", "failed", None, 1,
        )
    finally:
        release.set()

    # Let the abandoned function return its late result and its thread end.
    late_thread = calls[0]
    late_thread.join(TIMEOUT)
    assert not late_thread.is_alive()

    [record] = engine.steps("wf", inv.instance_id)
    assert (record.key, record.state, record.result, record.attempts) == (
        "flaky", "failed", None, 1,
    )
    assert engine.invocation("wf", inv.instance_id).state == state

    resumed = engine.resume("wf", inv.instance_id)
    assert resumed.wait(TIMEOUT) == Completed()
    assert resumed.result(TIMEOUT) == 42
    assert len(calls) == 2
    [record] = engine.steps("wf", inv.instance_id)
    assert (record.key, record.state, record.result, record.attempts) == (
        "flaky", "completed", 42, 2,
    )


def test_timeout_skipped_on_cache_hit(engine: Engine) -> None:
    """Ports seed test timeout_skipped_on_cache_hit.

    A step already stored returns its result at once on resume even with an impossibly
    short timeout: the function is not called and no step thread is started.
    """
    calls: list[str] = []
    timeout = [5.0]
    hung = threading.Event()  # never set: a cache miss on resume would hang and time out

    def counted() -> int:
        calls.append("s1")
        if len(calls) > 1:
            hung.wait(TIMEOUT)
        return 1

    def wf(ctx: Context) -> int:
        value: int = ctx.step("s1").timeout(timeout[0]).run(counted)
        return value

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Completed()
    assert calls == ["s1"]

    calls.clear()
    timeout[0] = 1e-9
    try:
        resumed = engine.resume("wf", inv.instance_id)
        assert resumed.wait(TIMEOUT) == Completed()
        assert resumed.result(TIMEOUT) == 1
        assert calls == []
        [record] = engine.steps("wf", inv.instance_id)
        assert (record.state, record.result, record.attempts) == ("completed", 1, 1)
    finally:
        hung.set()


def test_timeout_with_borrowing_closure(engine: Engine) -> None:
    """Ports seed test timeout_with_borrowing_closure.

    A step function with a timeout may be a closure over the workflow's locals: it reads
    them from its step thread and leaves them as they were.
    """
    seen: list[tuple[str, str]] = []

    def wf(ctx: Context) -> str:
        local_data = "borrowed"

        def borrow() -> str:
            seen.append((threading.current_thread().name, local_data))
            return local_data

        value: str = ctx.step("borrow").timeout(5).run(borrow)
        assert local_data == "borrowed"
        return value

    engine.register("wf", wf)
    engine.start()

    inv = engine.invoke("wf")
    assert inv.wait(TIMEOUT) == Completed()
    assert inv.result(TIMEOUT) == "borrowed"

    [(thread_name, data)] = seen
    assert thread_name.startswith("memable-step")
    assert data == "borrowed"
