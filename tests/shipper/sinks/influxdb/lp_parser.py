"""A small InfluxDB line-protocol parser with InfluxDB 1.x/2.x escaping semantics.

Used by the tests and by the in-process Influx server to read back what the sink wrote.
Semantics mirrored from influxdb models/points.go: a backslash always consumes the next
character while scanning; unescaping replaces only `\\,` `\\=` `\\ ` in keys and tag
values (`\\,` `\\ ` in measurements) and `\\"` `\\\\` in string fields.
"""

from __future__ import annotations

from dataclasses import dataclass


class ParseError(ValueError):
    pass


@dataclass(frozen=True)
class Point:
    measurement: str
    tags: dict[str, str]
    fields: dict[str, object]
    time: int

    @property
    def series_key(self) -> tuple[str, tuple[tuple[str, str], ...]]:
        return self.measurement, tuple(sorted(self.tags.items()))


def _scan(text: str, i: int, stops: str) -> int:
    while i < len(text):
        ch = text[i]
        if ch == "\\":
            i += 2
            continue
        if ch in stops:
            return i
        i += 1
    return len(text)


def _unescape(raw: str, codes: str) -> str:
    for ch in codes:
        raw = raw.replace("\\" + ch, ch)
    return raw


def _field_value(raw: str) -> object:
    if raw.startswith('"'):
        if not raw.endswith('"') or len(raw) < 2:
            raise ParseError(f"bad string field {raw!r}")
        return raw[1:-1].replace('\\"', '"').replace("\\\\", "\\")
    if raw.endswith("i"):
        return int(raw[:-1])
    if raw in ("t", "T", "true", "True", "TRUE"):
        return True
    if raw in ("f", "F", "false", "False", "FALSE"):
        return False
    try:
        return float(raw)
    except ValueError:
        raise ParseError(f"bad field value {raw!r}") from None


def parse_line(line: str) -> Point:
    i = _scan(line, 0, ", ")
    measurement = _unescape(line[:i], ", ")
    if not measurement:
        raise ParseError("missing measurement")
    tags: dict[str, str] = {}
    while i < len(line) and line[i] == ",":
        j = _scan(line, i + 1, "=")
        k = _scan(line, j + 1, ", ")
        key, value = line[i + 1 : j], line[j + 1 : k]
        if not key or not value or j >= len(line):
            raise ParseError(f"bad tag in {line!r}")
        tags[_unescape(key, ",= ")] = _unescape(value, ",= ")
        i = k
    if i >= len(line) or line[i] != " ":
        raise ParseError("missing fields")
    i += 1
    fields: dict[str, object] = {}
    while True:
        j = _scan(line, i, "=")
        key = _unescape(line[i:j], ",= ")
        k = j + 1
        if k < len(line) and line[k] == '"':
            k += 1
            while k < len(line) and line[k] != '"':
                k += 2 if line[k] == "\\" else 1
            k += 1
        else:
            while k < len(line) and line[k] not in ", ":
                k += 1
        fields[key] = _field_value(line[j + 1 : k])
        i = k
        if i < len(line) and line[i] == ",":
            i += 1
            continue
        break
    if i >= len(line) or line[i] != " ":
        raise ParseError("missing timestamp")
    try:
        ts = int(line[i + 1 :])
    except ValueError:
        raise ParseError("bad timestamp") from None
    return Point(measurement, tags, fields, ts)


def split_lines(body: str) -> list[str]:
    """Split a body into lines, keeping newlines inside quoted string fields.

    Quotes only count once the field section has started (after the first unescaped
    space), as a `"` inside a tag value is an ordinary character.
    """
    lines: list[str] = []
    start = 0
    in_fields = False
    quoted = False
    i = 0
    while i < len(body):
        ch = body[i]
        if ch == "\\":
            i += 2
            continue
        if ch == " " and not in_fields:
            in_fields = True
        elif ch == '"' and in_fields:
            quoted = not quoted
        elif ch == "\n" and not quoted:
            lines.append(body[start:i])
            start = i + 1
            in_fields = False
        i += 1
    lines.append(body[start:])
    return [ln for ln in lines if ln.strip() and not ln.startswith("#")]
