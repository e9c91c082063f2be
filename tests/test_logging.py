"""What memable logs: messages that name their instance, failures with tracebacks, one
recovery line per recovered instance.

The records are the ``memable`` logger's, caught with ``caplog`` and read as
a plain ``%(levelname)s %(message)s`` format would show them.
"""

from __future__ import annotations

import logging
import re
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from helpers import build, killed_in_a_step

from memable import Context, Engine, Failed

WAIT = 30.0


def test_every_record_about_an_instance_names_it_in_its_message(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """A plain format shows ``workflow/instance`` (and ``[step]``) on each such line."""

    def wf(ctx: Context) -> str:
        ctx.timer("pause:v1", 0)
        return ctx.step("done:v1").run(lambda: "done")

    engine = Engine.open(tmp_path / "db")
    engine.register("wf", wf)
    with caplog.at_level(logging.INFO, logger="memable"), engine:
        engine.invoke("wf", instance_id="x").result(timeout=WAIT)
    about = [r for r in caplog.records if getattr(r, "instance", None) == "x"]
    assert {r.getMessage().split(": ", 1)[1] for r in about} >= {"running", "completed"}
    for record in about:
        step = getattr(record, "step", None)
        assert record.getMessage().startswith("wf/x" + (f" [{step}]" if step else "") + ": ")


def test_a_failure_is_logged_at_warning_with_its_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A step that raises is logged at WARNING as ``workflow/instance [step]: failed: ...``, and
    the formatted record carries the traceback with the exception."""
    def declined() -> None:
        raise RuntimeError("card declined")

    engine = Engine.in_memory()
    engine.register("charge", lambda ctx: ctx.step("charge:v1").run(declined))
    with caplog.at_level(logging.INFO, logger="memable"), engine:
        engine.invoke("charge", instance_id="order-8").wait(timeout=WAIT)
    [failed] = [r for r in caplog.records if "failed" in r.getMessage()]
    assert failed.levelno == logging.WARNING
    assert failed.getMessage().startswith("charge/order-8 [charge:v1]: failed: ")
    text = logging.Formatter("%(message)s").format(failed)
    assert "Traceback (most recent call last):" in text
    assert "RuntimeError: card declined" in text


def _ten(log: Path) -> Any:
    def body(i: int) -> int:
        with open(log, "a") as file:
            file.write(f"s{i}\n")
        return i

    def ten(ctx: Context) -> int:
        return sum(ctx.step(f"s{i}").run(body, i) for i in range(1, 11))

    return ten


def test_only_the_engine_that_takes_a_dead_owners_instance_logs_its_recovery(
    caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """Engine B sees the orphan at its polls but its one worker is busy; A takes it.

    B's look at the store is forced to happen after the owner died and
    before A starts; its run of the instance later finds it taken and says
    nothing. One recovery line in all, from A.
    """
    db, log = tmp_path / "store.db", tmp_path / "log"
    release, busy = threading.Event(), threading.Event()

    def block(ctx: Context) -> None:
        busy.set()
        assert release.wait(WAIT)

    b, b_store = build(db, poll_interval=0.02, max_workers=1)
    b.register("ten", _ten(log))
    b.register("block", block)
    looked_after_the_kill = threading.Event()
    killed = threading.Event()
    real_look = b_store.look_around

    def look(*args: Any, **kwargs: Any) -> Any:
        found = real_look(*args, **kwargs)
        if killed.is_set():
            looked_after_the_kill.set()
        return found

    b_store.look_around = look  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, logger="memable"):
        b.start()
        try:
            blocker = b.invoke("block")
            assert busy.wait(WAIT)
            with killed_in_a_step(db, log) as pid:
                pass
            killed.set()
            # A look that ended after the kill may have begun before it; the
            # one after it began after: B has seen the orphan.
            assert looked_after_the_kill.wait(WAIT)
            looked_after_the_kill.clear()
            assert looked_after_the_kill.wait(WAIT)
            a = Engine.open(db, poll_interval=0.02)
            a.register("ten", _ten(log))
            with a:
                assert a.invocation("ten", "crash").result(timeout=WAIT) == 55
            release.set()
            blocker.wait(timeout=WAIT)
        finally:
            release.set()
            b.close()
    recoveries = [
        r.getMessage() for r in caplog.records
        if getattr(r, "instance", None) == "crash" and "recover" in r.getMessage()
    ]
    assert len(recoveries) == 1, recoveries
    assert re.fullmatch(
        r"ten/crash( \[s3\])?: recovered the instance from engine "
        + re.escape(f"{socket.gethostname()}:{pid}")  # the dead one, by host and pid
        + r", which died(; step 's3' was in flight and runs again)?", recoveries[0],
    ), recoveries


def test_only_a_recovered_instance_logs_that_its_owner_died(
    make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture
) -> None:
    """A Failed instance resumed by its own live engine logs no "owner died" line: that line
    is for an instance recovered from a dead engine alone."""
    engine = make_engine()
    fail = [True]
    engine.register("wf", lambda ctx: ctx.step("a").run(lambda: 1 / 0 if fail[0] else 1))
    with caplog.at_level(logging.INFO, logger="memable"), engine:
        assert isinstance(engine.invoke("wf", instance_id="x").wait(timeout=10), Failed)
        fail[0] = False
        assert engine.resume("wf", "x").result(timeout=10) == 1
    assert not [r for r in caplog.records if "owner died" in r.getMessage()]
