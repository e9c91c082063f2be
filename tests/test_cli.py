"""The command line: ``memable list/show/signal/cancel/purge`` on stores a real engine wrote.

Every test gets its own copy of one store, made once per module by an engine
under a frozen clock (``pristine_store``), with an instance in each status
but running (a running instance needs a live engine: see the tests at the
end). Refusals must exit 2 with one line on stderr and leave the file, every
row in it and its WAL/SHM files exactly as they were.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable
from contextlib import closing
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from click.testing import Result
from freezegun import freeze_time
from helpers import cli

import memable
from memable import (
    Cancelled,
    Completed,
    Context,
    Engine,
    Failed,
    MetadataStatus,
    Suspended,
)

# ---------------------------------------------------------------------- the store


def ship(tick: Callable[[timedelta], object]) -> Callable[[Context, dict[str, Any]], Any]:
    """Two steps taking 250 ms and 1.5 s on the frozen clock, a status before each."""

    def reserve() -> str:
        tick(timedelta(milliseconds=250))
        return "reserved"

    def workflow(ctx: Context, order: dict[str, Any]) -> dict[str, str]:
        ctx.set_status("reserving stock")
        stock = ctx.step("reserve:v1").run(reserve)
        ctx.set_status("printing label")

        def label() -> str:
            tick(timedelta(seconds=1.5))
            return f"LBL-{order['id']}"

        return {"label": ctx.step("label:v1").run(label), "stock": stock}

    return workflow


def charge(ctx: Context, order: dict[str, Any]) -> None:
    """Fails in its second step."""
    ctx.step("prepare:v1").run(lambda: "ready")

    def declined() -> None:
        raise RuntimeError("card declined")

    ctx.step("charge:v1").run(declined)


def approve(ctx: Context, doc: str) -> str:
    """Waits for the signal "approval:v1" (the approver's name)."""
    ctx.step("draft:v1").run(lambda: f"draft of {doc}")
    approver = ctx.suspend("approval:v1", status="waiting for a manager")
    return ctx.step("publish:v1").run(lambda: f"{doc} approved by {approver}")


def cool(ctx: Context) -> str:
    """Sleeps three days on a durable timer."""
    ctx.timer("cool-off:v1", timedelta(days=3))
    return "cooled"


class Store(NamedTuple):
    path: Path
    #: When the first instance (ship/order-7) was created.
    t0: datetime
    #: When every other instance was created and ship/order-7 finished (t0 + 1.75 s).
    later: datetime


#: Every instance of the store, oldest first, as ``list`` orders them.
INSTANCES = [
    ("ship", "order-7", "completed", "-"),
    ("approve", "doc-1", "suspended", "waiting for a manager"),
    ("approve", "doc-2", "cancelled", "-"),
    ("charge", "order-8", "failed", "step 'charge:v1' failed: RuntimeError: card declined"),
    ("cool", "cool-1", "suspended", "timer cool-off:v1"),
]
FINISHED = 3  # order-7, doc-2 and order-8


@pytest.fixture(scope="module")
def pristine_store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    """A store with an instance in every status but running, made on a frozen clock.

    The clock stands an hour in the past, so that the store's times are
    behind the wall clock of the tests that run a live engine, and its timer
    (due in three days) is never due.
    """
    path = tmp_path_factory.mktemp("pristine") / "store.db"
    t0 = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(hours=1)
    with freeze_time(t0) as clock:
        engine = Engine.open(path)
        try:
            engine.register("ship", ship(clock.tick))
            engine.register("charge", charge)
            engine.register("approve", approve)
            engine.register("cool", cool)
            engine.start()
            invoke = engine.invoke
            assert invoke("ship", {"id": 7, "total": 9.5}, instance_id="order-7").wait(10) == (
                Completed()
            )
            assert isinstance(invoke("charge", {"id": 8}, instance_id="order-8").wait(10), Failed)
            assert invoke("approve", "report", instance_id="doc-1").wait(10) == Suspended(
                "waiting for a manager"
            )
            assert invoke("cool", instance_id="cool-1").wait(10) == Suspended("timer cool-off:v1")
            assert invoke("approve", "memo", instance_id="doc-2").wait(10) == Suspended(
                "waiting for a manager"
            )
            engine.cancel("approve", "doc-2")
        finally:
            engine.close()
    # Closed, the engine checkpointed its WAL: the store is this one file.
    assert sidecars(path) == []
    return Store(path, t0, t0 + timedelta(seconds=1.75))


@pytest.fixture
def store(pristine_store: Store, tmp_path: Path) -> Store:
    """This test's own copy of the pristine store."""
    path = tmp_path / "store.db"
    shutil.copyfile(pristine_store.path, path)
    return pristine_store._replace(path=path)


# ---------------------------------------------------------------------- helpers


def ok(*args: str | os.PathLike[str]) -> str:
    """Run a command that must succeed; return its stdout."""
    result = cli(*args)
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    return result.stdout


def noted(*args: str | os.PathLike[str]) -> tuple[str, str]:
    """Run a command that must succeed with one note on stderr; return (stdout, the note)."""
    result = cli(*args)
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith("memable: note: ")
    assert result.stderr.count("\n") == 1
    return result.stdout, result.stderr.removeprefix("memable: note: ").rstrip("\n")


def sidecars(path: Path) -> list[str]:
    """The files SQLite keeps beside ``path`` (-wal, -shm, -journal)."""
    return sorted(p.name for p in path.parent.glob(f"{path.name}-*"))


class Snapshot(NamedTuple):
    data: bytes
    #: Every row as SQL text; None for a file SQLite cannot read.
    rows: list[str] | None
    sidecars: list[str]


def snapshot(path: Path) -> Snapshot:
    """The bytes of the file, then every row in it (read on a connection of our own)."""
    data = path.read_bytes()
    rows: list[str] | None
    try:
        with closing(sqlite3.connect(path)) as conn:
            rows = list(conn.iterdump())
    except sqlite3.DatabaseError:
        rows = None
    return Snapshot(data, rows, sidecars(path))


def error_line(result: Result) -> str:
    """The message of a refusal: exit 2, nothing on stdout, one ``memable: error:`` line."""
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    assert result.stderr.startswith("memable: error: ")
    assert result.stderr.count("\n") == 1, result.stderr
    assert result.stderr.endswith("\n")
    return result.stderr.removeprefix("memable: error: ").rstrip("\n")


def refused(path: Path, *args: str | os.PathLike[str]) -> str:
    """Run a command that must be refused, leaving ``path`` as it was; return the message."""
    before = snapshot(path)
    message = error_line(cli(*args))
    assert snapshot(path) == before
    return message


def table(lines: list[str]) -> list[dict[str, str]]:
    """The rows of a table the CLI printed, keyed by its header ('-' for no value)."""
    header, *rows = lines
    names = header.split()
    return [dict(zip(names, re.split(r" {2,}", row), strict=True)) for row in rows]


def section(text: str, heading: str) -> list[dict[str, str]]:
    """The table printed under ``heading`` in ``show`` output."""
    lines = text.splitlines()
    start = lines.index(heading) + 1
    end = lines.index("", start) if "" in lines[start:] else len(lines)
    return table(lines[start:end])


def listed(*args: str) -> list[tuple[str, str, str, str]]:
    """(workflow, instance, status, message) of each row ``memable list ARGS`` prints."""
    rows = table(ok("list", *args).splitlines())
    return [(r["WORKFLOW"], r["INSTANCE"], r["STATUS"], r["MESSAGE"]) for r in rows]


def shown(store: Store, workflow: str, instance_id: str) -> dict[str, Any]:
    """``memable show --json`` of one instance."""
    view: dict[str, Any] = json.loads(
        ok("show", store.path, workflow, instance_id, "--json")
    )
    return view


def timer_rows(path: Path, instance_id: str) -> int:
    with closing(sqlite3.connect(path)) as conn:
        [(count,)] = conn.execute(
            "SELECT COUNT(*) FROM memable_timers WHERE instance_id = ?", (instance_id,)
        ).fetchall()
    return int(count)


def step_rows(path: Path) -> set[str]:
    """The instances that have rows in the steps table."""
    with closing(sqlite3.connect(path)) as conn:
        return {i for (i,) in conn.execute("SELECT DISTINCT instance_id FROM memable_steps")}


# ---------------------------------------------------------------------- list


def test_list_shows_every_instance_oldest_first_with_status_and_message(store: Store) -> None:
    """``list`` prints every stored instance, oldest first, with its workflow, id, status and
    status message."""
    assert listed(os.fspath(store.path)) == INSTANCES


def test_list_shows_creation_and_update_times_to_the_second(store: Store) -> None:
    """``list``'s CREATED and UPDATED columns give the instance's times to the second, from the
    frozen clock the store was made on."""
    rows = table(ok("list", store.path).splitlines())
    first = store.t0.strftime("%Y-%m-%d %H:%M:%S")
    last = store.later.strftime("%Y-%m-%d %H:%M:%S")
    assert (rows[0]["CREATED"], rows[0]["UPDATED"]) == (first, last)


def test_list_filters_by_workflow(store: Store) -> None:
    """``list --workflow`` keeps only the instances of that workflow, in the same order."""
    assert listed(os.fspath(store.path), "--workflow", "approve") == INSTANCES[1:3]


@pytest.mark.parametrize("status", ["running", "suspended", "completed", "failed", "cancelled"])
def test_list_filters_by_each_status(store: Store, status: str) -> None:
    """``list --status`` keeps only the instances in that status, for each of the five statuses
    (none is running here)."""
    expected = [i for i in INSTANCES if i[2] == status]
    assert listed(os.fspath(store.path), "--status", status) == expected
    assert (status == "running") == (expected == [])  # only running has none here


def test_list_filters_by_workflow_and_status_together(store: Store) -> None:
    """``--workflow`` and ``--status`` together keep only the instances that match both."""
    found = listed(os.fspath(store.path), "--workflow", "approve", "--status", "cancelled")
    assert found == [INSTANCES[2]]


def test_list_of_nothing_prints_the_header_alone(store: Store) -> None:
    """A filter that matches nothing prints the header line alone, and ``--json`` an empty
    list."""
    assert ok("list", store.path, "--status", "running").split() == [
        "WORKFLOW", "INSTANCE", "STATUS", "MESSAGE", "OWNER", "AGE", "CREATED", "UPDATED",
    ]
    assert json.loads(ok("list", store.path, "--status", "running", "--json")) == []


def test_list_of_a_workflow_the_store_never_saw_says_so(store: Store) -> None:
    """``list --workflow`` of a name the store never saw prints the header alone and notes on
    stderr that it has no such workflow, suggesting a close name where one exists."""
    out, note = noted("list", store.path, "--workflow", "aprove")
    assert out.split()[0] == "WORKFLOW"
    assert len(out.splitlines()) == 1
    assert note == "the store has no instance of workflow 'aprove'; did you mean 'approve'?"
    out, note = noted("list", store.path, "--workflow", "nobody", "--json")
    assert (json.loads(out), note) == ([], "the store has no instance of workflow 'nobody'")


def test_list_json_gives_one_record_per_instance(store: Store) -> None:
    """``list --json`` gives one record per instance, each with the same fields: times as ISO
    strings, no owner or schedule here, and an age in seconds."""
    records = json.loads(ok("list", store.path, "--json"))
    assert [
        (r["workflow"], r["instance_id"], r["status"], r["message"] or "-") for r in records
    ] == INSTANCES
    assert {frozenset(r) for r in records} == {
        frozenset(
            {"workflow", "instance_id", "status", "message", "status_message", "created_at",
             "updated_at", "completed_at", "schedule", "owner", "age_seconds"}
        )
    }
    assert {r["owner"] for r in records} == {None}  # none is running
    assert {r["schedule"] for r in records} == {None}  # none is a schedule's tick
    assert all(3590 < r["age_seconds"] < 36000 for r in records)  # made an hour ago
    first = records[0]
    assert datetime.fromisoformat(first["created_at"]) == store.t0
    assert datetime.fromisoformat(first["completed_at"]) == store.later
    finished = {r["instance_id"] for r in records if r["completed_at"] is not None}
    assert finished == {"order-7", "order-8", "doc-2"}


def test_list_json_filters_too(store: Store) -> None:
    """``--status`` filters ``list --json`` as it filters the table."""
    records = json.loads(ok("list", store.path, "--status", "suspended", "--json"))
    assert [r["instance_id"] for r in records] == ["doc-1", "cool-1"]


def test_list_refuses_an_unknown_status_with_exit_2(store: Store) -> None:
    """An unknown ``--status`` is a usage error: exit 2, nothing on stdout, the bad value named
    on stderr, and the store left byte for byte as it was."""
    before = snapshot(store.path)
    result = cli("list", store.path, "--status", "sleeping")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "Invalid value for '--status'" in result.stderr
    assert "'sleeping'" in result.stderr
    assert snapshot(store.path) == before


# ---------------------------------------------------------------------- show


def test_show_of_a_completed_instance(store: Store) -> None:
    """``show`` of a completed instance prints its times, input and output and a table of its
    steps with attempts, durations and status messages, and no timers or awaited signals."""
    text = ok("show", store.path, "ship", "order-7")
    lines = text.splitlines()
    assert lines[0] == "ship/order-7: completed"
    assert f"created    {store.t0.isoformat()}" in lines
    assert f"ended      {store.later.isoformat()}" in lines
    assert 'input      {"id": 7, "total": 9.5}' in lines
    assert 'output     {"label": "LBL-7", "stock": "reserved"}' in lines
    steps = section(text, "steps:")
    assert [
        (s["SEQ"], s["KEY"], s["KIND"], s["STATE"], s["ATTEMPTS"], s["DURATION"], s["STATUS"],
         s["ERROR"])
        for s in steps
    ] == [
        ("0", "reserve:v1", "step", "completed", "1", "250.0ms", "reserving stock", "-"),
        ("1", "label:v1", "step", "completed", "1", "1.50s", "printing label", "-"),
    ]
    assert "pending timers:" not in lines
    assert not any(line.startswith("awaiting signals") for line in lines)


def test_show_json_of_a_completed_instance(store: Store) -> None:
    """``show --json`` of a completed instance gives the same facts as the table, with durations
    in seconds and each step's result."""
    view = shown(store, "ship", "order-7")
    assert {k: view[k] for k in ("workflow", "instance_id", "status", "message")} == {
        "workflow": "ship", "instance_id": "order-7", "status": "completed", "message": None,
    }
    assert view["input"] == {"id": 7, "total": 9.5}
    assert view["output"] == {"label": "LBL-7", "stock": "reserved"}
    assert datetime.fromisoformat(view["created_at"]) == store.t0
    assert datetime.fromisoformat(view["completed_at"]) == store.later
    assert [
        (s["seq"], s["key"], s["kind"], s["state"], s["attempts"], s["duration"], s["status"],
         s["error"], s["result"])
        for s in view["steps"]
    ] == [
        (0, "reserve:v1", "step", "completed", 1, 0.25, "reserving stock", None, "reserved"),
        (1, "label:v1", "step", "completed", 1, 1.5, "printing label", None, "LBL-7"),
    ]
    assert (view["timers"], view["awaiting_signals"]) == ([], [])


def test_show_lists_a_signal_not_reached_yet_last_with_no_seq(tmp_path: Path) -> None:
    """A signal stored before the run reached its key has no place in the order yet:
    ``show`` lists it last with SEQ ``-`` (``--json``: seq null), and once the run
    reaches the key, at the place it reached it."""
    path = tmp_path / "db"

    def two(ctx: Context) -> int:
        ctx.step("a").run(lambda: 1)
        first: int = ctx.suspend("first")
        return first + ctx.step("b").run(lambda: 10) + ctx.suspend("second")

    engine = Engine.open(path)
    engine.register("two", two)
    with engine:
        inv = engine.invoke("two", instance_id="t")
        assert isinstance(inv.wait(10), Suspended)
        engine.signal("two", "t", "second", 2)  # waits on "first": kept for later
        steps = section(ok("show", path, "two", "t"), "steps:")
        assert [(s["SEQ"], s["KEY"], s["STATE"]) for s in steps] == [
            ("0", "a", "completed"), ("1", "first", "waiting"), ("-", "second", "completed")]
        view = json.loads(ok("show", path, "two", "t", "--json"))
        assert [(s["seq"], s["key"]) for s in view["steps"]] == [
            (0, "a"), (1, "first"), (None, "second")]
        assert engine.signal("two", "t", "first", 1).result(10) == 13
    steps = section(ok("show", path, "two", "t"), "steps:")
    assert [(s["SEQ"], s["KEY"]) for s in steps] == [
        ("0", "a"), ("1", "first"), ("2", "b"), ("3", "second")]


def test_show_of_a_failed_instance_gives_the_failing_step_and_its_error(store: Store) -> None:
    """``show`` of a failed instance names the failing step and its error in the header line and
    in that step's row; the steps before it are completed with no error."""
    text = ok("show", store.path, "charge", "order-8")
    assert text.splitlines()[0] == (
        "charge/order-8: failed (step 'charge:v1' failed: RuntimeError: card declined)"
    )
    assert "output     -" in text.splitlines()
    steps = {s["KEY"]: s for s in section(text, "steps:")}
    assert (steps["prepare:v1"]["STATE"], steps["prepare:v1"]["ERROR"]) == ("completed", "-")
    failed = steps["charge:v1"]
    assert (failed["STATE"], failed["ATTEMPTS"], failed["ERROR"]) == (
        "failed", "1", "RuntimeError: card declined"
    )

    view = shown(store, "charge", "order-8")
    assert view["message"] == "step 'charge:v1' failed: RuntimeError: card declined"
    assert view["output"] is None
    [failed_step] = [s for s in view["steps"] if s["state"] == "failed"]
    assert (failed_step["key"], failed_step["error"], failed_step["result"]) == (
        "charge:v1", "RuntimeError: card declined", None
    )


def test_show_of_an_instance_suspended_on_a_signal_names_the_key(store: Store) -> None:
    """``show`` of an instance waiting for a signal lists that key as a waiting signal step and
    under "awaiting signals"."""
    text = ok("show", store.path, "approve", "doc-1")
    lines = text.splitlines()
    assert lines[0] == "approve/doc-1: suspended (waiting for a manager)"
    assert "ended      -" in lines
    assert 'input      "report"' in lines
    assert lines[-1] == "awaiting signals: approval:v1"
    assert [(s["KEY"], s["KIND"], s["STATE"], s["ATTEMPTS"]) for s in section(text, "steps:")] == [
        ("draft:v1", "step", "completed", "1"), ("approval:v1", "signal", "waiting", "0"),
    ]

    view = shown(store, "approve", "doc-1")
    assert (view["status"], view["waiting_for"], view["awaiting_signals"], view["timers"]) == (
        "suspended", "approval:v1", ["approval:v1"], []
    )


def test_show_of_an_instance_suspended_on_a_timer_gives_its_due_time(store: Store) -> None:
    """``show`` of an instance sleeping on a durable timer lists the timer with its due time
    (three days on) and awaits no signal."""
    due = store.later + timedelta(days=3)  # three days after the instance was created
    text = ok("show", store.path, "cool", "cool-1")
    assert text.splitlines()[0] == "cool/cool-1: suspended (timer cool-off:v1)"
    assert section(text, "pending timers:") == [{"KEY": "cool-off:v1", "DUE": due.isoformat()}]
    assert not any(line.startswith("awaiting signals") for line in text.splitlines())

    view = shown(store, "cool", "cool-1")
    assert datetime.fromisoformat(view["created_at"]) == store.later
    assert [(t["key"], datetime.fromisoformat(t["due"])) for t in view["timers"]] == [
        ("cool-off:v1", due)
    ]
    assert [(s["key"], s["kind"], s["state"]) for s in view["steps"]] == [
        ("cool-off:v1", "timer", "waiting")
    ]
    assert view["awaiting_signals"] == []


def test_show_of_a_cancelled_instance_lists_no_awaited_signal(store: Store) -> None:
    """doc-2 was cancelled while it waited for approval:v1: it awaits nothing any more.

    A signal to it is refused ("it is cancelled"), so ``show`` should not say it awaits one.
    """
    view = shown(store, "approve", "doc-2")
    assert (view["status"], view["timers"]) == ("cancelled", [])
    assert view["awaiting_signals"] == []
    text = ok("show", store.path, "approve", "doc-2")
    assert not any(line.startswith("awaiting signals") for line in text.splitlines())


# ---------------------------------------------------------------------- signal


def test_signal_stores_the_value_and_the_next_engine_completes_the_instance(
    store: Store,
) -> None:
    """``signal`` stores the value with no engine running and closes the store cleanly; the
    instance stays suspended until the next engine opened on the file completes it with that
    value."""
    assert ok("signal", store.path, "approve", "doc-1", "approval:v1", '"alice"') == (
        "signal approval:v1 stored for approve/doc-1\n"
    )
    assert sidecars(store.path) == []  # the CLI closed the store: WAL checkpointed
    view = shown(store, "approve", "doc-1")
    assert view["status"] == "suspended"  # nobody ran it yet
    assert view["awaiting_signals"] == []
    signal_step = [s for s in view["steps"] if s["key"] == "approval:v1"]
    assert [(s["kind"], s["state"], s["result"]) for s in signal_step] == [
        ("signal", "completed", "alice")
    ]

    engine = Engine.open(store.path)
    engine.register("approve", approve)
    with engine:
        assert engine.invocation("approve", "doc-1").result(timeout=10) == (
            "report approved by alice"
        )
    assert listed(os.fspath(store.path), "--workflow", "approve")[0] == (
        "approve", "doc-1", "completed", "-"
    )
    assert shown(store, "approve", "doc-1")["output"] == "report approved by alice"


def test_signal_takes_any_json_value(store: Store) -> None:
    """``signal`` stores any JSON payload (object, list, null, booleans, non-ASCII text) as
    given."""
    payload = {"name": "Zoë", "level": 2, "tags": ["a", None], "ok": True}
    ok("signal", store.path, "approve", "doc-1", "approval:v1", json.dumps(payload))
    [step] = [s for s in shown(store, "approve", "doc-1")["steps"] if s["key"] == "approval:v1"]
    assert step["result"] == payload


def test_signal_for_a_key_not_reached_yet_is_kept(store: Store) -> None:
    """A signal for a key the instance is not waiting on is stored anyway, with a note on stderr
    that it is kept for when the workflow reaches that key."""
    out, note = noted("signal", store.path, "cool", "cool-1", "later:v1", "42")
    assert out == "signal later:v1 stored for cool/cool-1\n"
    assert note == (
        "cool/cool-1 is not waiting on 'later:v1'; the value is kept for when the "
        "workflow reaches that key"
    )
    view = shown(store, "cool", "cool-1")
    assert [(s["key"], s["kind"], s["state"], s["result"]) for s in view["steps"]] == [
        ("cool-off:v1", "timer", "waiting", None), ("later:v1", "signal", "completed", 42),
    ]


def test_signal_takes_a_negative_number_after_a_double_dash(store: Store) -> None:
    """A negative number given after ``--`` is taken as the JSON payload."""
    ok("signal", store.path, "approve", "doc-1", "approval:v1", "--", "-5")
    [step] = [s for s in shown(store, "approve", "doc-1")["steps"] if s["key"] == "approval:v1"]
    assert step["result"] == -5


@pytest.mark.parametrize("payload", ["-5", "-0.5"])
def test_signal_takes_a_negative_number_as_it_is(store: Store, payload: str) -> None:
    """``-5`` is valid JSON; click must not take it for an unknown option ("No such option")."""
    ok("signal", store.path, "approve", "doc-1", "approval:v1", payload)
    [step] = [s for s in shown(store, "approve", "doc-1")["steps"] if s["key"] == "approval:v1"]
    assert step["result"] == json.loads(payload)


# ---------------------------------------------------------------------- cancel


def test_cancel_of_an_instance_on_a_timer_drops_the_timer(store: Store) -> None:
    """``cancel`` of an instance sleeping on a timer deletes its timer row and marks it
    cancelled with an end time, as an engine then reads it."""
    assert timer_rows(store.path, "cool-1") == 1
    assert ok("cancel", store.path, "cool", "cool-1") == "cancelled cool/cool-1\n"
    assert timer_rows(store.path, "cool-1") == 0
    view = shown(store, "cool", "cool-1")
    assert (view["status"], view["timers"]) == ("cancelled", [])
    assert view["completed_at"] is not None
    assert ("cool", "cool-1", "cancelled", "-") in listed(os.fspath(store.path))

    engine = Engine.open(store.path)  # what an engine reads of it
    try:
        metadata = engine.get_metadata("cool", "cool-1")
        assert metadata is not None
        assert metadata.status == MetadataStatus.Cancelled()
    finally:
        engine.close()


def test_cancel_of_an_instance_waiting_for_a_signal_makes_it_refuse_signals(
    store: Store,
) -> None:
    """Once ``cancel`` has ended an instance waiting for a signal, a ``signal`` to it is refused
    as finished."""
    assert ok("cancel", store.path, "approve", "doc-1") == "cancelled approve/doc-1\n"
    assert listed(os.fspath(store.path), "--status", "cancelled") == [
        ("approve", "doc-1", "cancelled", "-"), INSTANCES[2],
    ]
    message = refused(store.path, "signal", store.path, "approve", "doc-1", "approval:v1", "1")
    assert message == (
        "instance has finished (it is cancelled): workflow 'approve', instance 'doc-1'"
    )


def test_cancel_of_a_failed_instance_works(store: Store) -> None:
    """A failed instance can be cancelled."""
    ok("cancel", store.path, "charge", "order-8")
    assert shown(store, "charge", "order-8")["status"] == "cancelled"


# ---------------------------------------------------------------------- purge


@pytest.mark.parametrize(
    ("age", "purged"),
    [
        ("0s", FINISHED), ("86398s", FINISHED), ("86399s", 0),
        ("1439m", FINISHED), ("1441m", 0),
        ("23h", FINISHED), ("25h", 0),
        ("0.5d", FINISHED), ("2d", 0),
    ],
)
def test_purge_deletes_the_instances_finished_longer_ago_than_the_age(
    store: Store, age: str, purged: int
) -> None:
    """A day after the store was made (its instances finished 1.75 s after t0)."""
    with freeze_time(store.t0 + timedelta(days=1)):
        out = ok("purge", store.path, "--older-than", age)
    assert out == f"purged {purged} finished instances\n"
    left = listed(os.fspath(store.path))
    if purged:
        assert left == [i for i in INSTANCES if i[2] == "suspended"]
        assert step_rows(store.path) == {"doc-1", "cool-1"}
    else:
        assert left == INSTANCES


def test_purge_keeps_what_is_not_finished_and_what_finished_since(store: Store) -> None:
    """``purge --older-than`` counts from when an instance finished: an instance cancelled later
    survives the first purge and goes in a later one, the suspended instance and its timer stay,
    and a purged one is no longer shown."""
    with freeze_time(store.t0 + timedelta(days=10)):
        ok("cancel", store.path, "approve", "doc-1")
    with freeze_time(store.t0 + timedelta(days=20)):
        assert ok("purge", store.path, "--older-than", "15d") == "purged 3 finished instances\n"
        assert listed(os.fspath(store.path)) == [
            ("approve", "doc-1", "cancelled", "-"), INSTANCES[4],
        ]
        assert ok("purge", store.path, "--older-than", "5d") == "purged 1 finished instance\n"
    assert listed(os.fspath(store.path)) == [INSTANCES[4]]
    assert timer_rows(store.path, "cool-1") == 1
    message = refused(store.path, "show", store.path, "ship", "order-7")
    assert message == (
        "no stored instance (the store has no instance of this workflow at all): "
        "workflow 'ship', instance 'order-7'"
    )


# ---------------------------------------------------------------------- refusals


def command(name: str, path: Path) -> list[str | os.PathLike[str]]:
    """A well-formed command acting on ship/order-7 or approve/doc-1 in the store at path."""
    return {
        "list": ["list", path],
        "schedules": ["schedules", path],
        "show": ["show", path, "ship", "order-7"],
        "signal": ["signal", path, "approve", "doc-1", "approval:v1", '"alice"'],
        "cancel": ["cancel", path, "approve", "doc-1"],
        "purge": ["purge", path, "--older-than", "0s"],
    }[name]


COMMANDS = ["list", "schedules", "show", "signal", "cancel", "purge"]


@pytest.mark.parametrize("name", COMMANDS)
def test_a_missing_file_is_refused_and_not_created(tmp_path: Path, name: str) -> None:
    """Every command refuses a path where no file is, exit 2 with "no such file", and creates
    nothing there."""
    path = tmp_path / "nothing.db"
    message = error_line(cli(*command(name, path)))
    assert message == f"no such file: {path}"
    assert list(tmp_path.iterdir()) == []


def write_text(path: Path) -> None:
    path.write_text("id,total\n1,9.5\n")


def write_empty(path: Path) -> None:
    path.write_bytes(b"")


def write_other_database(path: Path) -> None:
    with closing(sqlite3.connect(path)) as conn:
        conn.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        conn.execute("INSERT INTO notes (body) VALUES ('keep me')")
        conn.commit()


@pytest.mark.parametrize("name", COMMANDS)
@pytest.mark.parametrize(
    ("make", "says"),
    [
        (write_text, "is not a SQLite database"),
        (write_empty, "is not a memable store"),
        (write_other_database, "is not a memable store"),
    ],
    ids=["text", "empty", "other-database"],
)
def test_a_file_that_is_not_a_store_is_refused_and_left_as_it_was(
    tmp_path: Path, name: str, make: Callable[[Path], None], says: str
) -> None:
    """Every command refuses a text file, an empty file or another SQLite database, saying it is
    not a store, and leaves the file unchanged with no sidecar created."""
    path = tmp_path / "data.db"
    make(path)
    message = refused(path, *command(name, path))
    assert message.startswith(f"{path} {says}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.db"]


def test_a_directory_is_refused(tmp_path: Path) -> None:
    """A directory given as the store is refused as "not a file" and nothing is written into
    it."""
    assert error_line(cli("list", tmp_path)) == f"not a file: {tmp_path}"
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("name", ["show", "signal", "cancel", "resume", "fork"])
@pytest.mark.parametrize(
    ("workflow", "instance_id"),
    [("approve", "doc-9"), ("shipping", "order-7")],
    ids=["unknown-instance", "unknown-workflow"],
)
def test_an_unknown_instance_or_workflow_is_refused(
    store: Store, name: str, workflow: str, instance_id: str
) -> None:
    """Each command on one instance refuses an id the store lacks, naming the workflow and
    the id asked for, with a guess when no instance of the workflow is stored at all."""
    args = {
        "show": ["show", store.path, workflow, instance_id],
        "signal": ["signal", store.path, workflow, instance_id, "approval:v1", "true"],
        "cancel": ["cancel", store.path, workflow, instance_id],
        "resume": ["resume", store.path, workflow, instance_id],
        "fork": ["fork", store.path, workflow, instance_id],
    }[name]
    message = refused(store.path, *args)
    assert message == (
        f"no stored instance: workflow {workflow!r}, instance {instance_id!r}"
        if workflow == "approve" else
        "no stored instance (the store has no instance of this workflow at all): "
        f"workflow {workflow!r}, instance {instance_id!r}; did you mean 'ship'?"
    )


@pytest.mark.parametrize(
    ("workflow", "instance_id", "status"),
    [("ship", "order-7", "completed"), ("charge", "order-8", "failed"),
     ("approve", "doc-2", "cancelled")],
)
def test_a_signal_to_a_finished_instance_is_refused(
    store: Store, workflow: str, instance_id: str, status: str
) -> None:
    """A signal to a completed, failed or cancelled instance is refused, naming its status,
    workflow and instance."""
    message = refused(
        store.path, "signal", store.path, workflow, instance_id, "approval:v1", '"alice"'
    )
    assert f"it is {status}" in message
    assert f"workflow {workflow!r}, instance {instance_id!r}" in message


@pytest.mark.parametrize(
    ("workflow", "instance_id", "status"),
    [("ship", "order-7", "completed"), ("approve", "doc-2", "cancelled")],
)
def test_a_cancel_of_a_finished_instance_is_refused(
    store: Store, workflow: str, instance_id: str, status: str
) -> None:
    """``cancel`` of a completed or cancelled instance is refused as already finished."""
    message = refused(store.path, "cancel", store.path, workflow, instance_id)
    assert message == (
        f"instance has finished (it is {status}): "
        f"workflow {workflow!r}, instance {instance_id!r}"
    )


def test_a_second_signal_to_the_same_key_is_refused(store: Store) -> None:
    """A second signal to a key that already holds a value is refused and the first value
    stays."""
    ok("signal", store.path, "approve", "doc-1", "approval:v1", '"alice"')
    message = refused(store.path, "signal", store.path, "approve", "doc-1", "approval:v1", '"bob"')
    assert message == (
        "signal rejected (the key already holds a value): "
        "workflow 'approve', instance 'doc-1', step 'approval:v1'"
    )
    [step] = [s for s in shown(store, "approve", "doc-1")["steps"] if s["key"] == "approval:v1"]
    assert step["result"] == "alice"


@pytest.mark.parametrize(
    ("workflow", "instance_id", "key", "kind"),
    [("approve", "doc-1", "draft:v1", "step"), ("cool", "cool-1", "cool-off:v1", "timer")],
)
def test_a_signal_to_a_step_or_timer_key_is_refused(
    store: Store, workflow: str, instance_id: str, key: str, kind: str
) -> None:
    """A signal to the key of a step or a timer is refused, saying which kind the key is."""
    message = refused(store.path, "signal", store.path, workflow, instance_id, key, "1")
    assert message == (
        f"signal rejected (the key is a {kind}, not a suspend point): "
        f"workflow {workflow!r}, instance {instance_id!r}, step {key!r}"
    )


@pytest.mark.parametrize("payload", ["{bad", "", "alice", "[1, 2"])
def test_a_payload_that_is_not_json_is_refused(store: Store, payload: str) -> None:
    """A payload that does not parse as JSON is refused, quoting it."""
    message = refused(
        store.path, "signal", store.path, "approve", "doc-1", "approval:v1", payload
    )
    assert message.startswith("the payload is not JSON (")
    assert message.endswith(f"): {payload!r}")


@pytest.mark.parametrize("payload", ["NaN", "[1, Infinity]", '{"low": -Infinity}', "1e400"])
def test_a_json_payload_memable_cannot_store_is_refused(store: Store, payload: str) -> None:
    """JSON that memable cannot store (NaN, infinities, a number too large for a float) is
    refused, naming the instance and key."""
    message = refused(
        store.path, "signal", store.path, "approve", "doc-1", "approval:v1", payload
    )
    assert message.startswith("cannot store a value")
    assert "workflow 'approve', instance 'doc-1', step 'approval:v1'" in message


@pytest.mark.parametrize("key", ["_approval", ""])
def test_an_invalid_key_is_refused(store: Store, key: str) -> None:
    """A signal key that is not a valid key (empty, or starting with an underscore) is
    refused."""
    message = refused(store.path, "signal", store.path, "approve", "doc-1", key, "true")
    assert message.startswith(f"invalid key {key!r}")


@pytest.mark.parametrize("age", ["3x", "-1d", "d", "", "10", "1w", "1.5.5d", "1 d"])
def test_a_bad_duration_is_refused(store: Store, age: str) -> None:
    """``purge --older-than`` refuses anything that is not a number and one of the units s, m,
    h, d, with an example of the form."""
    message = refused(store.path, "purge", store.path, "--older-than", age)
    assert message == f"--older-than: {age!r} is not a duration like 90s, 15m, 12h or 30d"


def test_a_purge_age_beyond_the_calendar_is_not_a_crash(store: Store) -> None:
    """1,000,000 days reach back before year 1: exit 2 with a message (or purge nothing),
    never a traceback."""
    before = snapshot(store.path)
    result = cli("purge", store.path, "--older-than", "1000000d")
    if result.exit_code == 0:
        assert result.stdout == "purged 0 finished instances\n"
    else:
        assert "--older-than" in error_line(result)
    assert snapshot(store.path) == before


def test_purge_without_an_age_is_a_usage_error(store: Store) -> None:
    """``purge`` without ``--older-than`` is a usage error (exit 2) and deletes nothing."""
    before = snapshot(store.path)
    result = cli("purge", store.path)
    assert result.exit_code == 2
    assert "Missing option '--older-than'" in result.stderr
    assert snapshot(store.path) == before


# ---------------------------------------------------------------------- a live engine


def test_a_running_engine_acts_on_a_signal_from_the_cli(store: Store) -> None:
    """An engine running on the file picks up a signal the CLI stores and completes the waiting
    instance with it."""
    engine = Engine.open(store.path, poll_interval=0.05)
    engine.register("approve", approve)
    engine.start()
    try:
        invocation = engine.invocation("approve", "doc-1")
        ok("signal", store.path, "approve", "doc-1", "approval:v1", '"carol"')
        assert invocation.result(timeout=10) == "report approved by carol"
    finally:
        engine.close()
    assert shown(store, "approve", "doc-1")["status"] == "completed"


def test_a_running_instance_is_listed_kept_by_purge_and_stopped_by_cancel(store: Store) -> None:
    """The store's finished instances are an hour old on the wall clock: purge 0s takes them."""
    entered, release = threading.Event(), threading.Event()

    def hold() -> str:
        entered.set()
        release.wait(10)
        return "held"

    def held(ctx: Context) -> str:
        return ctx.step("hold:v1").run(hold)

    engine = Engine.open(store.path, poll_interval=0.05)
    engine.register("held", held)
    engine.start()
    try:
        try:
            invocation = engine.invoke("held", instance_id="busy-1")
            assert entered.wait(10)
            assert listed(os.fspath(store.path), "--status", "running") == [
                ("held", "busy-1", "running", "-")
            ]
            assert ok("purge", store.path, "--older-than", "0s") == (
                f"purged {FINISHED} finished instances\n"
            )
            assert {(w, i, s) for w, i, s, _ in listed(os.fspath(store.path))} == {
                ("held", "busy-1", "running"), ("approve", "doc-1", "suspended"),
                ("cool", "cool-1", "suspended"),
            }
            assert ok("cancel", store.path, "held", "busy-1") == "cancelled held/busy-1\n"
        finally:
            release.set()
        # The step in flight finishes and is stored; the run ends Cancelled.
        assert invocation.wait(timeout=10) == Cancelled()
        assert [(s.key, s.state, s.result) for s in engine.steps("held", "busy-1")] == [
            ("hold:v1", "completed", "held")
        ]
    finally:
        engine.close()


# ---------------------------------------------------------------------- the program


def run_memable(*args: str | os.PathLike[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m memable ARGS`` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "memable", *map(os.fspath, args)],
        cwd=cwd, capture_output=True, text=True, timeout=60, check=False,
    )


def test_python_m_memable_lists_signals_and_refuses(store: Store, tmp_path: Path) -> None:
    """``python -m memable`` in a process of its own lists, signals and refuses a missing file
    with exit 2 and one error line, as the in-process CLI does."""
    listing = run_memable("list", store.path, "--json", cwd=tmp_path)
    assert (listing.returncode, listing.stderr) == (0, "")
    records = json.loads(listing.stdout)
    assert [(r["workflow"], r["instance_id"], r["status"]) for r in records] == [
        i[:3] for i in INSTANCES
    ]

    signalled = run_memable(
        "signal", store.path, "approve", "doc-1", "approval:v1", '"dave"', cwd=tmp_path
    )
    assert (signalled.returncode, signalled.stdout, signalled.stderr) == (
        0, "signal approval:v1 stored for approve/doc-1\n", "",
    )
    [step] = [s for s in shown(store, "approve", "doc-1")["steps"] if s["key"] == "approval:v1"]
    assert step["result"] == "dave"

    missing = tmp_path / "missing.db"
    refusal = run_memable("show", missing, "approve", "doc-1", cwd=tmp_path)
    assert (refusal.returncode, refusal.stdout, refusal.stderr) == (
        2, "", f"memable: error: no such file: {missing}\n",
    )
    assert not missing.exists()


def test_help_names_every_command_and_version_is_the_package_version() -> None:
    """``--help`` lists every command, and ``--version`` prints the package's version."""
    help_text = ok("--help")
    for name in ("demo", "list", "schedules", "show", "signal", "cancel", "purge", "worker"):
        assert re.search(rf"^\s+{name}\s", help_text, re.MULTILINE), name
    assert memable.__version__ in ok("--version")


def test_demo_fails_then_resumes_and_can_run_again(tmp_path: Path) -> None:
    """`demo` twice on one store: each run completes a new instance after one resume.

    Each run's lines come in step order: on the resume, fetch:v1 is reported
    served from the store before charge:v1 executes.
    """
    path = tmp_path / "demo.db"
    first, second = ok("demo", "--db", path), ok("demo", "--db", path)
    for output in (first, second):
        assert "ended failed: step 'charge:v1' failed" in output
        assert "the demo went as it should" in output
        run_1, run_2 = output.split("run 2: resume the same instance\n")
        steps = r"^  (\S+:v1) +(executing|served from the store)"
        assert re.findall(steps, run_1, re.M) == [
            ("fetch:v1", "executing"), ("charge:v1", "executing"),
        ]
        assert re.findall(steps, run_2, re.M) == [
            ("fetch:v1", "served from the store"), ("charge:v1", "executing"),
        ]
    assert "(1 earlier demo instances)" in second
    records = json.loads(ok("list", path, "--json"))
    assert [(r["workflow"], r["status"]) for r in records] == [("checkout", "completed")] * 2
    steps = json.loads(ok("show", path, "checkout", records[0]["instance_id"], "--json"))["steps"]
    assert [(s["key"], s["attempts"]) for s in steps] == [("fetch:v1", 1), ("charge:v1", 2)]
