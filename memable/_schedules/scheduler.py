"""Firing one engine's schedules: what the timer thread does for them each time it looks.

A ``Scheduler`` is the runner's ticker: each look fires the due ticks and says when the next
is due. A tick is the instance ``"{name}@{YYYY-MM-DDTHH:MM:SSZ}"``. Firing compares and sets
the stored last tick in the transaction that creates the instances (``Store.fire_ticks``), so
one engine fires each tick. Ticks that fell due while no engine looked are missed;
``catch_up`` says which of them run."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any

import attrs

from .._clock import Clock
from .._log import log, where
from .._queues import Declarations, QueueSpec
from .._run.invoking import NO_INPUT, new_instance
from .._run.runner import Runner
from .._run.workflow import Made, Workflow
from .._store.rows import InstanceRow, ScheduleRow, TickFiring
from .cron import Cron, parse_tick, tick_id
from .spec import CatchUp, ScheduleSpec

GRACE = 30.0  # seconds after its due time a tick is on time (if no later one is due)
CATCH_UP_ALL = 100  # most missed ticks ``catch_up="all"`` runs: the newest
COUNT_AT_MOST = 100_000  # missed ticks counted; past it, "at least"
RETRY_FIRST, RETRY_MOST = 1.0, 60.0  # seconds to retry a failed firing, doubling


@attrs.frozen
class Plan:
    """Which due ticks of a schedule run, and how many were missed."""

    run: list[datetime]  # oldest first
    missed: int
    last: datetime  # the newest due tick: the schedule's last tick once fired
    live: bool  # the newest tick was found on time
    at_least: bool = False  # ``missed`` stopped counting at ``COUNT_AT_MOST``


def plan(cron: Cron, catch_up: CatchUp, after: datetime | None, now: datetime) -> Plan | None:
    """The ticks in (``after``, ``now``] and what ``catch_up`` makes of them; None if none.

    >>> cron = Cron.parse("0 * * * *")
    >>> def at(hour, minute=0):
    ...     return datetime(2026, 1, 1, hour, minute, tzinfo=timezone.utc)
    >>> plan(cron, "none", at(9), at(10, 0)).live          # on time
    True
    >>> missed = plan(cron, "latest", at(9), at(13, 5))  # down from 09:00 to 13:05
    >>> [f"{t:%H}" for t in missed.run], missed.missed, missed.live
    (['13'], 3, False)
    >>> [f"{t:%H}" for t in plan(cron, "all", at(9), at(13, 5)).run]
    ['10', '11', '12', '13']
    >>> plan(cron, "none", at(9), at(13, 5)).missed
    4
    """
    newest: list[datetime] = []  # the newest due ticks, newest first (as many as may run)
    count, at_least = 0, False
    keep = CATCH_UP_ALL if catch_up == "all" else 1
    for tick in cron.before(now):
        if after is not None and tick <= after:
            break
        count += 1
        if len(newest) < keep:
            newest.append(tick)
        if count >= COUNT_AT_MOST:
            at_least = True
            break
    if not newest:
        return None
    last = newest[0]
    if count == 1 and (now - last).total_seconds() <= GRACE:
        return Plan([last], 0, last, live=True)
    run = {"latest": newest[:1], "all": newest[::-1], "none": []}[catch_up]
    return Plan(run, count - len(run), last, live=False, at_least=at_least)


class Scheduler:
    """An engine's declared schedules. Looks come from the timer thread and from
    ``fire_due_timers()`` on a caller's thread: one at a time, under ``_lock``."""

    def __init__(self, runner: Runner) -> None:
        self._runner = runner
        self._specs: dict[str, ScheduleSpec] = {}  # fixed once the engine started
        # _lock guards the fields below, held by a whole look (and start). Lock order: _lock,
        # the runner's lock, the store's.
        self._lock = threading.Lock()
        self._stored: dict[str, ScheduleRow] = {}
        self._next: dict[str, datetime | None] = {}  # the next tick due (UTC), by name
        self._retry: dict[str, tuple[float, float]] = {}  # (at, delay) after a failed firing
        self._warned: set[tuple[str, str, str]] = set()  # (name, cron, zone) warned of

    def add(self, spec: ScheduleSpec) -> None:
        """Declare ``spec`` (before the engine starts; its caller holds the runner's lock)."""
        if spec.name in self._specs:
            raise ValueError(f"schedule {spec.name!r} is already declared")
        self._specs[spec.name] = spec

    def declares(self) -> dict[str, list[str]]:
        return {s.name: [s.cron.expr, s.cron.zone] for s in self._specs.values()}

    def start(self, now: float) -> None:
        """Store the declarations (a new or changed one counts from now); warn of a live engine
        that declares one differently."""
        if not self._specs:
            return
        store = self._runner.store
        rows = [ScheduleRow(s.name, s.cron.expr, s.cron.zone, s.workflow)
                for s in self._specs.values()]
        at = _utc(now)
        with self._lock:
            for owner in store.live_owners(now):
                theirs = {} if owner.id == store.owner else _declared_schedules(owner.declares)
                for name, spec in self._specs.items():
                    other = theirs.get(name)
                    if other is not None and len(other) == 2:
                        self._differs(spec, other[0], other[1], f"engine {owner.id}")
            for row in store.declare_schedules(rows, now):
                self._seen(row, at)

    def look(self, now: float) -> tuple[int, float | None]:
        """Fire the ticks due at ``now``; the instances created, and seconds to the next look."""
        if not self._specs or not self._runner.accepting:
            return 0, None
        with self._lock:
            at = _utc(now)
            fired = 0
            for name, spec in self._specs.items():
                retry_at, delay = self._retry.get(name, (0.0, 0.0))
                due = self._next.get(name)
                if now < retry_at or due is None or due > at:
                    continue
                try:
                    fired += self._fire(spec, at)
                except Exception:  # e.g. the store stayed locked past its busy timeout
                    delay = min(RETRY_MOST, max(RETRY_FIRST, delay * 2))
                    log.exception("schedule %r: firing failed; trying again in %g s", name, delay)
                    self._retry[name] = (now + delay, delay)
                else:
                    self._retry.pop(name, None)
            waits = [(due - at).total_seconds() for due in self._next.values() if due is not None]
            waits += [retry_at - now for retry_at, _ in self._retry.values()]
        return fired, max(0.0, min(waits)) if waits else None

    def _fire(self, spec: ScheduleSpec, at: datetime) -> int:
        """Fire what is due of ``spec`` at ``at``; how many instances that created."""
        fired = 0

        def make() -> list[Made]:
            nonlocal fired
            fired, made = self._fire_ticks(spec, at)
            return made

        self._runner.start_made(make)  # made ours and started: one call
        return fired

    def _fire_ticks(self, spec: ScheduleSpec, at: datetime) -> tuple[int, list[Made]]:
        """Fire what is due of ``spec``: how many instances that created, and those to run here."""
        runner = self._runner
        workflow = runner.workflow(spec.workflow)
        # Another engine may fire between our read and our firing: plan again from what it
        # stored (twice at most; the next look tries again).
        for _ in range(2):
            stored = self._stored[spec.name]
            ticks = plan(spec.cron, spec.catch_up, _start(stored), at)
            if ticks is None:
                self._next[spec.name] = spec.cron.after(at)
                return 0, []
            # A span is ended only if its instance is made here: no lone spans.
            spans = [self._runner.telemetry.produce(spec.workflow, f"{spec.name}@{tick_id(t)}")
                     for t in ticks.run]
            rows = [(attrs.evolve(row, traceparent=span.traceparent), value)
                    for (row, value), span
                    in zip((tick_instance(spec, workflow, tick, runner.queues, runner.clock)
                            for tick in ticks.run), spans, strict=True)]
            firing = TickFiring(tick_id(ticks.last), [row for row, _ in rows], ticks.missed,
                                skip_overlap=spec.overlap == "skip")
            fired = self._runner.store.fire_ticks(spec.name, stored.last_tick, firing)
            if fired.won:
                break
            for now_stored in self._runner.store.schedules():
                if now_stored.name == spec.name:
                    self._seen(now_stored, at)
                    self._differs(spec, now_stored.cron, now_stored.timezone,
                                  "the store (another engine)")
        else:
            return 0, []
        self._seen(attrs.evolve(stored, last_tick=firing.last_tick), at)
        if fired.declared is not None:
            self._differs(spec, *fired.declared, "the store (another engine)")
        if ticks.missed:
            log.warning(
                "schedule %r: %s%d tick%s missed while no engine fired %s (catch_up=%r); "
                "ran %d", spec.name, "at least " if ticks.at_least else "", ticks.missed,
                "" if ticks.missed == 1 else "s", "it" if ticks.missed == 1 else "them",
                spec.catch_up, len(ticks.run))
        telemetry = self._runner.telemetry
        telemetry.ticks(spec.name, "fired", len(fired.created))
        telemetry.ticks(spec.name, "skipped", fired.skipped)
        telemetry.ticks(spec.name, "missed", ticks.missed)
        if fired.skipped:
            log.info("schedule %r: %d tick%s skipped: an earlier tick's instance has not "
                     "ended", spec.name, fired.skipped, "" if fired.skipped == 1 else "s")
        created = set(fired.created)
        made: list[Made] = []
        for (row, value), span in zip(rows, spans, strict=True):
            if row.instance_id not in created:
                continue
            span.end()
            log.info("schedule %r fired", spec.name, extra=where(spec.workflow, row.instance_id))
            if row.queue is None:
                made.append((workflow, row.instance_id, (value,), row.traceparent, "schedule"))
        if any(row.queue is not None for row, _ in rows):
            self._runner.kick()
        return len(created), made

    def _differs(self, spec: ScheduleSpec, cron: str, zone: str, where: str) -> None:
        """One WARNING per other declaration of the schedule seen, naming both."""
        if (cron, zone) == (spec.cron.expr, spec.cron.zone):
            return
        if (spec.name, cron, zone) not in self._warned:
            self._warned.add((spec.name, cron, zone))
            log.warning("schedule %r is declared %r in %s here and %r in %s by %s; each "
                        "engine fires its own ticks", spec.name, spec.cron.expr,
                        spec.cron.zone, cron, zone, where)

    def _seen(self, row: ScheduleRow, at: datetime) -> None:
        """Plan from what the store holds of a schedule (as of ``at``)."""
        self._stored[row.name] = row
        self._next[row.name] = self._specs[row.name].cron.after(_start(row) or at)


def tick_instance(
    spec: ScheduleSpec, workflow: Workflow, tick: datetime, queues: dict[str, QueueSpec],
    clock: Clock,
) -> tuple[InstanceRow, Any]:
    """``tick``'s instance and input: the declared one, else the tick if the workflow takes one."""
    value = spec.input
    if value is None:
        value = tick if workflow.takes_input else NO_INPUT
    row, value = new_instance(workflow, value, f"{spec.name}@{tick_id(tick)}", spec.queue, 0,
                              queues, clock=clock)
    return attrs.evolve(row, schedule=spec.name), value


def _start(row: ScheduleRow) -> datetime | None:
    """Ticks after this are due: the last tick accounted for, or when it began counting."""
    starts = [parse_tick(row.last_tick)] if row.last_tick else []
    if row.since:
        starts.append(datetime.fromisoformat(row.since))
    return max(starts) if starts else None


def _utc(seconds: float) -> datetime:
    return datetime.fromtimestamp(seconds, timezone.utc)


def _declared_schedules(declares: str | None) -> dict[str, list[str]]:
    declared = Declarations.from_json(declares)
    return {} if declared is None else declared.schedules
