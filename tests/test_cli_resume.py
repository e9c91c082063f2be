"""``memable resume DB WORKFLOW ID``: resume one instance from the command line, as
``engine.resume`` does, on a file and on PostgreSQL."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from typing import Any

from click.testing import Result
from helpers import cli

from memable import Context, Engine, Failed, MetadataStatus

TIMEOUT = 10.0


def resume(store: dict[str, Any], workflow: str, instance_id: str) -> Result:
    schema = ["--schema", store["schema"]] if "schema" in store else []
    return cli("resume", str(store["target"]), workflow, instance_id, *schema)


def _flaky(calls: Counter[str]) -> Callable[[Context], str]:
    def charge() -> str:
        calls["charge"] += 1
        if calls["charge"] == 1:
            raise ConnectionError("gateway down")
        return "charged"

    def fetch() -> str:
        calls["fetch"] += 1
        return "order"

    def wf(ctx: Context) -> str:
        return ctx.step("fetch:v1").run(fetch) + " " + ctx.step("charge:v1").run(charge)

    return wf


def test_resume_of_a_failed_instance_runs_it_again_in_the_running_engine(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """The engine on the store takes the resume at its next look (on PostgreSQL at once, by
    NOTIFY: its poll is 30 s); completed steps are not run again."""
    calls: Counter[str] = Counter()
    poll = 30 if "schema" in shared_store else 0.05
    engine = open_shared(poll_interval=poll, lease=300)  # no look for 30 s on PostgreSQL
    engine.register("pay", _flaky(calls))
    with engine:
        assert isinstance(engine.invoke("pay", instance_id="p").wait(TIMEOUT), Failed)
        result = resume(shared_store, "pay", "p")
        assert result.exit_code == 0, result.output
        assert result.stdout.startswith("resume of pay/p (failed) stored")
        assert engine.invocation("pay", "p").result(TIMEOUT) == "order charged"
    assert calls == Counter({"fetch": 1, "charge": 2})


def test_a_resume_stored_while_no_engine_runs_is_run_by_the_next_one(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """``memable resume`` with no engine running stores the failed instance as suspended
    ("resumed from the command line"); the next engine opened runs it from the failed step, the
    completed one not run again."""
    calls: Counter[str] = Counter()
    first = open_shared()
    first.register("pay", _flaky(calls))
    with first:
        assert isinstance(first.invoke("pay", instance_id="p").wait(TIMEOUT), Failed)
    assert resume(shared_store, "pay", "p").exit_code == 0
    meta = open_shared().get_metadata("pay", "p")
    assert meta is not None
    assert meta.status == MetadataStatus.Suspended("resumed from the command line")
    second = open_shared()
    second.register("pay", _flaky(calls))
    with second:
        assert second.invocation("pay", "p").result(TIMEOUT) == "order charged"
    assert calls == Counter({"fetch": 1, "charge": 2})


def test_resume_of_a_running_instance_changes_nothing(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """``memable resume`` of an instance whose step is running in an engine exits 0 saying there
    is nothing to resume, and the run goes on to its end."""
    inside, release = threading.Event(), threading.Event()
    engine = open_shared()
    engine.register("hold", lambda ctx: ctx.step("s").run(
        lambda: (inside.set(), release.wait(TIMEOUT))[1]))
    try:
        with engine:
            inv = engine.invoke("hold", instance_id="h")
            assert inside.wait(TIMEOUT)
            result = resume(shared_store, "hold", "h")
            assert (result.exit_code, result.stdout) == (
                0, "hold/h is running: nothing to resume\n")
            release.set()
            assert inv.result(TIMEOUT) is True
    finally:
        release.set()


def test_resume_of_a_cancelled_or_unknown_instance_exits_2_and_writes_nothing(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """``memable resume`` of a cancelled instance exits 2 saying it is cancelled and leaves its
    metadata as it was; of an unknown one, exits 2 with "no stored instance"."""
    engine = open_shared()
    engine.register("wait", lambda ctx: ctx.suspend("ok"))
    with engine:
        engine.invoke("wait", instance_id="w").wait(TIMEOUT)
        engine.cancel("wait", "w")
        before = engine.get_metadata("wait", "w")
        refused = resume(shared_store, "wait", "w")
        assert refused.exit_code == 2
        assert "it is cancelled" in refused.stderr
        assert engine.get_metadata("wait", "w") == before
        unknown = resume(shared_store, "wait", "nobody")
        assert unknown.exit_code == 2
        assert "no stored instance" in unknown.stderr
