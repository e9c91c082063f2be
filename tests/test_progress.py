"""Progress out: ``WorkflowMetadata.status_message`` holds the text last given to
``ctx.set_status``, stored when set, on every run (a resumed one included); on every store."""

from __future__ import annotations

import threading
from collections.abc import Callable

from memable import Context, Engine, MetadataStatus

TIMEOUT = 10.0


def _status(engine: Engine, name: str, instance_id: str) -> str | None:
    meta = engine.get_metadata(name, instance_id)
    assert meta is not None
    return meta.status_message


def test_the_status_message_is_in_the_metadata_while_the_instance_runs(
    make_engine: Callable[..., Engine],
) -> None:
    """Set before a step that blocks: get_metadata shows it while that step runs."""
    engine = make_engine()
    inside, release = threading.Event(), threading.Event()

    def wf(ctx: Context) -> None:
        ctx.set_status("charging the card")
        ctx.step("charge:v1").run(lambda: (inside.set(), release.wait(TIMEOUT)))

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf", instance_id="w")
        assert inside.wait(TIMEOUT)
        meta = engine.get_metadata("wf", "w")
        assert meta is not None
        assert (meta.status, meta.status_message) == (
            MetadataStatus.Running(), "charging the card")
        release.set()
        inv.result(TIMEOUT)
        assert _status(engine, "wf", "w") == "charging the card"


def test_a_resumed_run_stores_the_status_it_replays_to(
    make_engine: Callable[..., Engine],
) -> None:
    """The status set in replay is stored when replay ends (not only published): after a
    resume the instance's status message is the resumed run's, not the first run's."""
    engine = make_engine()
    runs: list[int] = []
    inside, release = threading.Event(), threading.Event()

    def work() -> None:
        if len(runs) == 1:
            raise ConnectionError("down")
        inside.set()
        release.wait(TIMEOUT)

    def wf(ctx: Context) -> None:
        runs.append(1)
        ctx.step("fetch:v1").run(lambda: 1)
        ctx.set_status(f"pass {len(runs)}")  # silent while it replays
        ctx.step("work:v1").run(work)

    engine.register("wf", wf)
    with engine:
        inv = engine.invoke("wf", instance_id="w")
        assert isinstance(inv.wait(TIMEOUT).message, str)
        assert _status(engine, "wf", "w") == "pass 1"
        again = engine.resume("wf", "w")
        assert inside.wait(TIMEOUT)
        # Stored when replay ended: visible while the step after it still runs.
        assert _status(engine, "wf", "w") == "pass 2"
        release.set()
        again.result(TIMEOUT)
        assert _status(engine, "wf", "w") == "pass 2"
