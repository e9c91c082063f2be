"""What an operator sees with ``memable show``, ``list`` and ``signal`` (issue 11's findings).

Each test runs the command line against a store a real engine is writing (in
this process, or in a child killed with SIGKILL): a running instance names
its owner and whether it lives, the step in flight and the status message;
a failed one its traceback; large values are cut unless ``--full``; a
signal to a key nobody waits on, or to a workflow the store never saw, is
answered with a word, not silence.
"""

from __future__ import annotations

import json
import os
import socket
import sqlite3
import threading
from collections.abc import Callable, Iterator
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from helpers import killed_in_a_step

from memable import Context, Engine
from memable._cli.commands import main

WAIT = 30.0


def cli(*args: object) -> Result:
    result = CliRunner().invoke(main, [os.fspath(a) for a in args])  # type: ignore[arg-type]
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def shown(db: Path, workflow: str, instance_id: str, *more: str) -> dict[str, Any]:
    result = cli("show", db, workflow, instance_id, "--json", *more)
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    view: dict[str, Any] = json.loads(result.stdout)
    return view


def eventually(look: Callable[[], Any]) -> Any:
    """The first truthy value of ``look()``, read again every 20 ms up to WAIT seconds.

    For what another thread or process writes to the store at its heartbeat:
    there is no event to wait on across a store.
    """
    pause = threading.Event()
    for _ in range(int(WAIT / 0.02)):
        found = look()
        if found:
            return found
        pause.wait(0.02)
    pytest.fail("the store never showed it")


@pytest.fixture
def held(tmp_path: Path) -> Iterator[tuple[Path, Engine, threading.Event]]:
    """An engine on a file whose instance pay/order-1 is inside step charge:v1 until set."""
    db = tmp_path / "store.db"
    release = threading.Event()

    def pay(ctx: Context, total: int) -> str:
        ctx.step("reserve:v1").run(lambda: "reserved")
        ctx.set_status("charging the card")
        return ctx.step("charge:v1").run(lambda: release.wait(WAIT) and f"charged {total}")

    # A short lease: the heartbeat that notes the step in flight comes every 0.1 s.
    engine = Engine.open(db, lease=0.3)
    engine.register("pay", pay)
    engine.start()
    invocation = engine.invoke("pay", 12, instance_id="order-1")
    try:
        yield db, engine, release
    finally:
        release.set()
        invocation.wait(timeout=WAIT)
        engine.close()


def test_show_of_a_running_instance_names_its_owner_step_in_flight_and_status(
    held: tuple[Path, Engine, threading.Event],
) -> None:
    """``show`` of an instance an engine in this process holds inside a step names its owner
    (host and pid, alive, judged by its pid), the step in flight and since when, and its status
    message, in JSON and in the text."""
    db, _, _ = held
    view = eventually(lambda: (v := shown(db, "pay", "order-1"))["in_flight"] and v)
    assert view["status"] == "running"
    assert view["status_message"] == "charging the card"
    assert view["in_flight"]["key"] == "charge:v1"
    assert view["in_flight"]["since"] >= view["created_at"]
    owner = view["owner"]
    assert (owner["host"], owner["pid"], owner["alive"], owner["judged_by"]) == (
        socket.gethostname(), os.getpid(), True, "pid",
    )
    lines = cli("show", db, "pay", "order-1").stdout.splitlines()
    assert "status     charging the card" in lines
    assert f"owner      {socket.gethostname()} pid {os.getpid()} (alive, judged by its pid)" in (
        lines
    )
    assert f"in flight  charge:v1 since {view['in_flight']['since']}" in lines


def test_list_names_the_owner_of_a_running_instance_and_its_age(
    held: tuple[Path, Engine, threading.Event],
) -> None:
    """``list`` of a running instance gives its owner's host and pid, alive, in the OWNER column
    and its age in seconds (JSON: an owner record and age_seconds)."""
    db, _, _ = held
    [record] = json.loads(cli("list", db, "--status", "running", "--json").stdout)
    assert record["owner"] == {"host": socket.gethostname(), "pid": os.getpid(), "alive": True}
    assert 0 <= record["age_seconds"] < WAIT
    header, row = cli("list", db, "--status", "running").stdout.splitlines()
    assert header.split() == [
        "WORKFLOW", "INSTANCE", "STATUS", "MESSAGE", "OWNER", "AGE", "CREATED", "UPDATED",
    ]
    assert f"{socket.gethostname()}:{os.getpid()}" in row.split()


def test_show_of_an_instance_whose_owner_was_killed_says_it_is_dead(tmp_path: Path) -> None:
    """SIGKILL the engine's process inside step s3: its instance shows a dead owner."""
    db, log = tmp_path / "store.db", tmp_path / "log"
    with killed_in_a_step(db, log, 3) as pid:
        eventually(lambda: shown(db, "ten", "crash")["in_flight"])
    view = shown(db, "ten", "crash")
    assert view["status"] == "running"
    assert view["in_flight"]["key"] == "s3"
    owner = view["owner"]
    assert (owner["pid"], owner["alive"], owner["judged_by"]) == (pid, False, "pid")
    text = cli("show", db, "ten", "crash").stdout
    assert f"pid {pid} (dead, judged by its pid)" in text


def test_show_of_a_failed_instance_prints_its_traceback(tmp_path: Path) -> None:
    """``show`` of a failed instance prints the failed step's traceback, with the raising line,
    after the steps table; the JSON carries it on the instance and on the step, along with the
    failed attempt's start time."""
    db = tmp_path / "store.db"

    def declined() -> None:
        raise RuntimeError("card declined")

    engine = Engine.open(db)
    engine.register("charge", lambda ctx: ctx.step("charge:v1").run(declined))
    with engine:
        engine.invoke("charge", instance_id="order-8").wait(timeout=WAIT)
    engine.close()
    view = shown(db, "charge", "order-8")
    assert view["traceback"].startswith("Traceback (most recent call last):")
    assert "RuntimeError: card declined" in view["traceback"]
    assert "RuntimeError: card declined" in view["steps"][0]["traceback"]
    assert view["steps"][0]["started_at"] is not None  # the failed attempt's start is kept
    text = cli("show", db, "charge", "order-8").stdout
    after = text.split("\ntraceback:\n", 1)[1]
    assert after.startswith("Traceback (most recent call last):")
    assert 'raise RuntimeError("card declined")' in after


def test_show_cuts_large_values_and_full_prints_them(tmp_path: Path) -> None:
    """``show`` cuts an input, output or step result longer than 2000 characters and says how
    long each was and that --full prints it; with --full every value is printed whole."""
    db = tmp_path / "store.db"
    big = "x" * 100_000
    engine = Engine.open(db)
    engine.register("echo", lambda ctx, text: ctx.step("copy:v1").run(lambda: text))
    with engine:
        engine.invoke("echo", big, instance_id="big").result(timeout=WAIT)
    engine.close()
    whole = len(json.dumps(big))
    view = shown(db, "echo", "big")
    assert view["cut"] == {"input": whole, "output": whole, "steps[0].result": whole}
    assert view["input"] == json.dumps(big)[:2000]
    text = cli("show", db, "echo", "big").stdout
    assert len(text) < 10_000
    assert f"… (cut: {whole:,} characters; --full prints them all)" in text
    assert f"steps[0].result ({whole:,} characters)" in text
    full = shown(db, "echo", "big", "--full")
    assert (full["cut"], full["input"], full["steps"][0]["result"]) == ({}, big, big)
    assert big in cli("show", db, "echo", "big", "--full").stdout


@pytest.fixture
def parked(tmp_path: Path) -> Path:
    """A store with approve/doc-1 suspended on the signal approval:v1."""
    db = tmp_path / "store.db"
    engine = Engine.open(db)
    engine.register("approve", lambda ctx: ctx.suspend("approval:v1"))
    with engine:
        engine.invoke("approve", instance_id="doc-1").wait(timeout=WAIT)
    engine.close()
    return db


def test_a_signal_to_a_key_the_instance_does_not_wait_on_says_so(parked: Path) -> None:
    """A signal to a key the instance does not wait on is stored, with a note naming the key it
    waits on and suggesting it; a signal to that key then goes through with no note."""
    result = cli("signal", parked, "approve", "doc-1", "approval", '"carol"')
    assert result.exit_code == 0
    assert result.stdout == "signal approval stored for approve/doc-1\n"
    assert result.stderr == (
        "memable: note: approve/doc-1 is not waiting on 'approval' (it waits on "
        "'approval:v1'); the value is kept for when the workflow reaches that key; "
        "did you mean 'approval:v1'?\n"
    )
    right = cli("signal", parked, "approve", "doc-1", "approval:v1", '"carol"')
    assert (right.exit_code, right.stderr) == (0, "")


def test_a_signal_to_a_workflow_the_store_never_saw_is_refused(parked: Path) -> None:
    """A signal to a workflow the store has no instance of is refused with exit 2, suggesting
    the close name, and the store file is left byte for byte as it was."""
    before = parked.read_bytes()
    result = cli("signal", parked, "aprove", "doc-1", "approval:v1", '"carol"')
    assert result.exit_code == 2
    assert result.stderr == (
        "memable: error: no stored instance (the store has no instance of this workflow "
        "at all): workflow 'aprove', instance 'doc-1'; did you mean 'approve'?\n"
    )
    assert parked.read_bytes() == before


def test_show_of_a_timer_past_the_calendar_does_not_crash(tmp_path: Path) -> None:
    """An older memable stored ``ctx.timer(key, 1e12)``: show prints it, it does not crash."""
    db = tmp_path / "store.db"
    engine = Engine.open(db)
    engine.register("cool", lambda ctx: ctx.timer("cool-off:v1", 3600))
    with engine:
        engine.invoke("cool", instance_id="c").wait(timeout=WAIT)
    engine.close()
    with closing(sqlite3.connect(db)) as conn, conn:
        conn.execute("UPDATE memable_timers SET deadline = 1e12")
    [timer] = shown(db, "cool", "c")["timers"]
    assert timer == {
        "key": "cool-off:v1", "due": "1000000000000.0 s after 1970-01-01 (past the calendar)",
    }
    assert "past the calendar" in cli("show", db, "cool", "c").stdout


@pytest.mark.parametrize(
    ("key", "why"),
    [("approval:v1", "the key already holds a value"),
     ("draft:v1", "the key is a step, not a suspend point")],
)
def test_a_refused_signal_names_the_instance_and_the_key(
    tmp_path: Path, key: str, why: str
) -> None:
    """A signal to a key that already holds a value, or to a step's key, is refused with exit 2
    naming the reason, the instance and the key, and the store file is left byte for byte as it
    was."""
    db = tmp_path / "store.db"
    engine = Engine.open(db)

    def approve(ctx: Context) -> None:
        ctx.step("draft:v1").run(lambda: "draft")
        ctx.suspend("approval:v1")
        ctx.suspend("publish:v1")

    engine.register("approve", approve)
    with engine:
        inv = engine.invoke("approve", instance_id="doc-1")
        inv.wait(timeout=WAIT)
        engine.signal("approve", "doc-1", "approval:v1", "ana")
        inv.wait(timeout=WAIT)
    engine.close()
    before = db.read_bytes()
    result = cli("signal", db, "approve", "doc-1", key, '"bob"')
    assert result.exit_code == 2
    assert result.stderr == (
        f"memable: error: signal rejected ({why}): workflow 'approve', instance 'doc-1', "
        f"step '{key}'\n"
    )
    assert db.read_bytes() == before


def test_list_shows_the_status_message_of_a_running_instance(
    held: tuple[Path, Engine, threading.Event],
) -> None:
    """The MESSAGE column of a running instance is its status message, not '-'."""
    db, _, _ = held
    [record] = eventually(lambda: [
        r for r in json.loads(cli("list", db, "--status", "running", "--json").stdout)
        if r["status_message"] is not None
    ])
    assert record["status_message"] == "charging the card"
    _, row = cli("list", db, "--status", "running").stdout.splitlines()
    assert "charging the card" in row


def test_list_marks_a_dead_owner_dead(tmp_path: Path) -> None:
    """SIGKILL the engine inside step s3: list names its owner with '(dead)' (JSON: alive
    False); a live owner is not so marked (test_list_names_the_owner_...)."""
    db, log = tmp_path / "store.db", tmp_path / "log"
    with killed_in_a_step(db, log, 3) as pid:
        eventually(lambda: shown(db, "ten", "crash")["in_flight"])
    [record] = json.loads(cli("list", db, "--status", "running", "--json").stdout)
    assert record["owner"] == {"host": socket.gethostname(), "pid": pid, "alive": False}
    _, row = cli("list", db, "--status", "running").stdout.splitlines()
    assert f"{socket.gethostname()}:{pid} (dead)" in row


def test_show_labels_the_end_of_a_failed_instance_ended(tmp_path: Path) -> None:
    """A failed instance's end time is 'ended', not 'completed'."""
    db = tmp_path / "store.db"
    engine = Engine.open(db)
    engine.register("boom", lambda ctx: ctx.step("s").run(lambda: 1 / 0))
    with engine:
        engine.invoke("boom", instance_id="b").wait(timeout=WAIT)
    view = shown(db, "boom", "b")
    lines = cli("show", db, "boom", "b").stdout.splitlines()
    assert f"ended      {view['completed_at']}" in lines
    assert not any(line.startswith("completed") for line in lines)
