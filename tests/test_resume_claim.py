"""``resume()`` returns having committed its claim (SPEC: every call that returns to its
caller has committed its change): the claim is made on the caller's thread, not later on a
worker, so no crash after the call returns leaves the instance as it was; on every store."""

from __future__ import annotations

import threading
from collections.abc import Callable

from memable import Context, Engine, Failed, MetadataStatus

TIMEOUT = 10.0


def test_resume_returns_with_the_instance_claimed_while_no_worker_is_free(
    make_engine: Callable[..., Engine],
) -> None:
    """The one worker is busy: the resumed run cannot start, yet when resume() returns the
    store already holds the instance as running (the claim committed)."""
    engine = make_engine(max_workers=1)
    busy, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def flaky(ctx: Context) -> str:
        def charge() -> str:
            calls.append(1)
            if len(calls) == 1:
                raise ConnectionError("down")
            return "charged"

        return ctx.step("charge:v1").run(charge)

    engine.register("flaky", flaky)
    engine.register("block", lambda ctx: ctx.step("b").run(
        lambda: (busy.set(), release.wait(TIMEOUT))[1]))
    try:
        with engine:
            assert isinstance(engine.invoke("flaky", instance_id="f").wait(TIMEOUT), Failed)
            blocker = engine.invoke("block", instance_id="b")
            assert busy.wait(TIMEOUT)
            inv = engine.resume("flaky", "f")
            meta = engine.get_metadata("flaky", "f")
            assert meta is not None
            assert meta.status == MetadataStatus.Running()
            assert calls == [1]  # its run has not started: the worker is still busy
            release.set()
            assert blocker.result(TIMEOUT) is True
            assert inv.result(TIMEOUT) == "charged"
    finally:
        release.set()
