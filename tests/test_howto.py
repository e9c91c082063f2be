"""The how-to guides work as written: the cron script, and the sqlite-utils commands."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "cron" / "nightly_report.py"
INSPECT = ROOT / "docs" / "howto" / "inspect.md"
BIN = Path(sys.executable).parent
KEYS = ["orders:v1", "totals:v1", "publish:v1", "notify:v1"]
DAY = "2026-01-01"


# ---------------------------------------------------------------------- the cron script


def nightly(
    tmp_path: Path, *args: str, out: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the cron script to its end on the store in tmp_path."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--db", str(tmp_path / "workflows.db"),
         "--out", str(out or tmp_path / "reports"), *args],
        capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path, check=False,
    )


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "NIGHTLY_REPORT_HOLD"}
    env.update(extra)
    return env


def executed(output: str) -> list[str]:
    """The step keys whose functions ran, in order, from the script's output."""
    return re.findall(r"^executing (\S+)$", output, re.M)


def stored(tmp_path: Path, table: str) -> list[dict[str, Any]]:
    """Every row of the store's table ``memable_{table}``, read on a connection of our own."""
    conn = sqlite3.connect(tmp_path / "workflows.db")
    try:
        conn.row_factory = sqlite3.Row
        rows = conn.execute(f"SELECT * FROM memable_{table} ORDER BY 1, 2, 3")
        return [dict(row) for row in rows]
    finally:
        conn.close()


def test_cron_first_run_completes_and_a_second_run_the_same_day_runs_nothing(
    tmp_path: Path,
) -> None:
    """The cron guide's script runs every step once and writes the day's report; run again the
    same day it finds the instance completed, executes nothing and changes no row, not even a
    timestamp."""
    first = nightly(tmp_path, "--day", DAY)
    assert first.returncode == 0, first.stderr
    assert executed(first.stdout) == KEYS
    report = tmp_path / "reports" / f"report-{DAY}.json"
    assert first.stdout.splitlines()[-1] == f"{DAY}: done, {report}"
    assert json.loads(report.read_text())["day"] == DAY
    instances, steps = stored(tmp_path, "instances"), stored(tmp_path, "steps")
    assert [(i["instance_id"], i["status"]) for i in instances] == [(DAY, "completed")]
    assert {(s["key"], s["state"], s["attempts"]) for s in steps} == {
        (key, "completed", 1) for key in KEYS
    }

    second = nightly(tmp_path, "--day", DAY)
    assert second.returncode == 0, second.stderr
    assert executed(second.stdout) == []
    assert f"{DAY}: found completed" in second.stdout
    assert second.stdout.splitlines()[-1] == f"{DAY}: done, {report}"
    # Not a row changed, not even a timestamp.
    assert stored(tmp_path, "instances") == instances
    assert stored(tmp_path, "steps") == steps


def test_cron_each_day_is_its_own_instance(tmp_path: Path) -> None:
    """Each ``--day`` is an instance of its own: two days run every step twice and write two
    reports."""
    for day in (DAY, "2026-01-02"):
        run = nightly(tmp_path, "--day", day)
        assert run.returncode == 0, run.stderr
        assert executed(run.stdout) == KEYS
    assert [i["instance_id"] for i in stored(tmp_path, "instances")] == [DAY, "2026-01-02"]
    assert sorted(p.name for p in (tmp_path / "reports").iterdir()) == [
        "report-2026-01-01.json", "report-2026-01-02.json",
    ]


@pytest.mark.parametrize("hold", KEYS)
def test_cron_run_killed_in_a_step_resumes_without_rerunning_completed_steps(
    tmp_path: Path, hold: str
) -> None:
    """The script SIGKILLed while it holds in each step in turn leaves the instance running with
    only the earlier steps stored; the next run recovers it, executes from the killed step on,
    leaves the earlier steps' rows untouched, and a third run executes nothing."""
    proc, seen = start_holding(tmp_path, hold)
    proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    done = KEYS[: KEYS.index(hold)]
    assert executed(seen) == [*done, hold]
    [instance] = stored(tmp_path, "instances")
    assert (instance["status"], instance["owner"] is not None) == ("running", True)
    before = {s["key"]: s for s in stored(tmp_path, "steps")}
    assert sorted(before) == sorted(done)  # the step in flight stored nothing

    rerun = nightly(tmp_path, "--day", DAY)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{DAY}: found running" in rerun.stdout
    assert executed(rerun.stdout) == KEYS[KEYS.index(hold):]
    after = {s["key"]: s for s in stored(tmp_path, "steps")}
    assert {k: (s["state"], s["attempts"]) for k, s in after.items()} == dict.fromkeys(
        KEYS, ("completed", 1)
    )
    assert all(after[key] == before[key] for key in done)  # untouched
    [instance] = stored(tmp_path, "instances")
    assert (instance["status"], instance["owner"]) == ("completed", None)
    assert json.loads((tmp_path / "reports" / f"report-{DAY}.json").read_text())["day"] == DAY

    again = nightly(tmp_path, "--day", DAY)
    assert (again.returncode, executed(again.stdout)) == (0, [])


def test_cron_overlapping_run_starts_nothing_and_takes_over_when_the_first_dies(
    tmp_path: Path,
) -> None:
    """A second run started while the first holds in a step finds the instance running and
    executes nothing; once the first is SIGKILLed, the waiting run recovers the instance and
    finishes it from the step in flight, each step run once."""
    first, _ = start_holding(tmp_path, "totals:v1")
    second = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--db", str(tmp_path / "workflows.db"),
         "--out", str(tmp_path / "reports"), "--day", DAY],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(), cwd=tmp_path,
    )
    try:
        assert second.stdout is not None
        # The first run is alive: the second one finds the instance running and waits.
        assert second.stdout.readline() == f"{DAY}: found running\n"
        assert [s["key"] for s in stored(tmp_path, "steps")] == ["orders:v1"]
        # Stopped, it writes nothing more: whether a heartbeat of its named the step in
        # flight is known before it dies. If one did, the recovery counts that attempt,
        # lost with its process (the second run finding it running can take longer than
        # a heartbeat on a loaded machine).
        first.send_signal(signal.SIGSTOP)
        [instance] = stored(tmp_path, "instances")
        lost = 1 if instance["step_key"] == "totals:v1" else 0
    finally:
        first.send_signal(signal.SIGKILL)
        first.communicate(timeout=60)
    # Its owner dead, the instance is recovered by the waiting run at its next poll.
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert executed(out) == ["totals:v1", "publish:v1", "notify:v1"]
    assert {(s["key"], s["attempts"]) for s in stored(tmp_path, "steps")} == {
        (key, 1 + (lost if key == "totals:v1" else 0)) for key in KEYS
    }


def start_holding(tmp_path: Path, hold: str) -> tuple[subprocess.Popen[str], str]:
    """Start the script for DAY; return it, and what it printed, once it blocks in ``hold``."""
    proc = subprocess.Popen(
        [sys.executable, str(SCRIPT), "--db", str(tmp_path / "workflows.db"),
         "--out", str(tmp_path / "reports"), "--day", DAY],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=_env(NIGHTLY_REPORT_HOLD=hold), cwd=tmp_path,
    )
    assert proc.stdout is not None
    seen = ""
    for line in proc.stdout:
        seen += line
        if line == f"holding in {hold}\n":
            return proc, seen
    proc.kill()
    out, err = proc.communicate(timeout=60)
    raise AssertionError(f"the script ended without holding in {hold}: {out}{err}")


def test_cron_run_after_a_failed_one_resumes_it(tmp_path: Path) -> None:
    """A run whose publish step fails (a file stands where the report directory should be) exits
    1 and leaves the instance failed; the next run resumes it from that step, the earlier steps
    not run again."""
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the report directory should be\n")
    failed = nightly(tmp_path, "--day", DAY, out=blocker)
    assert failed.returncode == 1
    assert executed(failed.stdout) == ["orders:v1", "totals:v1", "publish:v1"]
    assert "publish:v1" in failed.stdout.splitlines()[-1]
    [instance] = stored(tmp_path, "instances")
    assert instance["status"] == "failed"

    fixed = nightly(tmp_path, "--day", DAY)
    assert fixed.returncode == 0, fixed.stderr
    assert f"{DAY}: found failed" in fixed.stdout
    assert executed(fixed.stdout) == ["publish:v1", "notify:v1"]
    steps = {s["key"]: (s["state"], s["attempts"]) for s in stored(tmp_path, "steps")}
    assert steps == {
        "orders:v1": ("completed", 1), "totals:v1": ("completed", 1),
        "publish:v1": ("completed", 2), "notify:v1": ("completed", 1),
    }


# ---------------------------------------------------------------------- inspect.md


def console_commands(path: Path) -> list[str]:
    """Every `$ ` line of the ```console blocks of a page, without the prompt."""
    blocks = re.findall(r"^```console\n(.*?)^```", path.read_text(), re.M | re.S)
    return [line[2:] for block in blocks for line in block.splitlines() if line.startswith("$ ")]


COMMANDS = console_commands(INSPECT)


def argv_of(command: str) -> list[str]:
    """A page's command line, with the programs taken from this test's virtualenv."""
    argv = shlex.split(command)
    if argv[0] == "python":
        argv[0] = sys.executable
    elif argv[0] in ("sqlite-utils", "memable"):
        argv[0] = str(BIN / argv[0])
    else:
        raise AssertionError(f"inspect.md runs an unexpected program: {command}")
    return argv


def test_inspect_page_has_commands_that_only_read() -> None:
    """The inspect guide's console commands are python (to make the demo store) and read-only
    sqlite-utils verbs; none writes to the store."""
    assert len(COMMANDS) >= 8
    programs = {shlex.split(c)[0] for c in COMMANDS}
    assert programs <= {"python", "sqlite-utils"}
    # Everything but creating the demo store goes through sqlite-utils, reading.
    writes = re.compile(r"\b(insert|update|delete|drop|create|alter|replace)\b", re.I)
    assert [c for c in COMMANDS if c.startswith("sqlite-utils") and writes.search(c)] == []
    verbs = {shlex.split(c)[1] for c in COMMANDS if c.startswith("sqlite-utils")}
    assert verbs <= {"tables", "rows", "query", "schema"}


def test_every_command_of_the_inspect_page_runs_on_a_demo_store(tmp_path: Path) -> None:
    """Every console command of the inspect guide runs cleanly on the store ``memable demo``
    makes and prints something."""
    demo = subprocess.run(
        [sys.executable, "-m", "memable", "demo", "--db", str(tmp_path / "memable-demo.db")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    for command in COMMANDS:
        run = subprocess.run(
            argv_of(command), capture_output=True, text=True, timeout=120, cwd=tmp_path,
            check=False,
        )
        assert run.returncode == 0, f"{command}\n{run.stdout}{run.stderr}"
        assert run.stdout.strip(), f"{command} printed nothing"
