"""Cron expressions and their ticks: the one adapter over ``cronsim``.

An expression (five fields, or an ``@`` alias) is read in an IANA zone with Debian cron's
daylight-saving rules (see the schedules how-to); ticks leave here in UTC."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import attrs
from cronsim import CronSim, CronSimError

#: The aliases, as the five fields they stand for.
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def _zone(name: object) -> ZoneInfo:
    if not isinstance(name, str) or not name:
        raise ValueError(f"timezone must be an IANA zone name such as 'Europe/Paris', "
                         f"not {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"timezone {name!r} is not a zone this system knows "
                         "(an IANA name such as 'Europe/Paris')") from None


@attrs.frozen
class Cron:
    """A cron expression in a zone; ``Cron.parse`` checks both.

    >>> cron = Cron.parse("30 1 * * *", "Europe/Paris")
    >>> print(cron.after(datetime(2026, 3, 28, 12, 0, tzinfo=timezone.utc)))
    2026-03-29 00:30:00+00:00
    >>> Cron.parse("@hourly", "UTC").fields
    '0 * * * *'
    """

    expr: str  #: As declared (an alias stays an alias).
    zone: str  #: The IANA zone the fields are read in.
    fields: str  #: The five fields (an alias expanded).

    @classmethod
    def parse(cls, expr: object, zone: object = "UTC") -> Cron:
        """Check ``expr`` and ``zone``; ``ValueError`` naming the argument at fault.

        >>> Cron.parse("0 0 0 * * *")
        Traceback (most recent call last):
        ...
        ValueError: cron '0 0 0 * * *' has 6 fields; a schedule takes 5 (minute hour day month weekday) or an alias such as '@daily'
        """  # noqa: E501
        if not isinstance(expr, str) or not expr.strip():
            raise ValueError(f"cron must be a cron expression such as '0 2 * * *', not {expr!r}")
        expr = " ".join(expr.split())
        fields = ALIASES.get(expr.lower(), expr)
        if fields.startswith("@"):
            raise ValueError(f"cron {expr!r} is not an alias memable knows "
                             f"({', '.join(sorted(ALIASES))})")
        if len(fields.split()) != 5:
            raise ValueError(f"cron {expr!r} has {len(fields.split())} fields; a schedule takes 5 "
                "(minute hour day month weekday) or an alias such as '@daily'")
        tz = _zone(zone)
        try:
            # Any fixed start checks it (a cron that fires at all repeats within 28
            # years): the check does not read the time, so a test's clock cannot sway it.
            next(CronSim(fields, datetime(2000, 1, 1, tzinfo=tz)))
        except CronSimError as exc:
            raise ValueError(f"cron {expr!r} is not a valid expression ({exc})") from None
        except StopIteration:
            raise ValueError(f"cron {expr!r} never fires") from None
        return cls(expr, str(zone), fields)

    def after(self, moment: datetime) -> datetime | None:
        """The first tick strictly after ``moment`` (aware), in UTC; None if there is none."""
        return next(self.ticks(moment), None)

    def ticks(self, after: datetime) -> Iterator[datetime]:
        """The ticks strictly after ``after`` (aware), oldest first, in UTC.

        >>> cron = Cron.parse("0 * * * *", "Europe/Paris")
        >>> autumn = cron.ticks(datetime(2026, 10, 24, 23, 30, tzinfo=timezone.utc))
        >>> [f"{next(autumn):%H:%M}" for _ in range(3)]  # 02:00 twice in Paris, in UTC
        ['00:00', '01:00', '02:00']
        """
        zone = ZoneInfo(self.zone)
        for tick in CronSim(self.fields, _plain(after).astimezone(zone)):
            yield tick.astimezone(timezone.utc)

    def before(self, moment: datetime) -> Iterator[datetime]:
        """The ticks at or before ``moment`` (aware), newest first, in UTC."""
        # cronsim's reverse walk starts strictly before its start: start a second later,
        # counted in UTC (local arithmetic would drop the fold of a repeated hour).
        start = _plain(moment).replace(microsecond=0) + timedelta(seconds=1)
        for tick in CronSim(self.fields, start.astimezone(ZoneInfo(self.zone)), reverse=True):
            yield tick.astimezone(timezone.utc)


def _plain(moment: datetime) -> datetime:
    """``moment`` (aware) in UTC, as an instance of the standard ``datetime`` class.

    freezegun's subclass drops ``fold`` in arithmetic and ``astimezone``, and with it one of
    the two ticks of an hour autumn repeats: cronsim gets the standard class, which keeps it.

    >>> type(_plain(datetime(2026, 10, 25, 1, 0, tzinfo=timezone.utc))) is datetime
    True
    """
    plain = next(c for c in type(moment).__mro__
                 if c.__module__ == "datetime" and c.__qualname__ == "datetime")
    utc = moment.astimezone(timezone.utc)
    return plain(utc.year, utc.month, utc.day, utc.hour, utc.minute, utc.second,  # type: ignore[no-any-return]
                 utc.microsecond, tzinfo=timezone.utc)


def tick_id(tick: datetime) -> str:
    """How a tick names its instance: UTC, to the second.

    >>> tick_id(datetime(2026, 3, 29, 1, 0, tzinfo=timezone.utc))
    '2026-03-29T01:00:00Z'
    """
    return tick.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_tick(text: str) -> datetime:
    """The tick ``tick_id`` wrote, as an aware UTC datetime.

    >>> parse_tick("2026-03-29T01:00:00Z")
    datetime.datetime(2026, 3, 29, 1, 0, tzinfo=datetime.timezone.utc)
    """
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
