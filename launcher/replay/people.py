"""The people of a replay trace: when each is at the desk, in which time zone.

A person-driven lab starts work by hand: a job begins only while its owner is present
(the `hand-launched` baseline), and "the night" is the owner's night. A trace's header
names the lab's time zone and the date its second 0 is (local midnight); a `person`
line gives one user's time zone and presence, as explicit windows in trace seconds
(`present`) and/or a weekly pattern in their local time (`weekly`). A user without a
person line is taken as always present.

Time zones: `UTC`, a fixed offset (`+08:00`, `-05:30`) or an IANA name
(`Europe/Berlin`, which needs the system's time zone database). Committed traces use
fixed offsets so they replay the same everywhere.

Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
import datetime as dt
import re
import zoneinfo
from collections.abc import Iterable, Sequence

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

DAY = 86400.0
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_OFFSET = re.compile(r"^(?:UTC)?([+-])(\d{2}):(\d{2})$")
_HHMM = re.compile(r"^(\d{2}):(\d{2})$")


def parse_timezone(text: str) -> dt.tzinfo:
    """`UTC`, `+HH:MM` / `-HH:MM` (optionally `UTC+HH:MM`) or an IANA zone name."""
    if text in ("UTC", "Z", "+00:00"):
        return dt.UTC
    m = _OFFSET.match(text)
    if m:
        sign = 1 if m.group(1) == "+" else -1
        hours, minutes = int(m.group(2)), int(m.group(3))
        if hours > 14 or minutes > 59:
            raise ValueError(f"{text!r} is not a UTC offset (-14:00..+14:00)")
        return dt.timezone(sign * dt.timedelta(hours=hours, minutes=minutes))
    if len(text) > 64 or not re.match(r"^[A-Za-z][A-Za-z0-9_+/-]*$", text):
        raise ValueError(f"{text[:40]!r} is not a time zone (UTC, +HH:MM or an IANA name)")
    try:
        return zoneinfo.ZoneInfo(text)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"time zone {text!r} is not in this system's time zone database; "
                         "use a fixed offset such as +01:00") from None


def parse_hhmm(text: str) -> float:
    """Seconds after midnight of "HH:MM" (24:00 allowed as the end of a day)."""
    m = _HHMM.match(text)
    if not m or int(m.group(1)) > 24 or int(m.group(2)) > 59 or \
            (int(m.group(1)) == 24 and int(m.group(2)) != 0):
        raise ValueError(f"{text[:20]!r} is not a time of day (HH:MM)")
    return int(m.group(1)) * 3600.0 + int(m.group(2)) * 60.0


def day_set(text: str) -> frozenset[int]:
    """Weekdays (0 = Monday) of "mon-fri", "sat,sun", "mon,wed-fri"."""
    out: set[int] = set()
    for part in text.lower().split(","):
        lo, _, hi = part.strip().partition("-")
        if lo not in WEEKDAYS or (hi and hi not in WEEKDAYS):
            raise ValueError(f"{text[:40]!r}: days are mon..sun, e.g. mon-fri or sat,sun")
        a, b = WEEKDAYS.index(lo), WEEKDAYS.index(hi or lo)
        out.update(range(a, b + 1) if a <= b else [*range(a, 7), *range(0, b + 1)])
    return frozenset(out)


class TraceCalendar:
    """Trace seconds <-> local times: second 0 is local midnight of `start` in `zone`."""

    def __init__(self, start: dt.date, zone: dt.tzinfo) -> None:
        self.zone = zone
        self.origin = dt.datetime(start.year, start.month, start.day, tzinfo=zone)

    def local(self, t: float, zone: dt.tzinfo | None = None) -> dt.datetime:
        return (self.origin + dt.timedelta(seconds=t)).astimezone(zone or self.zone)

    def seconds(self, when: dt.datetime) -> float:
        return (when - self.origin).total_seconds()

    def next_local(self, t: float, time_of_day: float, zone: dt.tzinfo | None = None,
                   ) -> float:
        """The first trace second after `t` at which it is `time_of_day` (seconds after
        midnight) in `zone`."""
        here = self.local(t, zone)
        midnight = here.replace(hour=0, minute=0, second=0, microsecond=0)
        for days in range(3):
            day = (midnight + dt.timedelta(days=days)).date()
            cand = dt.datetime(day.year, day.month, day.day, tzinfo=here.tzinfo) \
                + dt.timedelta(seconds=time_of_day)
            s = self.seconds(cand)
            if s > t:
                return s
        raise AssertionError("unreachable: a time of day recurs within 2 days")


class WeeklyHours(BaseModel):
    """A presence pattern in the person's local time: `days` from `from` to `to`."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    days: str = "mon-fri"
    start: str = Field(alias="from")
    end: str = Field(alias="to")

    @field_validator("days")
    @classmethod
    def _days(cls, v: str) -> str:
        day_set(v)
        return v

    @model_validator(mode="after")
    def _times(self) -> WeeklyHours:
        if parse_hhmm(self.start) >= parse_hhmm(self.end):
            raise ValueError(f"from {self.start} must be before to {self.end}")
        return self


class Person(BaseModel):
    """One user of the trace: time zone and presence (windows in trace seconds, merged
    with the weekly pattern)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    person: str = Field(min_length=1, max_length=64)
    timezone: str | None = None  # None: the lab's
    present: tuple[tuple[float, float], ...] = ()
    weekly: tuple[WeeklyHours, ...] = ()

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str | None) -> str | None:
        if v is not None:
            parse_timezone(v)
        return v

    @field_validator("present")
    @classmethod
    def _windows(cls, v: tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
        for a, b in v:
            if not 0 <= a < b:
                raise ValueError(f"window [{a:g}, {b:g}]: 0 <= start < end")
        return v


class Presence:
    """When one person is at the desk, as sorted disjoint windows (trace seconds)."""

    def __init__(self, windows: Iterable[tuple[float, float]]) -> None:
        merged: list[list[float]] = []
        for a, b in sorted(windows):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.windows = [(a, b) for a, b in merged]
        self._starts = [a for a, _ in self.windows]

    def at(self, t: float) -> bool:
        i = bisect.bisect_right(self._starts, t) - 1
        return i >= 0 and t < self.windows[i][1]

    def next_arrival(self, t: float) -> float | None:
        """The next time (after `t`) this person comes in; None: never again."""
        i = bisect.bisect_right(self._starts, t)
        return self._starts[i] if i < len(self._starts) else None


def presence_of(person: Person, calendar: TraceCalendar, until: float) -> Presence:
    """The person's windows up to trace second `until`, the weekly pattern expanded."""
    zone = parse_timezone(person.timezone) if person.timezone else calendar.zone
    windows: list[tuple[float, float]] = list(person.present)
    first = calendar.local(0.0, zone).date() - dt.timedelta(days=1)
    days = int(until // DAY) + 3
    for hours in person.weekly:
        wanted = day_set(hours.days)
        for k in range(days):
            day = first + dt.timedelta(days=k)
            if day.weekday() not in wanted:
                continue
            midnight = dt.datetime(day.year, day.month, day.day, tzinfo=zone)
            a = calendar.seconds(midnight + dt.timedelta(seconds=parse_hhmm(hours.start)))
            b = calendar.seconds(midnight + dt.timedelta(seconds=parse_hhmm(hours.end)))
            if b > 0 and a < until:
                windows.append((max(0.0, a), b))
    return Presence(windows)


def presences(people: Sequence[Person], calendar: TraceCalendar, until: float,
              ) -> dict[str, Presence]:
    return {p.person: presence_of(p, calendar, until) for p in people}
