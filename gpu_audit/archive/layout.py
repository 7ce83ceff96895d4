"""Archive file names and the order of an archive's parts.

An archive directory holds one series of parts per host and stream (one hash chain),
named

    <prefix>_<host>_<stream>_YYYY-MM-DD[.N].jsonl     .jsonl.gz once closed and compressed
    <prefix>_<host>_<stream>_YYYY-MM-DD[.N].seal.json  its seal (gpu_audit.archive.seal)

Host and stream are percent-encoded (every byte but A-Z a-z 0-9 . - becomes %XX, so a
name never holds `_`, `/` or a control character of theirs), which makes the name
unambiguous and lets a reader tell a record that does not belong to the part (another
host's, another stream's) without any key. The day is the UTC day of the interval the
records close, (`time_ns` - elapsed, `time_ns`]: the day of `time_ns` - 1 ns, so a
record at midnight sharp is the day before's (every record of a part shares it; parts
written before this rule put it in the next day's part, which readers allow for);
N is the part's number in its series
(none for part 0, then 1, 2, ... 10, 11 in decimal): it grows by one with every part the
series gets, across days, so it is the order the parts were written in, which is the
order of the stream's seqs. The plain name order is not (`.10` before `.2`).

Archives written before host and stream were in the names (`<prefix>-YYYY-MM-DD[.N].jsonl`,
every host and stream in one file, N counted per day) are still listed and read
("legacy" parts, `Part.host == ""`), before the series.

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
from urllib.parse import unquote

_SERIES = re.compile(
    r"(?P<prefix>.+)_(?P<host>[^_]+)_(?P<stream>[^_]+)_(?P<day>\d{4}-\d{2}-\d{2})"
    r"(?:\.(?P<part>[1-9]\d*))?\.jsonl(?P<gz>\.gz)?"
)
_LEGACY = re.compile(
    r"(?P<prefix>.+)-(?P<day>\d{4}-\d{2}-\d{2})(?:\.(?P<part>[1-9]\d*))?\.jsonl(?P<gz>\.gz)?"
)
# what stays as it is in a name; every other byte (of UTF-8) becomes %XX
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-.")
SEAL_SUFFIX = ".seal.json"


def encode(text: str) -> str:
    """A host or stream as it appears in a part name."""
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in text.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class Part:
    """One archive file. `host` and `stream` are "" for a legacy part."""

    prefix: str
    host: str
    stream: str
    day: dt.date
    number: int
    path: Path = field(compare=False)
    compressed: bool = field(compare=False)

    @property
    def legacy(self) -> bool:
        return not self.host

    @property
    def series(self) -> tuple[str, str, str]:
        """(prefix, host, stream): the chain the part belongs to ("" for legacy)."""
        return self.prefix, self.host, self.stream

    @property
    def order(self) -> tuple[object, ...]:
        """Archive order: legacy parts (day, then number) first, then each series in
        part-number order."""
        if self.legacy:
            return (self.prefix, 0, "", "", self.day, self.number)
        return (self.prefix, 1, self.host, self.stream, self.number, self.day)

    @property
    def seal_path(self) -> Path:
        """Where the part's seal is (or will be)."""
        return self.path.with_name(seal_name(self.path.name))


def day_of(time_ns: int) -> dt.date:
    """The UTC day a record with this `time_ns` is archived under: the day of the
    interval it closes, (time_ns - elapsed, time_ns], so a record at midnight sharp is
    the day before's (as the rollup counts it)."""
    return dt.datetime.fromtimestamp((time_ns - 1) // 1_000_000_000, tz=dt.UTC).date()


def part_name(prefix: str, day: dt.date, number: int, *, host: str, stream: str,
              compressed: bool = False) -> str:
    """The file name of part `number` of a host's stream, holding records of `day`."""
    stem = (f"{prefix}_{encode(host)}_{encode(stream)}_{day.isoformat()}"
            + (f".{number}" if number else ""))
    return stem + (".jsonl.gz" if compressed else ".jsonl")


def legacy_part_name(prefix: str, day: dt.date, number: int, *, compressed: bool = False) -> str:
    """A legacy part's name (archives written before host and stream were named)."""
    stem = f"{prefix}-{day.isoformat()}" + (f".{number}" if number else "")
    return stem + (".jsonl.gz" if compressed else ".jsonl")


def seal_name(part_file: str) -> str:
    """The seal's file name for a part's file name (plain or compressed)."""
    stem = part_file.removesuffix(".gz").removesuffix(".jsonl")
    return stem + SEAL_SUFFIX


@dataclass(frozen=True, slots=True)
class ParsedName:
    prefix: str
    host: str  # "" for a legacy name
    stream: str
    day: dt.date
    number: int
    compressed: bool


def parse_name(name: str) -> ParsedName | None:
    """What an archive file name says, or None when it is not a part's name."""
    m = _SERIES.fullmatch(name)
    if m is not None:
        host, stream = unquote(m["host"]), unquote(m["stream"])
        if encode(host) != m["host"] or encode(stream) != m["stream"]:
            return None  # not the one spelling the sink writes
    else:
        m = _LEGACY.fullmatch(name)
        if m is None:
            return None
        host = stream = ""
    try:
        day = dt.date.fromisoformat(m["day"])
    except ValueError:
        return None
    return ParsedName(m["prefix"], host, stream, day, int(m["part"] or 0), m["gz"] is not None)


def list_parts(directory: Path, prefix: str | None = None) -> list[Part]:
    """The archive's parts in archive order (`Part.order`), each part once (its `.gz`
    when both exist).

    With `prefix`, only that archive's parts; without, every archive in the directory,
    grouped by prefix.
    """
    found: dict[tuple[str, str, str, dt.date, int], Part] = {}
    for path in directory.iterdir():
        parsed = parse_name(path.name)
        if parsed is None:
            continue
        if prefix is not None and parsed.prefix != prefix:
            continue
        key = (parsed.prefix, parsed.host, parsed.stream, parsed.day, parsed.number)
        if key in found and found[key].compressed:
            continue
        if key in found or path.is_file():
            found[key] = Part(parsed.prefix, parsed.host, parsed.stream, parsed.day,
                              parsed.number, path, parsed.compressed)
    return sorted(found.values(), key=lambda p: p.order)
