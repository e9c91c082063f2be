"""Real processes on one file: SIGKILL mid-workflow, several engines at once, signals across."""

from __future__ import annotations

import json
import random
import signal
import sqlite3
import subprocess
import sys
import time
from collections import Counter
from contextlib import closing
from pathlib import Path

import pytest

CHILD = str(Path(__file__).with_name("_procs.py"))


def child(*args: str | Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, CHILD, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    """Wait for a child; fail with its stderr unless it exited 0; return its stdout."""
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, f"child exited {proc.returncode}:\n{err}"
    assert "locked" not in err, err
    assert "busy" not in err, err
    return out


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def integrity(db: Path) -> str:
    with closing(sqlite3.connect(db)) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


@pytest.mark.parametrize("k", range(1, 11))
def test_sigkill_inside_a_step_loses_no_completed_step(tmp_path: Path, k: int) -> None:
    """Killed in step k (each of the ten), a 10-step run resumes in a new process: 1..k-1
    not rerun, k rerun."""
    rng = random.Random(k)
    db, log = tmp_path / "crash.db", tmp_path / "effects.log"
    proc = child("crash", db, log, k)
    assert proc.stdout is not None
    assert proc.stdout.readline() == f"in step {k}\n"
    time.sleep(rng.uniform(0, 0.02))  # a random kill moment inside the step, on purpose
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGKILL

    assert json.loads(finish(child("recover", db, log))) == sum(range(1, 11))
    runs = Counter(lines(log))
    assert runs == Counter({f"s{i}": 2 if i == k else 1 for i in range(1, 11)})
    assert integrity(db) == "ok"


@pytest.mark.parametrize("processes", [2, 4])
def test_several_processes_on_one_file_run_everything_exactly_once(
    tmp_path: Path, processes: int
) -> None:
    """2 and 4 processes invoke 100 instances each: every step once, every timer once."""
    db, log = tmp_path / "shared.db", tmp_path / "effects.log"
    procs = [child("many", db, log, 100) for _ in range(processes)]
    outputs = [finish(proc, timeout=300) for proc in procs]
    assert [json.loads(out) for out in outputs] == [["abc"]] * processes

    executions = Counter(lines(log))
    assert len(executions) == processes * 100 * 3
    assert set(executions.values()) == {1}
    with closing(sqlite3.connect(db)) as conn:
        statuses = conn.execute("SELECT status, COUNT(*) FROM memable_instances GROUP BY status")
        assert statuses.fetchall() == [("completed", processes * 100)]
        timers = conn.execute(
            "SELECT state, attempts, COUNT(*) FROM memable_steps WHERE kind = 'timer' "
            "GROUP BY 1, 2"
        )
        assert timers.fetchall() == [("completed", 1, processes * 100)]
        assert conn.execute("SELECT COUNT(*) FROM memable_timers").fetchone() == (0,)
        assert conn.execute("SELECT COUNT(*) FROM memable_owners").fetchone() == (0,)
    assert integrity(db) == "ok"


@pytest.mark.parametrize("signaller_runs_it", [False, True], ids=["store-only", "can-run"])
def test_a_signal_from_another_process_is_delivered_once(
    tmp_path: Path, signaller_runs_it: bool
) -> None:
    """A signal sent from a second process reaches the instance suspended in the first, once."""
    db, log = tmp_path / "signal.db", tmp_path / "effects.log"
    waiter = child("wait", db, log)
    assert waiter.stdout is not None
    assert waiter.stdout.readline() == "suspended suspended: go:v1\n"
    finish(child("signal", db, "parked", *([log] if signaller_runs_it else [])))
    assert json.loads(finish(waiter)) == "hello"
    assert lines(log) == ["after hello"]


def test_processes_creating_one_new_file_at_once_all_open_it(tmp_path: Path) -> None:
    """6 processes open each of 30 new files at the same moment: every open succeeds.

    The first creates the schema; the others wait for it, or see it whole.
    """
    openers = [
        subprocess.Popen(
            [sys.executable, CHILD, "open", "-"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(6)
    ]
    try:
        for n in range(30):
            path = tmp_path / f"new-{n}.db"
            for opener in openers:  # the processes are started: the opens overlap
                assert opener.stdin is not None
                opener.stdin.write(f"{path}\n")
                opener.stdin.flush()
            answers = [opener.stdout.readline().strip() for opener in openers if opener.stdout]
            assert answers == ["ok"] * len(openers), f"file {n}: {answers}"
    finally:
        for opener in openers:
            stdin, stdout, stderr = opener.stdin, opener.stdout, opener.stderr
            assert stdin is not None
            assert stdout is not None
            assert stderr is not None
            stdin.close()
            assert opener.wait(timeout=60) == 0, stderr.read()
            stdout.close()
            stderr.close()
