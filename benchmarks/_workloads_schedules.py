"""W9, schedules: how late a real cron tick fires (memable only; no DBOS side).

``tick_lag`` declares the schedule ``w9`` (``* * * * *``) of a one-step
workflow, waits until ``LEAD`` seconds before the next minute boundary (so at
most about a minute goes by waiting) and starts the engine; its timer thread
fires the tick. The lag of a tick is its instance's ``created_at`` minus the
tick (both wall clock, UTC): the moment the engine built the instance it
stored, from the moment it was due. Also recorded: when the step body began,
after the instance was stored and its run started. With ``ticks`` > 1 it
measures that many consecutive ticks, a minute apart.

It checks that each tick has exactly one instance, ``w9@{tick}``, created by
the schedule, completed with the tick as its output, its step run once, and
that the schedule's stored last tick is the last one measured, none missed.
"""

from __future__ import annotations

import math
import queue
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from memable import Context, MetadataStatus
from memable._engine import access

from ._workloads import BenchFailure, _engine, check

#: Seconds before the first tick the engine starts.
LEAD = 2.0
#: The first tick is at least this many seconds after the engine's start is due.
MARGIN = 1.0
#: A tick whose step has not run this many seconds after its due time failed.
LATE = 30.0
#: The warm-up invocation's input: a tick no real one can be.
WARM_UP = datetime(2000, 1, 1, tzinfo=timezone.utc)


def _tick_id(tick: datetime) -> str:
    return tick.strftime("%Y-%m-%dT%H:%M:%SZ")


def tick_lag(tmp: Path, p: dict[str, Any]) -> dict[str, Any]:
    """W9: a ``* * * * *`` schedule's next real tick(s), due time to instance created."""
    ticks = p.get("ticks", 1)
    lock = threading.Lock()  # guards calls
    calls: dict[datetime, int] = {}
    ran: queue.Queue[tuple[datetime, float]] = queue.Queue()

    def record(tick: datetime) -> str:
        at = time.time()
        with lock:
            calls[tick] = calls.get(tick, 0) + 1
        if tick != WARM_UP:
            ran.put((tick, at))
        return _tick_id(tick)

    def wf(ctx: Context, tick: datetime) -> str:
        return str(ctx.step("ran").run(record, tick))

    engine = _engine(tmp, "w9", p)  # opened (schema and all) before the wait
    engine.register("tick", wf)
    engine.schedule("w9", "* * * * *", "tick")
    now = time.time()
    first = (math.floor(now / 60) + 1) * 60.0
    if first - now < LEAD + MARGIN:  # too close to start before it: the next one
        first += 60.0
    expected = [datetime.fromtimestamp(first + 60 * k, timezone.utc) for k in range(ticks)]
    time.sleep(max(0.0, first - LEAD - time.time()))
    lags_ms, ran_ms = [], []
    with engine:
        result = engine.invoke("tick", WARM_UP, instance_id="warm-up").result(timeout=60)
        check(result == _tick_id(WARM_UP), f"W9 warm-up result {result!r}")
        ready = time.time()
        check(ready < first, f"W9 the engine was ready {ready - first:.2f} s after the tick")
        for tick in expected:
            try:
                body_tick, body_at = ran.get(timeout=tick.timestamp() + LATE - time.time())
            except queue.Empty:
                late = f"W9 tick {_tick_id(tick)} did not run within {LATE:g} s"
                raise BenchFailure(late) from None
            check(body_tick == tick, f"W9 ran tick {body_tick}, expected {tick}")
            instance_id = f"w9@{_tick_id(tick)}"
            output = engine.invocation("tick", instance_id).result(timeout=60)
            check(output == _tick_id(tick), f"W9 {instance_id} returned {output!r}")
            meta = engine.get_metadata("tick", instance_id)
            check(meta is not None and meta.status == MetadataStatus.Completed(),
                  f"W9 {instance_id}: {meta}")
            assert meta is not None
            lags_ms.append((meta.created_at - tick).total_seconds() * 1e3)
            ran_ms.append((body_at - tick.timestamp()) * 1e3)
            row = access.store(engine).get_instance("tick", instance_id)
            check(row is not None and row.schedule == "w9",
                  f"W9 {instance_id} not created by the schedule")
        ids = sorted(instance_id for instance_id, _ in engine.list_instances("tick"))
        stored = {s.name: s for s in access.store(engine).schedules()}.get("w9")
    want = sorted(["warm-up", *(f"w9@{_tick_id(tick)}" for tick in expected)])
    check(ids == want, f"W9 instances {ids}, expected {want}")
    check(calls == {WARM_UP: 1, **dict.fromkeys(expected, 1)}, f"W9 step runs {calls}")
    check(stored is not None and stored.last_tick == _tick_id(expected[-1])
          and stored.missed == 0 and stored.skipped == 0, f"W9 stored schedule {stored}")
    check(all(lag >= 0 for lag in lags_ms), f"W9 an instance created before its tick: {lags_ms}")
    return {
        "per_op_us": max(lags_ms) * 1e3,
        "lag_ms": lags_ms,
        "ran_ms": ran_ms,
        "ticks": [_tick_id(tick) for tick in expected],
        "n": ticks,
    }


#: W9, by the name the worker runs it under.
SCHEDULE_WORKLOADS = {"tick_lag": tick_lag}
