"""Archive file names and the order of an archive's parts.

An archive directory holds JSON Lines files named `<prefix>-YYYY-MM-DD[.N].jsonl`, and
`.jsonl.gz` once a file is closed and compressed. The day is the UTC day of the records'
`time_ns`; N is the part number within the day (none for part 0, then 1, 2, ... 10, 11,
in decimal, no leading zeros). Parts are written one after another: part N+1 of a day is
created only after part N was closed. So the order of the archive is (prefix, day, part
as a number), never the plain name order (that puts `.1` before the base file and `.10`
before `.2`).

During a compression a part can exist twice, `.jsonl` beside a complete `.jsonl.gz`
(the gzip file is renamed into place only when whole); the listing gives it once, as the
`.gz`. Temporary files (`.tmp`) and names that do not follow the pattern are not parts.

This module only names and lists files; it never opens, writes or deletes one.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from pathlib import Path

_NAME = re.compile(
    r"(?P<prefix>.+)-(?P<day>\d{4}-\d{2}-\d{2})(?:\.(?P<part>[1-9]\d*))?\.jsonl(?P<gz>\.gz)?"
)


@dataclass(frozen=True, order=True, slots=True)
class Part:
    """One archive file; parts sort in archive order: prefix, day, part number."""

    prefix: str
    day: dt.date
    number: int
    path: Path = field(compare=False)
    compressed: bool = field(compare=False)


def day_of(time_ns: int) -> dt.date:
    """The UTC day a record with this `time_ns` is archived under."""
    return dt.datetime.fromtimestamp(time_ns // 1_000_000_000, tz=dt.UTC).date()


def part_name(prefix: str, day: dt.date, number: int, *, compressed: bool = False) -> str:
    """The file name of part `number` of `day`: part 0 has no number in its name."""
    stem = f"{prefix}-{day.isoformat()}" + (f".{number}" if number else "")
    return stem + (".jsonl.gz" if compressed else ".jsonl")


def parse_name(name: str) -> tuple[str, dt.date, int, bool] | None:
    """(prefix, day, part number, compressed) for an archive file name, else None."""
    m = _NAME.fullmatch(name)
    if m is None:
        return None
    try:
        day = dt.date.fromisoformat(m["day"])
    except ValueError:
        return None
    return m["prefix"], day, int(m["part"] or 0), m["gz"] is not None


def list_parts(directory: Path, prefix: str | None = None) -> list[Part]:
    """The archive's parts in archive order, each part once (its `.gz` when both exist).

    With `prefix`, only that archive's parts; without, every archive in the directory,
    grouped by prefix.
    """
    found: dict[tuple[str, dt.date, int], Part] = {}
    for path in directory.iterdir():
        parsed = parse_name(path.name)
        if parsed is None:
            continue
        pre, day, number, compressed = parsed
        if prefix is not None and pre != prefix:
            continue
        key = (pre, day, number)
        if key in found and found[key].compressed:
            continue
        if key in found or path.is_file():
            found[key] = Part(pre, day, number, path, compressed)
    return sorted(found.values())
