"""The ``memable`` command line (also ``python -m memable``).

Every command but ``demo`` and ``worker`` acts on an existing store with no engine: what it
writes is acted on by an engine on the store within its poll interval, or by the next to start.
An error prints one line on stderr and exits 2 with the store as it was."""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any, NoReturn, TypeVar

import click

from .._clock import SYSTEM_CLOCK, iso_utc, utc
from .._errors import EngineError, InstanceNotFound, StorageError
from .._inspect import (
    CUT,
    STATUSES,
    did_you_mean,
    known_queues,
    limits_text,
    list_instances,
    list_queues,
    list_schedules,
    open_existing,
    raise_unknown,
    show_instance,
)
from .._store.admin import (
    cancel_instance,
    fork_instance,
    pause_queue,
    purge_finished,
    resume_failed,
    resume_instance,
    resume_queue,
    store_signal,
)
from .._store.operator import OperatorStore
from .._store.protocol import Store
from .demo import run_demo
from .worker import load_engine, run_worker

T = TypeVar("T")

CLOCK = SYSTEM_CLOCK  # no engine here: dates, ages and liveness by the system's clocks
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_SCHEMA = click.option("--schema", metavar="NAME",
    help="PostgreSQL only: the schema that holds the store (default: memable).")


def _instance(command: Callable[..., None]) -> Callable[..., None]:
    """The arguments DB WORKFLOW ID that name one instance of a store."""
    for argument in reversed((click.argument("db"), click.argument("workflow"),
                              click.argument("instance_id", metavar="ID"))):
        command = argument(command)
    return command


def _fail(message: str) -> NoReturn:
    click.echo(f"memable: error: {message}", err=True)
    sys.exit(2)


@contextmanager
def _store(target: str, schema: str | None) -> Iterator[Store]:
    """The store ``target`` names; an EngineError on the way is reported, exit 2."""
    try:
        store = open_existing(target, schema)
        try:
            yield store
        finally:
            store.close()
    except EngineError as err:
        _fail(str(err))


def _act_on(
    target: str, schema: str | None, workflow: str, instance_id: str, act: Callable[[Store], T],
) -> T:
    """``act(store)`` on an instance of the store ``target``; an unknown one: exit 2."""
    with _store(target, schema) as store:
        try:
            return act(store)
        except InstanceNotFound:
            raise_unknown(store, workflow, instance_id)


def _duration(text: str) -> float:
    found = re.fullmatch(r"(\d+(?:\.\d+)?)([smhd])", text.strip())
    if found is None:
        raise click.BadParameter(f"{text!r} is not a duration like 90s, 15m, 12h or 30d")
    return float(found[1]) * _UNITS[found[2]]


def _short_time(iso: str | None) -> str:
    """An ISO timestamp to the second, for tables; '-' for none."""
    return "-" if iso is None else iso[:19].replace("T", " ")


def _table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    cells = [[str(h) for h in headers]] + [["-" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)


def _records(
    found: list[dict[str, Any]], as_json: bool, empty: str | None, headers: list[str],
    row: Callable[[dict[str, Any]], list[object]],
) -> None:
    """Print ``found`` as JSON, or as a table, a ``row`` each (``empty``, if given, for none)."""
    if as_json:
        click.echo(_json(found))
    elif empty is not None and not found:
        click.echo(empty)
    else:
        click.echo(_table(headers, [row(record) for record in found]))


def _guess(name: str, names: list[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest of ``names``, or ``""``."""
    hint = did_you_mean(name, names)
    return f"; {hint}" if hint else ""


@click.group()
@click.version_option(package_name="memable-engine")
def main() -> None:
    """memable: durable execution for plain synchronous Python."""


@main.command()
@click.option("--db", "path", default="memable-demo.db", show_default=True,
              help="Store to run the demo on (created if missing).")
def demo(path: str) -> None:
    """Run a workflow whose second step fails once, then resume it."""
    try:
        code = run_demo(path, click.echo)
    except StorageError as err:  # a store it cannot open: one line, exit 2
        _fail(str(err))
    raise SystemExit(code)


@main.command("list")
@click.argument("db")
@click.option("--workflow", help="Only instances of this workflow.")
@click.option("--status", type=click.Choice(STATUSES), help="Only instances in this status.")
@click.option("--schedule", metavar="NAME", help="Only the ticks of this schedule.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON records instead of a table.")
@_SCHEMA
def list_command(
    db: str, workflow: str | None, status: str | None, schedule: str | None, as_json: bool,
    schema: str | None,
) -> None:
    """List the instances in the store DB, oldest first."""
    with _store(db, schema) as store:
        found = list_instances(store, workflow, status, schedule, clock=CLOCK)
        names = store.workflows() if workflow is not None and not found else []
        known = [s.name for s in store.schedules()] if schedule is not None and not found else []
    if workflow is not None and not found and workflow not in names:
        _note(f"the store has no instance of workflow {workflow!r}{_guess(workflow, names)}")
    if schedule is not None and not found and schedule not in known:
        _note(f"the store has no schedule {schedule!r}{_guess(schedule, known)}")
    _records(found, as_json, None, [
        "WORKFLOW", "INSTANCE", "STATUS", "MESSAGE", "OWNER", "AGE", "CREATED", "UPDATED",
    ], lambda i: [
        i["workflow"], i["instance_id"], i["status"],
        i["status_message"] if i["status"] == "running" else i["message"],
        _owner_cell(i["owner"]), _age(i["age_seconds"]),
        _short_time(i["created_at"]), _short_time(i["updated_at"]),
    ])


@main.command()
@click.argument("db")
@click.option("--json", "as_json", is_flag=True, help="Print JSON records instead of a table.")
@_SCHEMA
def schedules(db: str, as_json: bool, schema: str | None) -> None:
    """List the schedules in the store DB: cron, zone, workflow, last and next tick, ticks
    skipped and missed, and whether a running engine declares each."""
    with _store(db, schema) as store:
        found, notes = list_schedules(store, clock=CLOCK)
    for note in notes:
        _note(note)
    _records(found, as_json, "no schedules: no engine has declared one on this store", [
        "SCHEDULE", "CRON", "ZONE", "WORKFLOW", "LAST", "NEXT", "SKIPPED", "MISSED", "DECLARED",
    ], lambda s: [
        s["name"], s["cron"], s["timezone"], s["workflow"], s["last_tick"], s["next_tick"],
        s["skipped"], s["missed"], _declared_cell(s["engines"]),
    ])


def _declared_cell(engines: int) -> str:
    """How many running engines declare a schedule; none fires its ticks when none does."""
    return f"by {engines} engine{'' if engines == 1 else 's'}" if engines else "not declared"


@main.command("queues")
@click.argument("db")
@click.option("--json", "as_json", is_flag=True, help="Print JSON records instead of a table.")
@_SCHEMA
def queues_command(db: str, as_json: bool, schema: str | None) -> None:
    """List the queues of the store DB: queued and running instances, whether each is
    paused, its limits and how many running engines consume it."""
    with _store(db, schema) as store:
        found = list_queues(store, clock=CLOCK)
    empty = "no queues: no instance is on one, no running engine consumes one, and none is paused"
    _records(found, as_json, empty, [
        "QUEUE", "QUEUED", "RUNNING", "PAUSED", "OLDEST", "LIMITS", "ENGINES",
    ], lambda q: [
        q["name"], q["queued"], q["running"],
        f"since {_short_time(q['paused_at'])}" if q["paused"] else "no",
        _short_time(q["oldest_queued_at"]), limits_text(q["limits"]), q["engines"],
    ])


@main.group("queue")
def queue_group() -> None:
    """Pause or resume a queue of a store."""


def _known_queue(store: OperatorStore, name: str) -> None:
    """Exit 2, naming the closest, unless the store knows the queue ``name``."""
    names = known_queues(store, clock=CLOCK)
    if name not in names:
        _fail(f"the store knows no queue {name!r} (no instance is on it, no running engine "
              f"consumes it){_guess(name, names)}")


@queue_group.command("pause")
@click.argument("db")
@click.argument("name")
@_SCHEMA
def queue_pause(db: str, name: str, schema: str | None) -> None:
    """Pause the queue NAME: no engine on the store starts another of its instances until
    it is resumed. Invokes onto it are still stored queued; runs in flight finish."""
    with _store(db, schema) as store:
        _known_queue(store, name)
        changed = pause_queue(store, name, clock=CLOCK)
    click.echo(f"queue {name} paused: no engine starts another of its instances until "
               "'memable queue resume' (runs in flight finish)" if changed
               else f"queue {name} is paused already")


@queue_group.command("resume")
@click.argument("db")
@click.argument("name")
@_SCHEMA
def queue_resume(db: str, name: str, schema: str | None) -> None:
    """Resume the paused queue NAME: the engines that consume it start its queued
    instances again, in their order."""
    with _store(db, schema) as store:
        _known_queue(store, name)
        changed = resume_queue(store, name, clock=CLOCK)
    click.echo(f"queue {name} resumed: the engines that consume it start its queued "
               "instances (on PostgreSQL at once, on a file within their poll interval)"
               if changed else f"queue {name} is not paused: nothing to resume")


def _owner_cell(owner: dict[str, Any] | None) -> str | None:
    """``host:pid`` of a running instance's owner, marked ``(dead)`` when it is."""
    if owner is None:
        return None
    if owner["host"] is None:  # its owner row is gone: the engine stopped or was reaped
        return "(dead)"
    return f"{owner['host']}:{owner['pid']}" + ("" if owner["alive"] else " (dead)")


def _age(seconds: float) -> str:
    """A coarse age for tables: 45s, 12m, 5h, 3d."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{max(0, int(seconds))}s"


def _note(message: str) -> None:
    click.echo(f"memable: note: {message}", err=True)


def _seconds(duration: float | None) -> str | None:
    if duration is None:
        return None
    return f"{duration * 1000:.1f}ms" if duration < 1 else f"{duration:.2f}s"


def _owner_text(owner: dict[str, Any]) -> str:
    if owner["judged_by"] == "gone":
        return f"engine {owner['id']} (dead: its owner row is gone)"
    state = "alive" if owner["alive"] else "dead"
    how = ("its pid" if owner["judged_by"] == "pid"
        else f"its lease, which {'ends' if owner['alive'] else 'ended'} {owner['lease_ends']}")
    return f"{owner['host']} pid {owner['pid']} ({state}, judged by {how})"


def _show_text(view: dict[str, Any]) -> str:
    cut = view["cut"]

    def value(place: str, shown: str) -> str:
        if place not in cut:
            return shown
        return f"{shown}… (cut: {cut[place]:,} characters; --full prints them all)"

    def json_value(place: str, data: Any) -> str:
        if place in cut:  # already the start of its JSON text
            return value(place, data)
        return "-" if data is None else json.dumps(data, ensure_ascii=False)

    lines = [f"{view['workflow']}/{view['instance_id']}: {view['status']}" + (
        f" ({value('message', view['message'])})" if view["message"] else "")]
    if view["status_message"]:
        lines.append(f"status     {value('status_message', view['status_message'])}")
    if view["parent"] is not None:
        lines.append(f"parent     {view['parent']['workflow']}/{view['parent']['instance_id']}")
    if view["owner"] is not None:
        lines.append(f"owner      {_owner_text(view['owner'])}")
    if view["in_flight"] is not None:
        flight = view["in_flight"]
        lines.append(f"in flight  {flight['key']} since {flight['since'] or '-'}")
    if view["queue"] is not None:
        queue = view["queue"]
        key = queue["concurrency_key"]
        lines.append(f"queue      {queue['name']} (priority {queue['priority']}"
                     + (f", concurrency key {key!r}" if key is not None else "")
                     + (f", position {queue['position']})" if "position" in queue else ")"))
        if "waiting_because" in queue:
            lines.append(f"waiting    {queue['waiting_because']}")
    if view["timeout"] is not None:
        lines.append(f"timeout    {view['timeout']['duration']} (at {view['timeout']['at']})")
    if view["recovered"] is not None:
        lost = view["recovered"]["step_in_flight"]
        lines.append(f"recovered  {view['recovered']['times']}"
                     + (f", step {lost} was in flight" if lost else ""))
        executed = view["recovered"]["executed"]
        if executed is not None:
            lines.append(f"           step {executed['key']} executed {executed['times']}x: "
                         f"{executed['why']}")
    lines += [
        f"created    {view['created_at']}",
        f"updated    {view['updated_at']}",
        f"ended      {view['completed_at'] or '-'}",
        f"input      {json_value('input', view['input'])}",
        f"output     {json_value('output', view['output'])}",
        "",
        "steps:",
        _table(
            ["SEQ", "KEY", "KIND", "STATE", "ATTEMPTS", "DURATION", "STATUS", "ERROR"],
            [
                [s["seq"], s["key"], s["kind"], s["state"], s["attempts"],
                 _seconds(s["duration"]), s["status"], s["error"]]
                for s in view["steps"]
            ],
        ),
    ]
    cut_steps = sorted(p for p in cut if p.startswith("steps["))
    if cut_steps:
        lines += ["", "cut (--full prints them all): " + ", ".join(f"{p} ({cut[p]:,} characters)"
            for p in cut_steps)]
    if view["timers"]:
        lines += ["", "pending timers:",
            _table(["KEY", "DUE"], [[t["key"], t["due"]] for t in view["timers"]])]
    if view["awaiting_signals"]:
        lines += ["", "awaiting signals: " + ", ".join(view["awaiting_signals"])]
    if view["children"]:
        lines += ["", "children:", _table(["WORKFLOW", "ID", "STATUS"],
            [[c["workflow"], c["instance_id"], c["status"]] for c in view["children"]])]
    if view["traceback"]:
        lines += ["", "traceback:", value("traceback", view["traceback"].rstrip("\n"))]
    return "\n".join(lines)


@main.command()
@_instance
@click.option("--json", "as_json", is_flag=True, help="Print one JSON record.")
@click.option("--full", is_flag=True, help=f"Print values longer than {CUT} characters whole.")
@_SCHEMA
def show(
    db: str, workflow: str, instance_id: str, as_json: bool, full: bool, schema: str | None
) -> None:
    """Show one instance: status, owner, step in flight, input, output, steps, timers,
    awaited signals and the traceback of a failure."""
    with _store(db, schema) as store:
        view = show_instance(store, workflow, instance_id, full=full, clock=CLOCK)
    click.echo(_json(view) if as_json else _show_text(view))


# A payload such as -5 is JSON, not an option.
@main.command(context_settings={"ignore_unknown_options": True})
@_instance
@click.argument("key")
@click.argument("payload", metavar="JSON")
@_SCHEMA
def signal(
    db: str, workflow: str, instance_id: str, key: str, payload: str, schema: str | None
) -> None:
    """Deliver the JSON value to the suspend point KEY of an instance."""
    try:
        value = json.loads(payload)
    except json.JSONDecodeError as exc:
        _fail(f"the payload is not JSON ({exc}): {payload!r}")

    def deliver(store: Store) -> list[str]:
        awaited = store.awaited_signals(workflow, instance_id)
        store_signal(store, workflow, instance_id, key, value, clock=CLOCK)
        return awaited

    awaited = _act_on(db, schema, workflow, instance_id, deliver)
    click.echo(f"signal {key} stored for {workflow}/{instance_id}")
    if key not in awaited:
        waits = f" (it waits on {', '.join(map(repr, awaited))})" if awaited else ""
        _note(f"{workflow}/{instance_id} is not waiting on {key!r}{waits}; the value is kept "
              f"for when the workflow reaches that key{_guess(key, awaited)}")


@main.command()
@_instance
@_SCHEMA
def cancel(db: str, workflow: str, instance_id: str, schema: str | None) -> None:
    """Cancel an instance: it ends Cancelled at its next step boundary."""
    _act_on(db, schema, workflow, instance_id,
            lambda store: cancel_instance(store, workflow, instance_id, clock=CLOCK))
    click.echo(f"cancelled {workflow}/{instance_id}")


@main.command()
@click.argument("db")
@click.argument("workflow")
@click.argument("instance_id", metavar="[ID]", required=False)
@click.option("--failed", is_flag=True,
              help="Resume the failed instances of WORKFLOW instead of one (oldest first).")
@click.option("--since", metavar="T",
              help="With --failed: those that failed since T, an ISO time with its offset "
              "or an age like 12h or 7d.")
@click.option("--limit", type=click.IntRange(min=1), default=1000, show_default=True,
              help="With --failed: at most this many.")
@click.option("--yes", is_flag=True, help="With --failed: do not ask to confirm the count.")
@_SCHEMA
def resume(
    db: str, workflow: str, instance_id: str | None, failed: bool, since: str | None,
    limit: int, yes: bool, schema: str | None,
) -> None:
    """Run a failed, suspended or completed instance again, as engine.resume does: stored
    steps return their results, the rest execute (in an engine that runs WORKFLOW).
    With --failed, every failed instance of WORKFLOW (after a confirmation of the
    count, unless --yes)."""
    if failed:
        if instance_id is not None:
            _fail("give an ID or --failed, not both")
        _resume_failed(db, schema, workflow, _since(since), limit, yes)
        return
    if instance_id is None or since is not None or yes:
        _fail("give the ID of the instance to resume, or --failed (--since and --yes are "
              "for --failed)")
    was = _act_on(db, schema, workflow, instance_id,
                  lambda store: resume_instance(store, workflow, instance_id, clock=CLOCK))
    if was == "running":
        click.echo(f"{workflow}/{instance_id} is running: nothing to resume")
    elif was == "queued":
        click.echo(f"{workflow}/{instance_id} is queued: it runs when its queue has room")
    else:
        click.echo(f"resume of {workflow}/{instance_id} ({was}) stored: an engine that runs "
                   f"{workflow!r} takes it within its poll interval")


def _since(text: str | None) -> float | None:
    """--since (an aware ISO time, or an age like 12h) as epoch seconds; else exit 2."""
    if text is None:
        return None
    try:
        return (utc(CLOCK) - timedelta(seconds=_duration(text))).timestamp()
    except click.BadParameter:
        pass
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        moment = None
    if moment is None or moment.tzinfo is None:
        _fail(f"--since: {text!r} is neither an ISO time with its offset "
              "(2026-12-01T00:00:00+00:00) nor an age like 12h or 7d")
    return moment.timestamp()


def _resume_failed(
    db: str, schema: str | None, workflow: str, since: float | None, limit: int, yes: bool
) -> None:
    """Count the failed instances, confirm (unless ``yes``), and resume exactly those."""
    shown = None if since is None else iso_utc(since)  # as stored: ISO 8601 in UTC
    with _store(db, schema) as store:
        if workflow not in store.workflows():
            raise_unknown(store, workflow, "")
        found = store.failed_instances(workflow, since=since, until=CLOCK.wall(), limit=limit)
        if not found:
            click.echo(f"no failed instance of {workflow!r}" + (
                f" since {shown}" if shown else "") + ": nothing to resume")
            return
        what = (f"{len(found)} failed instance{'' if len(found) == 1 else 's'} of "
                f"{workflow!r}" + (f" (failed since {shown})" if shown else ""))
        if not yes and not click.confirm(f"resume {what}?", err=True):
            click.echo("nothing resumed", err=True)
            sys.exit(1)
        resumed = resume_failed(store, workflow, limit=limit, counted=found, clock=CLOCK)
    click.echo(f"resumed {len(resumed)} of {what}: an engine that runs {workflow!r} "
               "takes them within its poll interval")


@main.command()
@_instance
@click.option("--from", "from_key", metavar="KEY",
              help="Re-run from this step (default: after every completed step).")
@click.option("--id", "new_id", metavar="NEW_ID",
              help="The new instance's id (default: ID.fork-<8 hex digits>).")
@_SCHEMA
def fork(
    db: str, workflow: str, instance_id: str, from_key: str | None, new_id: str | None,
    schema: str | None,
) -> None:
    """Start a new instance of WORKFLOW with the input of ID and its completed steps before
    KEY copied: it re-runs KEY and what follows (in an engine that runs WORKFLOW)."""
    made_id, made = _act_on(db, schema, workflow, instance_id,
        lambda store: fork_instance(store, workflow, instance_id, from_key, new_id, clock=CLOCK))
    if not made:
        _fail(f"{workflow}/{made_id} exists: nothing was forked")
    click.echo(f"forked {workflow}/{instance_id} as {made_id}" + (
        f" from {from_key}" if from_key else "") + f": an engine that runs {workflow!r} "
        "runs it within its poll interval")


@main.command()
@click.argument("db")
@click.option("--older-than", "older_than", required=True, metavar="AGE",
              help="Finished longer ago than this: a number with s, m, h or d (e.g. 30d).")
@_SCHEMA
def purge(db: str, older_than: str, schema: str | None) -> None:
    """Delete finished (completed, failed, cancelled) instances older than AGE."""
    try:
        seconds = _duration(older_than)
    except click.BadParameter as exc:
        _fail(f"--older-than: {exc.message}")
    with _store(db, schema) as store:
        deleted = purge_finished(store, seconds, clock=CLOCK)
    click.echo(f"purged {deleted} finished instance{'' if deleted == 1 else 's'}")


def _grace(ctx: click.Context, param: click.Parameter, value: float) -> float:
    if not math.isfinite(value) or value < 0:
        raise click.BadParameter(f"{value} is not a number of seconds, 0 or more")
    return value


@main.command()
@click.argument("spec", metavar="MODULE:ENGINE")
@click.option("--threads", type=click.IntRange(min=1),
              help="Worker threads (default: the engine's).")
@click.option("--grace", type=float, default=30.0, show_default=True, callback=_grace,
              help="Seconds to let runs in flight end after SIGINT or SIGTERM.")
@click.option("--queues", metavar="A,B",
              help="The declared queues to consume, comma-separated ('' for none; default: "
              "the engine's queues option).")
@click.option("--retention", metavar="AGE",
              help="Purge instances finished longer ago than this, in the background: a "
              "number with s, m, h or d, e.g. 30d (default: the engine's retention option).")
def worker(spec: str, threads: int | None, grace: float, queues: str | None,
           retention: str | None) -> None:
    """Run the engine MODULE:ENGINE until SIGINT or SIGTERM, logging each state change."""
    names = None if queues is None else [q for q in queues.split(",") if q]
    kept = None
    if retention is not None:
        try:
            kept = _duration(retention)
        except click.BadParameter as exc:
            _fail(f"--retention: {exc.message}")
        if kept <= 0:
            _fail(f"--retention: {retention!r} is not a duration over 0")
    try:
        status = run_worker(lambda: load_engine(spec), threads=threads, grace=grace,
                            queues=names, retention=kept)
    except (EngineError, ValueError) as err:  # ValueError: a queue it does not declare
        _fail(str(err))
    raise SystemExit(status)


@main.command()
@click.argument("db")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="The address to serve on; any but loopback needs a token.")
@click.option("--port", type=click.IntRange(0, 65535), default=8321, show_default=True)
@click.option("--allow-actions", is_flag=True,
              help="Offer signal, cancel, resume, fork and bulk resume (default: read-only).")
@click.option("--token", envvar="MEMABLE_UI_TOKEN", metavar="T",
              help="Every page asks for it (also $MEMABLE_UI_TOKEN); needed off loopback.")
@_SCHEMA
def ui(db: str, host: str, port: int, allow_actions: bool, token: str | None,
       schema: str | None) -> None:
    """Serve the dashboard of the store DB until Ctrl-C (needs the extra 'web')."""
    try:
        from ..web import app
        from ..web.guard import is_loopback
        from ..web.serve import bind, serve
    except ImportError as exc:
        _fail(str(exc))
    if not token and not is_loopback(host):
        _fail(f"--host {host} serves other machines: give a --token (or set "
              "MEMABLE_UI_TOKEN), or serve on 127.0.0.1")
    try:
        # Without a token, only loopback names are answered (DNS rebinding).
        dashboard = app(db, allow_actions=allow_actions, token=token or None, schema=schema,
                        loopback_only=not token)
    except EngineError as err:
        _fail(str(err))
    try:
        try:
            server = bind(dashboard, host, port)
        except OSError as exc:  # the port is taken, or the address is not this machine's
            _fail(f"cannot serve on {host}:{port} ({exc})")
        serve(server, read_only=not allow_actions, announce=click.echo)
    finally:
        dashboard.close()
