"""Faults the other suites miss: stalled and zombie owners, deadlines, late signals, namespaces.

Only the public API, the CLI, real processes and read-only looks at the SQLite
file: these tests must hold whatever the engine's internals become.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import pytest
from _fault_procs import held

from memable import Context, Engine

CHILD = str(Path(__file__).with_name("_fault_procs.py"))
WAIT = 60.0  # generous: the CI machine runs four Pythons on two cores


# ---------------------------------------------------------------- helpers


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def query(db: Path, sql: str, *params: object) -> list[tuple[object, ...]]:
    """Rows of ``sql`` on the store, read through a read-only connection."""
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute(sql, params).fetchall()


def stored_steps(db: Path, instance_id: str) -> dict[str, object]:
    """Each completed step of the instance and its stored value (decoded JSON)."""
    rows = query(
        db, "SELECT key, result FROM memable_steps WHERE instance_id = ? AND state = 'completed'",
        instance_id,
    )
    return {str(key): json.loads(str(result)) for key, result in rows}


def instance_row(db: Path, instance_id: str) -> tuple[object, ...]:
    (row,) = query(db, "SELECT status, owner FROM memable_instances WHERE instance_id = ?",
                   instance_id)
    return row


def proc_state(pid: int) -> str:
    """The one-letter state of a process (R, S, T, Z, ...) from /proc/PID/stat."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


class Holder:
    """A child engine running "held" on one instance, blocked inside step s2."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True,
        )

    def readline(self) -> str:
        assert self.proc.stdout is not None
        return self.proc.stdout.readline()

    def release(self) -> None:
        """Let the blocked step s2 return."""
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self) -> tuple[int, str, str]:
        """Close its stdin (a blocked s2 returns), wait; its exit code, stdout and stderr."""
        proc = self.proc
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        if proc.returncode is None:  # a test that failed may have left it stopped
            os.kill(proc.pid, signal.SIGCONT)
        proc.stdin.close()
        try:  # its output is small: it fits the pipes while we wait
            proc.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        # Through the text wrappers: readline() may have buffered more than a line.
        with proc.stdout, proc.stderr:
            return proc.returncode, proc.stdout.read(), proc.stderr.read()


@contextmanager
def holding(*argv: str | Path) -> Iterator[Holder]:
    """Start a Holder, wait until it is inside s2; in the end, let it finish and reap it."""
    holder = Holder(list(map(str, argv)))
    try:
        assert holder.readline() == "in step 2\n", holder.finish()
        yield holder
    finally:
        if holder.proc.returncode is None:
            holder.finish()


def hold_argv(db: Path, log: Path, instance_id: str, lease: float) -> list[str | Path]:
    return [sys.executable, CHILD, "hold", db, log, instance_id, str(lease)]


def takeover_engine(db: Path, log: Path, gate: Callable[[], object] = lambda: None) -> Engine:
    """Engine B, in this process: recovers what dead owners left, runs "held" as "B"."""
    engine = Engine.open(db, recover=True, poll_interval=0.05, lease=30.0)
    engine.register("held", held(str(log), "B", gate))
    return engine


# ------------------------------------------------- 1. a stalled owner is fenced


@pytest.mark.parametrize(
    "b_done_first", [False, True], ids=["late-write-while-B-in-s2", "late-write-after-B-done"]
)
def test_a_stalled_owner_cannot_write_after_its_instance_was_taken_over(
    tmp_path: Path, b_done_first: bool
) -> None:
    """A SIGSTOPped owner's lease expires, B takes the instance over; A's late write is refused.

    A (lease 1 s) stalls inside s2; B recovers the instance and runs s2. A then
    wakes and its s2 returns, either while B is still inside s2 (no s2 row is
    stored yet: only the ownership check refuses A's write) or after B
    completed the instance. A must not store s2, must not run s3, and must
    exit cleanly reporting B's result.
    """
    db, log = tmp_path / "fenced.db", tmp_path / "effects.log"
    b_in_s2, release_b = threading.Event(), threading.Event()
    if b_done_first:
        release_b.set()

    def b_gate() -> None:
        b_in_s2.set()
        assert release_b.wait(WAIT)

    with holding(*hold_argv(db, log, "x", 1.0)) as a:
        os.kill(a.proc.pid, signal.SIGSTOP)
        os.waitpid(a.proc.pid, os.WUNTRACED)  # returns once A is stopped
        engine_b = takeover_engine(db, log, b_gate)
        with engine_b:
            assert b_in_s2.wait(WAIT), "B never took over the stalled instance"
            b_result = engine_b.invocation("held", "x")
            if b_done_first:
                assert b_result.result(timeout=WAIT) == "A1B2B3"
            os.kill(a.proc.pid, signal.SIGCONT)
            a.release()
            # A's s2 returned and it tried to store it: refused, its run stopped.
            assert "taken over by another engine" in a.readline()
            release_b.set()
            assert b_result.result(timeout=WAIT) == "A1B2B3"
            # A's Invocation followed the instance to the end B gave it.
            assert a.readline() == "run ended: completed\n"
        code, out, err = a.finish()

    assert (code, out.strip()) == (0, json.dumps("A1B2B3")), (out, err)
    assert "Traceback" not in err, err
    assert Counter(lines(log)) == Counter(["s1 A", "s2 A", "s2 B", "s3 B"])
    assert stored_steps(db, "x") == {"s1": "A1", "s2": "B2", "s3": "B3"}
    assert instance_row(db, "x") == ("completed", None)


# -------------------------------------------- 2. the timer thread honours deadlines


def test_a_short_timer_fires_on_its_deadline_not_on_the_poll(
    make_engine: Callable[..., Engine],
) -> None:
    """A 0.3 s timer fires after about 0.3 s although the poll interval is 5 s.

    Guards the timer thread sleeping until the earliest deadline: one that
    only woke on its poll would deliver the result after ~5 s.
    """
    engine = make_engine(poll_interval=5.0)

    @engine.workflow("nap")
    def nap(ctx: Context) -> str:
        ctx.timer("t", 0.3)
        return ctx.step("after").run(lambda: "woke")

    with engine:
        started = time.monotonic()
        inv = engine.invoke("nap")
        assert inv.result(timeout=WAIT) == "woke"
        elapsed = time.monotonic() - started
    assert 0.3 <= elapsed < 2.5, elapsed


# ------------------------------------- 3. a signal that arrives while the run is busy


def test_a_signal_sent_while_the_run_is_busy_is_taken_at_once(
    make_engine: Callable[..., Engine],
) -> None:
    """A signal sent while step "a" runs is used when the run reaches its suspend point.

    With a 30 s poll interval, only the engine noticing the signal that came
    during the run (not a later poll) makes the result arrive within seconds.
    (This reaches the suspend point after the signal is stored; a signal that
    lands after the suspension is recorded but before the run ends is a
    window this public-API test cannot aim at.)
    """
    engine = make_engine(poll_interval=30.0)
    in_a, release_a = threading.Event(), threading.Event()

    def step_a() -> str:
        in_a.set()
        assert release_a.wait(WAIT)
        return "a"

    @engine.workflow("busy")
    def busy(ctx: Context) -> str:
        a = ctx.step("a").run(step_a)
        payload: int = ctx.suspend("go")
        return f"{a}{payload}"

    with engine:
        inv = engine.invoke("busy", instance_id="b")
        assert in_a.wait(WAIT)
        engine.signal("busy", "b", "go", 5)
        started = time.monotonic()
        release_a.set()
        assert inv.result(timeout=WAIT) == "a5"
        assert time.monotonic() - started < 3.0


# ------------------------------------------------ 4. a zombie owner counts as dead


def test_a_killed_but_unreaped_owner_counts_as_dead(tmp_path: Path) -> None:
    """An owner SIGKILLed but not yet reaped by its parent (a zombie) is dead at once.

    Its lease (30 s) has not run out, and a zombie still answers kill(pid, 0):
    another engine on the same host must not wait out the lease to recover it.
    """
    db, log = tmp_path / "zombie.db", tmp_path / "effects.log"
    with holding(*hold_argv(db, log, "z", 30.0)) as a:
        a.proc.kill()
        # Waits until A has exited, without reaping it: A stays a zombie.
        os.waitid(os.P_PID, a.proc.pid, os.WEXITED | os.WNOWAIT)
        assert proc_state(a.proc.pid) == "Z"
        with takeover_engine(db, log) as engine_b:
            # Well before A's 30 s lease runs out (a TimeoutError here: it waited).
            assert engine_b.invocation("held", "z").result(timeout=5.0) == "A1B2B3"
        assert proc_state(a.proc.pid) == "Z"  # it was a zombie throughout
        code, _, _ = a.finish()
    assert code == -signal.SIGKILL
    assert Counter(lines(log)) == Counter(["s1 A", "s2 A", "s2 B", "s3 B"])


# ------------------------------------- 5. owners in other PID namespaces, same host


def free_pid() -> int:
    """A small pid that no process or thread of this (the root) PID namespace uses."""
    for pid in range(30, 30_000):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            continue
    raise AssertionError("no free pid")


def test_an_owner_in_another_pid_namespace_is_not_judged_by_its_pid(tmp_path: Path) -> None:
    """An engine does not reap an owner of its host name whose pid is of another namespace.

    A runs in a new PID namespace (same host name) as a pid that no process
    here has, holding instance "p" inside s2 with a 30 s lease. B, here, with
    recover=True and a 0.05 s poll, must leave it alone: A is alive.
    """
    unshare = "/usr/bin/unshare"
    assert os.access(unshare, os.X_OK), "this test needs util-linux unshare (and root)"
    db, log = tmp_path / "ns.db", tmp_path / "effects.log"
    pid = free_pid()
    argv = [unshare, "--pid", "--fork", "--mount-proc", "--kill-child",
            sys.executable, CHILD, "at-pid", str(pid), *hold_argv(db, log, "p", 30.0)[2:]]
    with holding(*argv) as a:
        (owner,) = query(db, "SELECT id FROM memable_owners WHERE pid = ?", pid)
        assert instance_row(db, "p") == ("running", owner[0])
        with takeover_engine(db, log) as engine_b:
            # B must NOT finish "p"; the bounded wait is unavoidable when
            # asserting that nothing happens. 1.5 s is ~30 of B's polls, and
            # returns early (failing) if B recovers and completes "p".
            with pytest.raises(TimeoutError):
                engine_b.invocation("held", "p").result(timeout=1.5)
            assert query(db, "SELECT id FROM memable_owners WHERE pid = ?", pid) == [owner]
            assert instance_row(db, "p") == ("running", owner[0])
            assert lines(log) == ["s1 A", "s2 A"]
            a.release()
            assert a.readline() == "run ended: completed\n"
            assert engine_b.invocation("held", "p").result(timeout=WAIT) == "A1A2A3"
        code, out, err = a.finish()
    assert (code, out) == (0, json.dumps("A1A2A3") + "\n"), err
    assert Counter(lines(log)) == Counter(["s1 A", "s2 A", "s3 A"])
