"""Many instances at once on the worker pool: every step runs exactly once."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

import pytest

from memable import Completed, Context, Engine, MetadataStatus

STEPS = 5
INSTANCES = 200


# A few rounds, not dozens: each already runs 1000 steps on 8 threads. The races
# between claims, owners and runs are forced one at a time elsewhere
# (tests/test_lost_runs.py, tests/test_ownership.py, tests/test_resume_claim.py).
@pytest.mark.parametrize("round_", range(5))
def test_200_concurrent_invocations_run_1000_steps_exactly_once(
    make_engine: Callable[..., Engine], round_: int
) -> None:
    """200 invocations of a 5-step workflow on 8 workers complete with 1000 step executions."""
    lock = threading.Lock()  # guards executions: step functions run on 8 worker threads
    executions: Counter[tuple[int, int]] = Counter()

    def work(n: int, i: int) -> int:
        with lock:
            executions[(n, i)] += 1
        return n * 10 + i

    def five_steps(ctx: Context, n: int) -> int:
        return sum(ctx.step(f"s{i}").run(work, n, i) for i in range(STEPS))

    engine = make_engine(max_workers=8)
    engine.register("five", five_steps)
    engine.start()
    invocations = [engine.invoke("five", n) for n in range(INSTANCES)]
    results = [inv.result(timeout=60) for inv in invocations]
    states = [inv.wait(timeout=60) for inv in invocations]
    engine.wait_all()

    assert results == [n * 10 * STEPS + sum(range(STEPS)) for n in range(INSTANCES)]
    assert states == [Completed()] * INSTANCES
    assert sum(executions.values()) == INSTANCES * STEPS
    assert set(executions.values()) == {1}
    stored = engine.list_instances("five")
    assert len(stored) == INSTANCES
    assert {meta.status for _, meta in stored} == {MetadataStatus.Completed()}
