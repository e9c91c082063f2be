"""Schedules across real processes: exactly one run per tick while several engines declare
the schedule and one is SIGKILLed; ticks missed while the only engine is SIGSTOPped.

Each child (tests/_schedule_procs.py) runs its engine on a wall clock that goes
faster than real time from a shared instant T0, so a tick a minute comes every
second or few (no test waits for real minutes).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from conftest import POSTGRES_URL
from helpers import build

from memable import MetadataStatus

CHILD = str(Path(__file__).with_name("_schedule_procs.py"))
TIMEOUT = 60


class Child:
    """One engine process; ``stop()`` tells it to drain and end."""

    def __init__(self, target: str, schema: str, log: Path, t0: float, speed: float,
                 catch_up: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, CHILD, target, schema, str(log), repr(t0), repr(speed), catch_up],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline() == "started\n"

    def stop(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("stop\n")
        self.proc.stdin.flush()
        out, _ = self.proc.communicate(timeout=TIMEOUT)
        assert (self.proc.returncode, out) == (0, "stopped\n")

    def end(self) -> None:
        """However the test ended: no process left, no pipe open."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(TIMEOUT)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()


def fast_clock(t0: float, speed: float) -> datetime:
    """The children's wall clock now."""
    return datetime.fromtimestamp(t0 + (time.time() - t0) * speed, timezone.utc)


def tick_id(tick: datetime) -> str:
    return f"every@{tick:%Y-%m-%dT%H:%M:%SZ}"


def minutes(after: datetime, until: datetime) -> list[datetime]:
    """The minute ticks in (after, until]."""
    first = after.replace(second=0, microsecond=0) + timedelta(minutes=1)
    return [first + timedelta(minutes=m)
            for m in range(int((until - first).total_seconds() // 60) + 1)]


def lines(log: Path) -> list[tuple[str, str]]:
    """(instance, pid) of each execution of the step, as logged."""
    if not log.exists():
        return []
    return [tuple(line.split()) for line in log.read_text().splitlines()]  # type: ignore[misc]


def until_logged(log: Path, count: int, seconds: float = TIMEOUT) -> None:
    """Wait until the log holds ``count`` lines (it grows with the children's ticks)."""
    deadline = time.monotonic() + seconds
    pause = threading.Event()
    while len(lines(log)) < count:
        assert time.monotonic() < deadline, f"fewer than {count} ticks ran in {seconds} s"
        pause.wait(0.05)


@pytest.fixture
def children() -> Iterator[list[Child]]:
    made: list[Child] = []
    yield made
    for child in made:
        child.end()


def _store(kind: str, tmp_path: Path, pg_schema: Any) -> tuple[str, str, dict[str, Any]]:
    if kind == "file":
        path = str(tmp_path / "store.db")
        return path, "-", {"target": path}
    schema = pg_schema()
    return POSTGRES_URL, schema, {"target": POSTGRES_URL, "schema": schema}


@pytest.fixture
def pg_schema_maker(request: pytest.FixtureRequest) -> Any:
    return lambda: request.getfixturevalue("pg_schema")


@pytest.mark.heavy
@pytest.mark.parametrize("kind", ["file", "postgres"])
def test_three_engines_run_each_tick_once_though_one_is_killed(
    kind: str, tmp_path: Path, children: list[Child], pg_schema_maker: Any,
) -> None:
    """Three processes declare one schedule (a tick every real second); once some ticks
    ran, one is SIGKILLed. Every minute from the first declaration to the last tick fired
    has exactly one instance, completed; its step ran once (at most one ran twice: the
    step the killed engine had in flight)."""
    target, schema, opened = _store(kind, tmp_path, pg_schema_maker)
    log = tmp_path / "runs.log"
    t0 = time.time()
    for _ in range(3):
        children.append(Child(target, schema, log, t0, 60.0, "all"))
    until_logged(log, 5)
    children[0].proc.send_signal(signal.SIGKILL)
    children[0].proc.wait(TIMEOUT)
    until_logged(log, 12)
    for child in children[1:]:
        child.stop()
    reader, store = build(**opened)
    try:
        [row] = store.schedules()
        assert row.missed == 0
        assert row.last_tick is not None
        last = datetime.strptime(row.last_tick, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=timezone.utc)
        expected = [tick_id(t) for t in minutes(datetime.fromisoformat(row.since), last)]
        stored = sorted(i for i, _ in reader.list_instances("job"))
        assert stored == expected
        assert {reader.get_metadata("job", i).status for i in stored} == {  # type: ignore[union-attr]
            MetadataStatus.Completed()
        }
    finally:
        reader.close()
    runs = Counter(instance for instance, _ in lines(log))
    assert set(runs) == set(expected)
    assert sum(n - 1 for n in runs.values()) <= 1
    # The killed engine took part, and so did the others.
    assert len({pid for _, pid in lines(log)}) >= 2


@pytest.mark.parametrize("catch_up", ["latest", "all", "none"])
def test_ticks_missed_while_the_engine_is_stopped_follow_catch_up(
    catch_up: str, tmp_path: Path, children: list[Child],
) -> None:
    """The only engine is SIGSTOPped just after a tick, for more than three ticks, and
    SIGCONTed well past a tick's grace (a tick every 6 real seconds): the ticks that fell
    due meanwhile are missed, and catch_up says which of them run; the ticks before and
    after run on time."""
    speed = 10.0
    target = str(tmp_path / "store.db")
    log = tmp_path / "runs.log"
    t0 = time.time()
    child = Child(target, "-", log, t0, speed, catch_up)
    children.append(child)
    until_logged(log, 2)
    _at_second(t0, speed, 5, 15)  # just after the tick that ran last
    child.proc.send_signal(signal.SIGSTOP)
    stopped = fast_clock(t0, speed)
    _at_second(t0, speed, 45, 55, after=stopped + timedelta(minutes=3))  # past the grace
    child.proc.send_signal(signal.SIGCONT)
    resumed = fast_clock(t0, speed)
    missed = minutes(stopped, resumed)
    assert len(missed) >= 3
    ran_before = len(lines(log))
    until_logged(log, ran_before + {"latest": 1, "all": len(missed), "none": 0}[catch_up] + 1)
    child.stop()
    ran = {instance for instance, _ in lines(log)}
    missed_ids = [tick_id(t) for t in missed]
    expect_run = {"latest": missed_ids[-1:], "all": missed_ids, "none": []}[catch_up]
    assert sorted(ran & set(missed_ids)) == expect_run
    reader, store = build(target)
    try:
        [row] = store.schedules()
        assert row.missed == len(missed) - len(expect_run)
    finally:
        reader.close()
    # On time before the stop, and again after it: the first tick after the resume ran.
    after = minutes(resumed, resumed + timedelta(minutes=1))[0]
    assert tick_id(after) in ran


def _at_second(
    t0: float, speed: float, first: int, last: int, after: datetime | None = None
) -> None:
    """Wait until the children's clock is between ``first`` and ``last`` seconds past a
    minute (and past ``after``): no sleep would do, the wait is for time to pass."""
    pause = threading.Event()
    while True:
        now = fast_clock(t0, speed)
        if first <= now.second < last and (after is None or now >= after):
            return
        pause.wait(0.02)
