"""``resume`` of a Failed instance of a queued workflow while its queue is full (issue 21,
point 6): the instance is stored Queued() when ``resume()`` returns, waits for the slot,
and runs once it frees; on every store.

The queue's one slot is held by a run blocked in its step. With ``max_workers=1`` that
run also holds the engine's only worker, so a claim left to a worker thread would not
be made until the slot frees: ``resume()`` must have made it before it returns.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from memable import Context, Engine, Failed, MetadataStatus, Queued

TIMEOUT = 10.0


@pytest.mark.parametrize("workers", [1, 8])
def test_resume_of_a_failed_instance_waits_queued_for_the_full_queue(
    make_engine: Callable[..., Engine], workers: int,
) -> None:
    """A resume of a failed instance of a queue whose only slot another run holds (held on
    an event) stores it queued and runs nothing until the slot frees; then the failed step
    runs again and completes, with one worker or eight."""
    engine = make_engine(max_workers=workers, poll_interval=60)
    engine.queue("q", concurrency=1)
    inside, release = threading.Event(), threading.Event()
    charges: list[str] = []

    def charge(n: int) -> int:
        charges.append("charge")
        if len(charges) == 1:
            raise ConnectionError("down")
        return n

    def hold() -> int:
        inside.set()
        assert release.wait(TIMEOUT * 3)
        return 0

    def job(ctx: Context, n: int) -> int:
        step = ctx.step("hold").run(hold) if n == 0 else ctx.step("charge").run(charge, n)
        return int(step)

    engine.register("job", job, queue="q")
    with engine:
        try:
            failed = engine.invoke("job", 7, instance_id="x").wait(TIMEOUT)
            assert isinstance(failed, Failed)
            holder = engine.invoke("job", 0, instance_id="holder")
            assert inside.wait(TIMEOUT)
            inv = engine.resume("job", "x")
            meta = engine.get_metadata("job", "x")  # read as resume() returns, no wait
            assert meta is not None
            assert meta.status == MetadataStatus.Queued()
            assert inv.state == Queued()  # no run here holds it: its handle says so too
            assert charges == ["charge"]  # not run again while the slot is taken
            release.set()
            assert holder.result(TIMEOUT) == 0
            assert inv.result(TIMEOUT) == 7
            assert charges == ["charge", "charge"]
        finally:
            release.set()  # a failed check lets the holder end, and the engine stop
