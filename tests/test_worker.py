"""``memable worker``: a real process that runs an engine, signalled and stopped from outside."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest

from memable import Context, Engine

APP = '''
import os
from memable import Context, Engine

engine = Engine.open(os.environ["MEMABLE_DB"], poll_interval=0.05)


def through_gate() -> str:
    # Blocks until the test opens the FIFO for writing: a step held in flight.
    with open(os.environ["GATE"]) as gate:
        return gate.read()


@engine.workflow("approve")
def approve(ctx: Context) -> str:
    ctx.step("prepare:v1").run(lambda: "prepared")
    answer = ctx.suspend("approval:v1")
    if os.environ.get("GATE"):
        ctx.step("gate:v1").run(through_gate)
    return ctx.step("finish:v1").run(lambda: f"approved {answer}")


not_an_engine = 42
'''
WAIT = 30.0  # seconds any one expected event may take on a slow machine


class Worker:
    """A ``memable worker`` subprocess whose log lines are collected as they come."""

    def __init__(self, cwd: Path, *args: str, gate: Path | None = None,
                 env: dict[str, str] | None = None) -> None:
        env = {**os.environ, "MEMABLE_DB": str(cwd / "store.db"), **(env or {})}
        if gate is not None:
            env["GATE"] = str(gate)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "memable", "worker", "app:engine", *args],
            cwd=cwd, env=env, stderr=subprocess.PIPE, text=True,
        )
        # _cond guards lines: appended by the reader thread, read by the test.
        self._cond = threading.Condition()
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, name="test-worker-log", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_for(self, pattern: str) -> str:
        """The first log line matching ``pattern``, waiting for it to be written."""
        def found() -> str | None:
            return next((line for line in self.lines if re.search(pattern, line)), None)

        with self._cond:
            if not self._cond.wait_for(found, timeout=WAIT):
                pytest.fail(f"no log line matched {pattern!r}; got:\n" + "\n".join(self.lines))
            line = found()
        assert line is not None
        return line

    def stop(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        code = self.proc.wait(timeout=WAIT)
        self._reader.join(timeout=WAIT)
        return code

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._reader.join(timeout=WAIT)
        if self.proc.stderr is not None:
            self.proc.stderr.close()


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    return tmp_path


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for worker in started:
        worker.kill()


def _invoke_until_suspended(db: Path, instance_id: str) -> None:
    """Invoke ``approve`` from this process; it runs up to its suspend point here."""
    engine = Engine.open(db)

    def approve(ctx: Context) -> str:  # the first run only reaches the suspend point
        ctx.step("prepare:v1").run(lambda: "prepared")
        return str(ctx.suspend("approval:v1"))

    engine.register("approve", approve)
    with engine:
        state = engine.invoke("approve", instance_id=instance_id).wait(timeout=WAIT)
    assert str(state) == "suspended: approval:v1"


def _cli(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "memable", *args],
        cwd=cwd, capture_output=True, text=True, timeout=WAIT,
    )


def _signal(cwd: Path, instance_id: str, payload: str) -> None:
    """`memable signal` from another process, as an operator would."""
    done = _cli(cwd, "signal", "store.db", "approve", instance_id, "approval:v1", payload)
    assert done.returncode == 0, done.stderr


def _stored(db: Path, instance_id: str) -> tuple[str, object]:
    engine = Engine.open(db)  # read only: never started
    try:
        meta = engine.get_metadata("approve", instance_id)
        assert meta is not None
        steps = {s.key: s.result for s in engine.steps("approve", instance_id)}
    finally:
        engine.close()
    return type(meta.status).__name__.lower(), steps


def _held_in_a_step(
    app_dir: Path, workers: list[Worker], instance_id: str, *args: str
) -> tuple[Worker, Path]:
    """A worker whose run of ``instance_id`` is held in step gate:v1 until the FIFO opens."""
    gate = app_dir / "gate"
    os.mkfifo(gate)
    worker = Worker(app_dir, *args, gate=gate)
    workers.append(worker)
    worker.wait_for(r"worker \d+ started")
    _invoke_until_suspended(app_dir / "store.db", instance_id)
    _signal(app_dir, instance_id, "1")
    worker.wait_for(rf"approve/{instance_id}: running")
    return worker, gate


def test_worker_runs_what_another_process_invoked_and_signalled(
    app_dir: Path, workers: list[Worker]
) -> None:
    """Invoked here, signalled with `memable signal`, completed by the worker; SIGTERM exits 0."""
    worker = Worker(app_dir, "--threads", "2")
    workers.append(worker)
    worker.wait_for(r"worker \d+ started")
    _invoke_until_suspended(app_dir / "store.db", "job-1")

    _signal(app_dir, "job-1", '"yes"')

    worker.wait_for(r"approve/job-1: completed")
    assert worker.stop(signal.SIGTERM) == 0
    worker.wait_for(r"received SIGTERM: taking no new work")
    worker.wait_for(r"worker \d+ stopped")
    status, steps = _stored(app_dir / "store.db", "job-1")
    assert status == "completed"
    assert steps == {"prepare:v1": "prepared", "approval:v1": "yes", "finish:v1": "approved yes"}
    # One line per state change, each naming the instance.
    named = "approve/job-1: "
    assert [line.split(named, 1)[1] for line in worker.lines if named in line] == [
        "running", "completed",
    ]


def test_sigterm_lets_the_run_in_flight_finish_before_exiting(
    app_dir: Path, workers: list[Worker]
) -> None:
    """A run held inside a step when SIGTERM arrives completes; then the worker exits 0."""
    worker, gate = _held_in_a_step(app_dir, workers, "job-2")

    worker.proc.send_signal(signal.SIGTERM)
    worker.wait_for(r"taking no new work")
    assert worker.proc.poll() is None, "the worker exited with a run in flight"
    with open(gate, "w") as opened:  # lets the held step return
        opened.write("through")

    assert worker.proc.wait(timeout=WAIT) == 0
    worker.wait_for(r"approve/job-2: completed")
    status, steps = _stored(app_dir / "store.db", "job-2")
    assert (status, steps["gate:v1"], steps["finish:v1"]) == ("completed", "through", "approved 1")


#: What an OpenTelemetry SDK does when the app configures it: a thread started at import.
A_THREAD_AT_IMPORT = """
import threading
threading.Thread(target=threading.Event().wait, name="exporter", daemon=True).start()
"""


def test_a_second_sigterm_during_the_drain_does_not_kill_a_worker_whose_app_starts_threads(
    app_dir: Path, workers: list[Worker]
) -> None:
    """The app's import starts a thread; the signals were blocked before it, so the second
    SIGTERM waits like the first instead of ending the process from that thread."""
    (app_dir / "app.py").write_text(textwrap.dedent(APP) + A_THREAD_AT_IMPORT)
    worker, gate = _held_in_a_step(app_dir, workers, "job-3")
    worker.proc.send_signal(signal.SIGTERM)
    worker.wait_for(r"taking no new work")
    worker.proc.send_signal(signal.SIGTERM)
    with open(gate, "w") as opened:  # lets the held step return
        opened.write("through")
    assert worker.proc.wait(timeout=WAIT) == 0
    worker.wait_for(r"approve/job-3: completed")
    worker.wait_for(r"worker \d+ stopped")


def test_a_run_still_in_flight_after_the_grace_period_is_left_for_recovery(
    app_dir: Path, workers: list[Worker]
) -> None:
    """Past --grace the worker exits 1; the steps it completed stay, the instance stays running."""
    worker, _ = _held_in_a_step(app_dir, workers, "job-3", "--grace", "0.2")  # never released

    assert worker.stop(signal.SIGINT) == 1
    line = worker.wait_for(r"grace period")
    assert "approve/job-3 [gate:v1 since " in line
    assert "recovers it" in line
    status, steps = _stored(app_dir / "store.db", "job-3")
    assert status == "running"
    assert steps == {"prepare:v1": "prepared", "approval:v1": 1}


def test_grace_zero_with_nothing_in_flight_stops_cleanly(
    app_dir: Path, workers: list[Worker]
) -> None:
    """--grace 0 and no run: exit 0, no ERROR, and the worker's owner row is gone."""
    worker = Worker(app_dir, "--grace", "0")
    workers.append(worker)
    worker.wait_for(r"worker \d+ started")
    assert worker.stop(signal.SIGTERM) == 0
    worker.wait_for(r"worker \d+ stopped")
    assert not [line for line in worker.lines if " ERROR " in line]
    assert _owners(app_dir / "store.db") == []


@pytest.mark.parametrize("grace", ["-5", "-0.1", "nan", "inf"])
def test_a_negative_grace_is_refused_before_anything_starts(app_dir: Path, grace: str) -> None:
    """``memable worker --grace`` refuses a negative, NaN or infinite grace with exit 2 naming
    the option, before opening (and so creating) the store."""
    done = _cli(app_dir, "worker", "app:engine", "--grace", grace)
    assert done.returncode == 2
    assert "--grace" in done.stderr
    assert not (app_dir / "store.db").exists()


def test_sigterm_does_not_wait_for_a_cancelled_instance_nor_promise_its_recovery(
    app_dir: Path, workers: list[Worker]
) -> None:
    """A hung step of a cancelled instance: SIGTERM exits at once (not after --grace), 0."""
    worker, _ = _held_in_a_step(app_dir, workers, "job-4", "--grace", "600")  # never released
    done = _cli(app_dir, "cancel", "store.db", "approve", "job-4")
    assert done.returncode == 0, done.stderr
    assert worker.stop(signal.SIGTERM) == 0  # within WAIT, far short of the grace
    line = worker.wait_for(r"leaving approve/job-4")
    assert "cancelled" in line
    assert "[gate:v1 since " in line
    assert not [line for line in worker.lines if "recovers" in line or " ERROR " in line]
    status, _ = _stored(app_dir / "store.db", "job-4")
    assert status == "cancelled"


def _owners(db: Path) -> list[tuple[object, ...]]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as conn:
        return conn.execute("SELECT id FROM memable_owners").fetchall()


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("app", "expected MODULE:ENGINE"),
        ("no_such_module:engine", "cannot import 'no_such_module'"),
        ("app:missing", "has no attribute 'missing'"),
        ("app:not_an_engine", "is not a memable Engine (it is a int)"),
    ],
)
def test_a_bad_engine_spec_exits_2_with_a_message(app_dir: Path, spec: str, says: str) -> None:
    """What cannot be loaded is reported on stderr with exit 2, before anything starts."""
    done = subprocess.run(
        [sys.executable, "-m", "memable", "worker", spec],
        cwd=app_dir, env={**os.environ, "MEMABLE_DB": str(app_dir / "store.db")},
        capture_output=True, text=True, timeout=WAIT,
    )
    assert done.returncode == 2
    assert says in done.stderr
    assert "Traceback" not in done.stderr


def test_retention_given_to_the_worker_purges_what_finished_longer_ago(
    app_dir: Path, workers: list[Worker]
) -> None:
    """``--retention 1d`` on an app engine without retention: at its start the worker
    purges an instance that finished in 2001 and keeps one that finished just now."""
    db = app_dir / "store.db"
    engine = Engine.open(db)
    engine.register("approve", lambda ctx: "done")
    with engine:
        for instance_id in ("old", "new"):
            assert engine.invoke("approve", instance_id=instance_id).result(WAIT) == "done"
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE memable_instances SET completed_at = '2001-01-01T00:00:00+00:00' "
                     "WHERE instance_id = 'old'")

    worker = Worker(app_dir, "--retention", "1d")
    workers.append(worker)
    worker.wait_for(r"retention: purged 1 finished instance completed before")
    assert worker.stop(signal.SIGTERM) == 0
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("SELECT instance_id FROM memable_instances").fetchall() == [("new",)]


@pytest.mark.parametrize("age", ["0d", "soon", "-1h"])
def test_a_bad_retention_exits_2_before_the_app_is_loaded(app_dir: Path, age: str) -> None:
    """An age that is not a duration over 0 is refused, naming the option, with exit 2;
    the app is not imported (its module would make the store)."""
    done = subprocess.run(
        [sys.executable, "-m", "memable", "worker", "app:engine", "--retention", age],
        cwd=app_dir, env={**os.environ, "MEMABLE_DB": str(app_dir / "store.db")},
        capture_output=True, text=True, timeout=WAIT,
    )
    assert done.returncode == 2, done.stderr
    assert "--retention" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (app_dir / "store.db").exists()


#: A worker on PostgreSQL (a URL and a schema from the environment) with a 3 s lease: its
#: one workflow waits for a signal, then holds a step until the FIFO ``GATE`` opens.
PG_APP = """
import os
from memable import Context, Engine

engine = Engine.open(os.environ["MEMABLE_DB"], schema=os.environ["SCHEMA"], lease=3.0,
                     poll_interval=0.2)


def through_gate() -> str:
    with open(os.environ["GATE"]) as gate:
        return gate.read()


@engine.workflow("gated")
def gated(ctx: Context) -> str:
    ctx.suspend("go")
    return ctx.step("gate:v1").run(through_gate)
"""


def test_sigterm_with_the_server_unreachable_exits_within_the_lease_in_one_line(
    tmp_path: Path, pg_schema: str, workers: list[Worker],
) -> None:
    """A worker on PostgreSQL through a proxy holds a run in a step; the proxy drops every
    connection and refuses new ones, the step returns (its write meets the outage) and
    the worker gets SIGTERM. The worker exits 0 within its 3 s lease, without a
    traceback: the run stops once the lease is known lost, and stopping says in one line
    that the owner row stays for its lease to expire. psycopg's pool's reconnect tries
    print nothing (its WARNINGs used to reach stderr, one per try)."""
    import time

    from _tcp_proxy import Proxy
    from conftest import POSTGRES_URL

    from memable._postgres.schema import parse

    params = parse(POSTGRES_URL)
    proxy = Proxy((params.get("host", "127.0.0.1"), int(params.get("port", "5432"))))
    through = (f"postgresql://{params.get('user', 'postgres')}@127.0.0.1:{proxy.port}/"
               f"{params.get('dbname', 'test')}")
    (tmp_path / "app.py").write_text(textwrap.dedent(PG_APP))
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    try:
        worker = Worker(tmp_path, gate=gate, env={"MEMABLE_DB": through, "SCHEMA": pg_schema})
        workers.append(worker)
        worker.wait_for(r"worker \d+ started")
        here = Engine.open(POSTGRES_URL, schema=pg_schema)
        here.register("gated", lambda ctx: ctx.suspend("go"))
        with here:
            assert str(here.invoke("gated", instance_id="x").wait(timeout=WAIT)) == (
                "suspended: go")
        signaller = Engine.open(POSTGRES_URL, schema=pg_schema)  # runs nothing itself
        with signaller:
            signaller.signal("gated", "x", "go", True)
        worker.wait_for(r"gated/x: running")
        # The gate opens for writing once the step has opened it for reading: the step
        # is in flight, before the store goes. (The run logs "running" before its first
        # look at the store: dropped then, the run stopped at its lease's end without
        # reaching the step, and this open waited forever for a reader.)
        with open(gate, "w") as opened:
            proxy.drop()
            began = time.monotonic()
            # The step returns once the store is gone (its write meets the outage), and
            # before the SIGTERM: let go after it, a slow test could find the worker gone
            # at its lease's end.
            opened.write("through")
        worker.proc.send_signal(signal.SIGTERM)
        worker.wait_for(r"taking no new work")
        assert worker.proc.wait(timeout=WAIT) == 0
        took = time.monotonic() - began
        worker._reader.join(timeout=WAIT)
    finally:
        proxy.close()
    assert took < 3.0, (took, worker.lines)
    assert not [line for line in worker.lines if "Traceback" in line], worker.lines
    assert not [line for line in worker.lines if "psycopg" in line], worker.lines
    assert len([line for line in worker.lines if "owner row stays" in line]) == 1
