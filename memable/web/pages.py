"""What each page of the dashboard shows, read from a store: plain dicts for the templates.

Reads only (nothing here writes or renders), each a page's worth."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Any

from .._clock import Clock, epoch_seconds, utc_text
from .._inspect import STATUSES, limits_text, list_queues, list_schedules, show_instance
from .._store.operator import OperatorStore
from .._store.rows import TERMINAL, waited

#: Instances on one page of the list.
PAGE_SIZE = 50
#: The most failed instances one bulk resume acts on (the oldest failures first).
BULK_LIMIT = 1000
#: Characters of a stored value a preview shows.
PREVIEW = 200


def overview(store: OperatorStore, clock: Clock) -> dict[str, Any]:
    """Counts per workflow and status, the queues with their numbers and limits, and the
    schedules with their last and next tick."""
    counts: dict[str, dict[str, int]] = {}
    for workflow, status, n in store.status_counts():
        counts.setdefault(workflow, {})[status] = n
    totals = {s: sum(c.get(s, 0) for c in counts.values()) for s in STATUSES}
    now = clock.wall()
    queues = [{
        "name": q["name"], "queued": q["queued"], "running": q["running"],
        "oldest_age": waited(q["oldest_queued_at"], now),
        "consumers": q["engines"], "limits": limits_text(q["limits"]), "paused": q["paused"],
        "paused_at": q["paused_at"]} for q in list_queues(store, clock=clock)]
    schedules, notes = list_schedules(store, clock=clock)
    return {
        "statuses": STATUSES,
        "workflows": [{"name": w, "counts": c, "total": sum(c.values())}
                      for w, c in sorted(counts.items())],
        "totals": totals, "total": sum(totals.values()),
        "queues": queues, "schedules": schedules, "notes": notes}


def when(iso: str | None) -> str:
    """A stored time as a page shows it: UTC, to the second (the page keeps the whole
    ISO text in the element's ``datetime`` and ``title``).

    >>> when("2026-12-06T00:34:24.734808+00:00"), when("2026-12-06T01:00:00+01:00")
    ('2026-12-06 00:34:24 UTC', '2026-12-06 00:00:00 UTC')
    >>> when(None), when("not a time")
    ('-', 'not a time')
    """
    if iso is None:
        return "-"
    try:
        moment = datetime.fromisoformat(iso)
    except ValueError:
        return iso
    if moment.tzinfo is not None:
        moment = moment.astimezone(timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S") + " UTC"


class BadRequest(ValueError):
    """A page's parameters cannot be read (400): the message says which and why."""


class NotFound(LookupError):
    """What a request names is not in the store (404): the message says what."""


def page_number(text: str | None) -> int:
    """The 1-based page number of the list; BadRequest for anything else.

    >>> page_number(None), page_number("3")
    (1, 3)
    >>> page_number("x")
    Traceback (most recent call last):
    ...
    memable.web.pages.BadRequest: page must be a whole number from 1, not 'x'
    """
    if text is None or text == "":
        return 1
    if not text.isascii() or not text.isdigit() or int(text) < 1 or len(text) > 9:
        raise BadRequest(f"page must be a whole number from 1, not {text!r}")
    return int(text)


def confirmed_time(text: str | None) -> str:
    """The time a bulk action's confirmation judged its filter at (ISO text, with its
    offset); BadRequest if missing or not such a time.

    >>> confirmed_time("2026-12-05T10:00:00+00:00")
    '2026-12-05T10:00:00+00:00'
    >>> confirmed_time("yesterday")
    Traceback (most recent call last):
    ...
    memable.web.pages.BadRequest: the confirmed time must be an ISO time with its offset, ...
    """
    try:
        parsed = datetime.fromisoformat(text or "")
    except ValueError:
        parsed = None
    if parsed is None or parsed.tzinfo is None:
        raise BadRequest(f"the confirmed time must be an ISO time with its offset, not {text!r}")
    return parsed.astimezone(timezone.utc).isoformat()


def instance_filter(args: dict[str, str]) -> dict[str, str | None]:
    """The list's filter from its query (workflow, status, id prefix; empty is unset);
    BadRequest for a status there is not."""
    status = args.get("status") or None
    if status is not None and status not in STATUSES:
        raise BadRequest(f"status must be one of {', '.join(STATUSES)}, not {status!r}")
    return {"workflow": args.get("workflow") or None, "status": status,
            "id": args.get("id") or None}


def instances(store: OperatorStore, chosen: dict[str, str | None], page: int) -> dict[str, Any]:
    """One page of the list, newest first, and whether a next page exists."""
    rows = store.instance_page(chosen["workflow"], chosen["status"], chosen["id"],
                               (page - 1) * PAGE_SIZE, PAGE_SIZE + 1)
    return {
        "filter": chosen, "page": page, "has_next": len(rows) > PAGE_SIZE,
        "statuses": STATUSES, "workflows": store.workflows(),
        "rows": [{
            "workflow": r.workflow, "instance_id": r.instance_id, "status": r.status,
            "message": r.message, "status_message": r.status_message,
            "created_at": r.created_at, "updated_at": r.updated_at} for r in rows[:PAGE_SIZE]]}


def detail(store: OperatorStore, workflow: str, instance_id: str, clock: Clock) -> dict[str, Any]:
    """One instance as ``memable show`` reads it, values as JSON text cut to a preview
    where long, and whether it has ended; ``InstanceNotFound``/``WorkflowNotFound``."""
    view = show_instance(store, workflow, instance_id, clock=clock)
    view["terminal"] = view["status"] in TERMINAL
    for name in ("input", "output"):
        view[name] = _json_text(view[name])
    for step in view["steps"]:
        step["result"] = _preview(_json_text(step["result"]))
    view["forkable"] = [s["key"] for s in view["steps"]]
    return view


def _json_text(value: Any) -> str | None:
    return None if value is None else json.dumps(value, ensure_ascii=False, indent=1)


def _preview(text: str | None) -> str | None:
    if text is None or len(text) <= PREVIEW:
        return text
    return text[:PREVIEW] + f"... ({len(text)} characters)"


def bulk_resume(
    store: OperatorStore, workflow: str | None, id_prefix: str | None, until: str | None = None,
    *, clock: Clock,
) -> dict[str, Any]:
    """What a bulk resume of the failed instances of a filter would act on: the filter,
    the time it is judged at (failures after it are not included), and how many."""
    until = until or utc_text(clock)
    found = store.failed_instances(workflow, id_prefix=id_prefix, until=epoch_seconds(until),
                                   limit=BULK_LIMIT + 1)
    return {"workflow": workflow, "id": id_prefix, "until": until,
        "count": min(len(found), BULK_LIMIT), "more": len(found) > BULK_LIMIT, "limit": BULK_LIMIT}
