"""The command line of schedules: ``memable schedules`` and ``memable list --schedule``, on
a file and PostgreSQL, over ticks that real engines fired under a frozen clock.

On PostgreSQL the commands get a URL with a password, which no output may show.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
from click.testing import Result
from freezegun import freeze_time
from helpers import cli, write

from memable import Context, Engine, Suspended
from memable._postgres.schema import parse

TIMEOUT = 10.0
PASSWORD = "pw-not-printed"
HEADER = ["SCHEDULE", "CRON", "ZONE", "WORKFLOW", "LAST", "NEXT", "SKIPPED", "MISSED",
          "DECLARED"]


def _with_password(url: str) -> str:
    """``url`` with its user given ``PASSWORD`` (trust authentication ignores it)."""
    params = parse(url)
    user = params.get("user", "postgres")
    host, port = params.get("host", "127.0.0.1"), params.get("port", "5432")
    return f"postgresql://{user}:{PASSWORD}@{host}:{port}/{params.get('dbname', 'test')}"


def run(store: dict[str, Any], command: str, *args: str) -> Result:
    """``memable COMMAND DB ARGS`` on the shared store (a URL with a password and --schema on
    PostgreSQL); the password shows nowhere."""
    if "schema" in store:
        result = cli(command, _with_password(str(store["target"])), *args,
                     "--schema", store["schema"])
    else:
        result = cli(command, store["target"], *args)
    assert PASSWORD not in result.stdout + result.stderr
    return result


def ok(store: dict[str, Any], command: str, *args: str) -> str:
    """The stdout of a command that must succeed, and say nothing on stderr."""
    result = run(store, command, *args)
    assert (result.exit_code, result.stderr) == (0, ""), result.output
    return result.stdout


def table(store: dict[str, Any]) -> dict[str, dict[str, str]]:
    """The rows ``memable schedules`` prints, by schedule name, each keyed by its header.

    The columns are aligned: each starts where its header starts.
    """
    header, *lines = ok(store, "schedules").splitlines()
    assert header.split() == HEADER
    starts = [header.index(name) for name in HEADER]
    rows = {}
    for line in lines:
        cells = [line[a:b].strip() for a, b in zip(starts, [*starts[1:], None], strict=True)]
        assert all(cells), line  # every cell has a value ("-" for none), in its column
        rows[cells[0]] = dict(zip(HEADER, cells, strict=True))
    return rows


def records(store: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``memable schedules --json``, by schedule name (the list is by name)."""
    found = json.loads(ok(store, "schedules", "--json"))
    assert [r["name"] for r in found] == sorted(r["name"] for r in found)
    return {r["name"]: r for r in found}


def ticks(store: dict[str, Any], *args: str) -> list[str]:
    """The instance ids ``memable list ARGS --json`` lists, oldest first; the table lists
    the same."""
    listed = [r["instance_id"] for r in json.loads(ok(store, "list", *args, "--json"))]
    _, *rows = ok(store, "list", *args).splitlines()
    assert [re.split(r" {2,}", row)[1] for row in rows] == listed
    return listed


def _wf(ctx: Context) -> str:
    return ctx.instance_id


def _hourly(open_shared: Callable[..., Engine], **options: Any) -> Engine:
    """An engine that runs ``wf`` and declares ``hourly`` on it (options: the schedule's)."""
    engine = open_shared(lease=3600)  # the frozen clock moves an hour and more
    engine.register("wf", _wf)
    engine.schedule("hourly", "0 * * * *", "wf", **options)
    return engine


def _fire(engine: Engine, instance_id: str) -> None:
    """Fire what is due now; the tick ``instance_id`` completes."""
    engine.fire_due_timers()
    assert engine.invocation("wf", instance_id).result(timeout=TIMEOUT) == instance_id


# ---------------------------------------------------------------------- schedules


def test_each_schedule_shows_its_declaration_last_tick_and_next_tick(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """The next tick is computed in the schedule's zone (02:00 in Paris is 00:00 UTC in
    June), after now, the last tick and when the schedule began counting, whichever is
    latest (the command may run on a machine whose clock is behind the engines')."""
    engine = _hourly(open_shared)
    engine.schedule("nightly", "0 2 * * *", "wf", timezone="Europe/Paris")
    engine.schedule("quarter", "15 * * * *", "wf")
    with freeze_time("2026-06-01 09:59:00") as clock:
        engine.start()
        before = table(shared_store)
        clock.tick(60)
        _fire(engine, "hourly@2026-06-01T10:00:00Z")
        after, as_json = table(shared_store), records(shared_store)
        clock.move_to("2026-06-01 09:00:00")  # behind the last tick, and the declaration
        set_back = table(shared_store)
    assert {name: before[name] for name in ("hourly", "nightly")} == {
        "hourly": dict(zip(HEADER, [
            "hourly", "0 * * * *", "UTC", "wf", "-", "2026-06-01T10:00:00Z", "0", "0",
            "by 1 engine"], strict=True)),
        "nightly": dict(zip(HEADER, [
            "nightly", "0 2 * * *", "Europe/Paris", "wf", "-", "2026-06-02T00:00:00Z", "0",
            "0", "by 1 engine"], strict=True)),
    }
    assert (after["hourly"]["LAST"], after["hourly"]["NEXT"]) == (
        "2026-06-01T10:00:00Z", "2026-06-01T11:00:00Z")
    assert after["nightly"] == before["nightly"]
    assert before["quarter"]["NEXT"] == after["quarter"]["NEXT"] == "2026-06-01T10:15:00Z"
    assert {name: as_json[name] for name in ("hourly", "nightly")} == {
        "hourly": {
            "name": "hourly", "cron": "0 * * * *", "timezone": "UTC", "workflow": "wf",
            "last_tick": "2026-06-01T10:00:00Z", "next_tick": "2026-06-01T11:00:00Z",
            "since": "2026-06-01T09:59:00+00:00", "skipped": 0, "missed": 0,
            "declared": True, "engines": 1,
        },
        "nightly": {
            "name": "nightly", "cron": "0 2 * * *", "timezone": "Europe/Paris",
            "workflow": "wf", "last_tick": None, "next_tick": "2026-06-02T00:00:00Z",
            "since": "2026-06-01T09:59:00+00:00", "skipped": 0, "missed": 0,
            "declared": True, "engines": 1,
        },
    }
    assert set_back["hourly"]["NEXT"] == "2026-06-01T11:00:00Z"  # not 10:00, fired already
    assert set_back["quarter"]["NEXT"] == "2026-06-01T10:15:00Z"  # not 09:15, before 09:59
    assert set_back["nightly"]["NEXT"] == "2026-06-02T00:00:00Z"


def test_a_schedule_no_running_engine_declares_is_marked_not_declared(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """Judged by what the live engines declare: a running engine that does not declare the
    schedule does not count; one that stopped no longer does."""
    first, second = _hourly(open_shared), _hourly(open_shared)
    bystander = open_shared()
    bystander.register("wf", _wf)
    with freeze_time("2026-06-01 09:59:00"):
        first.start()
        second.start()
        bystander.start()
        both = table(shared_store)["hourly"]["DECLARED"]
        first.stop()
        one = table(shared_store)["hourly"]["DECLARED"], records(shared_store)["hourly"]
        second.stop()
        none = table(shared_store)["hourly"]["DECLARED"], records(shared_store)["hourly"]
    assert both == "by 2 engines"
    assert (one[0], one[1]["declared"], one[1]["engines"]) == ("by 1 engine", True, 1)
    assert (none[0], none[1]["declared"], none[1]["engines"]) == ("not declared", False, 0)
    # What the store holds of it stays: only the live engines' declarations changed.
    assert (none[1]["cron"], none[1]["next_tick"]) == ("0 * * * *", "2026-06-01T10:00:00Z")


def test_ticks_missed_while_no_engine_ran_are_counted(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """An engine fires 10:00 and closes; at 13:30 another, with catch_up="none", passes over
    11:00, 12:00 and 13:00: three missed, the last tick 13:00, and none of them listed."""
    first = _hourly(open_shared)
    with freeze_time("2026-06-01 09:59:00") as clock:
        first.start()
        clock.tick(60)
        _fire(first, "hourly@2026-06-01T10:00:00Z")
        first.close()
        down = table(shared_store)["hourly"]
        clock.move_to("2026-06-01 13:30:00")
        second = _hourly(open_shared, catch_up="none")
        second.start()
        second.fire_due_timers()
        caught_up, as_json = table(shared_store)["hourly"], records(shared_store)["hourly"]
        listed = ticks(shared_store, "--schedule", "hourly")
    assert (down["LAST"], down["MISSED"], down["DECLARED"]) == (
        "2026-06-01T10:00:00Z", "0", "not declared")
    assert [caught_up[c] for c in ("LAST", "NEXT", "SKIPPED", "MISSED", "DECLARED")] == [
        "2026-06-01T13:00:00Z", "2026-06-01T14:00:00Z", "0", "3", "by 1 engine"]
    assert (as_json["missed"], as_json["skipped"], as_json["declared"]) == (3, 0, True)
    assert listed == ["hourly@2026-06-01T10:00:00Z"]


def test_ticks_skipped_while_an_earlier_tick_has_not_ended_are_counted(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """overlap="skip": the 10:00 tick waits on a signal, so 11:00 is skipped (not run, not
    missed); once 10:00 ended, 12:00 runs and the count stays."""
    engine = open_shared(lease=3600)
    engine.register("wait", lambda ctx: ctx.suspend("go"))
    engine.schedule("hourly", "0 * * * *", "wait", overlap="skip")
    first = "hourly@2026-06-01T10:00:00Z"
    with freeze_time("2026-06-01 09:59:00") as clock:
        engine.start()
        clock.tick(60)
        engine.fire_due_timers()
        assert engine.invocation("wait", first).wait(timeout=TIMEOUT) == Suspended("go")
        clock.tick(3600)
        engine.fire_due_timers()
        skipping = table(shared_store)["hourly"], records(shared_store)["hourly"]
        listed = ticks(shared_store, "--schedule", "hourly")
        engine.signal("wait", first, "go", "done")
        assert engine.invocation("wait", first).result(timeout=TIMEOUT) == "done"
        clock.tick(3600)
        engine.fire_due_timers()
        third = "hourly@2026-06-01T12:00:00Z"
        assert engine.invocation("wait", third).wait(timeout=TIMEOUT) == Suspended("go")
        later = table(shared_store)["hourly"]
        listed_later = ticks(shared_store, "--schedule", "hourly")
    text, as_json = skipping
    assert [text[c] for c in ("LAST", "NEXT", "SKIPPED", "MISSED")] == [
        "2026-06-01T11:00:00Z", "2026-06-01T12:00:00Z", "1", "0"]
    assert (as_json["skipped"], as_json["missed"]) == (1, 0)
    assert listed == [first]
    assert [later[c] for c in ("LAST", "NEXT", "SKIPPED", "MISSED")] == [
        "2026-06-01T12:00:00Z", "2026-06-01T13:00:00Z", "1", "0"]
    assert listed_later == [first, third]


def test_a_store_without_schedules_says_so(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """``memable schedules`` on a store where no engine declared a schedule says there are none
    (``--json``: an empty list)."""
    engine = open_shared()
    engine.register("wf", _wf)
    with engine:
        assert engine.invoke("wf", instance_id="by-hand").result(timeout=TIMEOUT) == "by-hand"
    assert ok(shared_store, "schedules") == (
        "no schedules: no engine has declared one on this store\n")
    assert json.loads(ok(shared_store, "schedules", "--json")) == []


def test_a_next_tick_that_cannot_be_computed_is_a_dash_and_a_note(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """A stored zone this machine does not know (its zone data is older than the engine's,
    say): the listing goes on, with no next tick, and says why on stderr."""
    engine = _hourly(open_shared)
    with freeze_time("2026-06-01 09:59:00"):
        engine.start()
        engine.stop()
    write(engine, "UPDATE memable_schedules SET timezone = ? WHERE name = ?",
          ("Mars/Olympus", "hourly"))
    result = run(shared_store, "schedules")
    assert result.exit_code == 0, result.output
    assert result.stderr.startswith(
        "memable: note: schedule 'hourly': no next tick: timezone 'Mars/Olympus' is not a "
        "zone this system knows")
    _, row = result.stdout.splitlines()
    assert re.split(r" {2,}", row)[:6] == ["hourly", "0 * * * *", "Mars/Olympus", "wf", "-", "-"]
    as_json = json.loads(run(shared_store, "schedules", "--json").stdout)
    assert [r["next_tick"] for r in as_json] == [None]


# ---------------------------------------------------------------------- list --schedule


def test_list_schedule_lists_exactly_the_ticks_of_that_schedule(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any],
) -> None:
    """Two schedules and an instance invoked by hand: each schedule lists its own ticks,
    with the other filters too; the JSON records name the schedule of each."""
    engine = _hourly(open_shared)
    engine.register("other", _wf)
    engine.schedule("half", "30 * * * *", "other")
    with freeze_time("2026-06-01 09:59:00") as clock:
        engine.start()
        assert engine.invoke("wf", instance_id="by-hand").result(timeout=TIMEOUT) == "by-hand"
        clock.tick(60)
        _fire(engine, "hourly@2026-06-01T10:00:00Z")
        clock.tick(30 * 60)
        engine.fire_due_timers()
        half = "half@2026-06-01T10:30:00Z"
        assert engine.invocation("other", half).result(timeout=TIMEOUT) == half
        clock.tick(30 * 60)
        _fire(engine, "hourly@2026-06-01T11:00:00Z")
        # Stopped inside the frozen time: a running engine's next look, at the real
        # time, would fire a tick of "now" and the lists below would show it.
        engine.stop()
    hourly = ["hourly@2026-06-01T10:00:00Z", "hourly@2026-06-01T11:00:00Z"]
    assert ticks(shared_store, "--schedule", "hourly") == hourly
    assert ticks(shared_store, "--schedule", "half") == [half]
    assert ticks(shared_store) == ["by-hand", hourly[0], half, hourly[1]]
    assert ticks(shared_store, "--schedule", "hourly", "--workflow", "wf") == hourly
    assert ticks(shared_store, "--schedule", "hourly", "--status", "completed") == hourly
    assert ticks(shared_store, "--schedule", "hourly", "--status", "failed") == []
    assert ticks(shared_store, "--schedule", "half", "--workflow", "wf") == []
    schedules = {r["instance_id"]: r["schedule"]
                 for r in json.loads(ok(shared_store, "list", "--json"))}
    assert schedules == {"by-hand": None, hourly[0]: "hourly", half: "half",
                         hourly[1]: "hourly"}


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_list_of_a_schedule_the_store_does_not_know_says_so(
    open_shared: Callable[..., Engine], shared_store: dict[str, Any], as_json: bool,
) -> None:
    """``list --schedule`` of a name the store does not know prints an empty listing with a note
    suggesting the close name, in text and JSON; a known schedule with no tick yet lists
    nothing, with no note."""
    engine = _hourly(open_shared)
    with freeze_time("2026-06-01 09:59:00"):
        engine.start()
        engine.stop()
    result = run(shared_store, "list", "--schedule", "hourli", *(["--json"] if as_json else []))
    assert result.exit_code == 0, result.output
    assert result.stderr == (
        "memable: note: the store has no schedule 'hourli'; did you mean 'hourly'?\n")
    if as_json:
        assert json.loads(result.stdout) == []
    else:
        assert result.stdout.split() == [
            "WORKFLOW", "INSTANCE", "STATUS", "MESSAGE", "OWNER", "AGE", "CREATED", "UPDATED"]
    # A schedule the store knows, with no tick yet: an empty listing, no note.
    assert ticks(shared_store, "--schedule", "hourly") == []


# ---------------------------------------------------------------------- refusals


def test_schedules_on_a_postgresql_schema_without_a_store_exits_2(pg_schema: str) -> None:
    """``schedules`` and ``list --schedule`` on a PostgreSQL schema holding no memable store
    exit 2 with one error naming the schema, and print nothing."""
    from conftest import POSTGRES_URL

    store = {"target": POSTGRES_URL, "schema": pg_schema}
    for args in (["schedules"], ["schedules", "--json"], ["list", "--schedule", "hourly"]):
        result = run(store, *args)
        assert (result.exit_code, result.stdout) == (2, ""), result.output
        assert result.stderr.startswith("memable: error: ")
        assert f"has no memable store in schema {pg_schema!r}" in result.stderr
