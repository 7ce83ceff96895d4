"""InfluxDB line protocol: turning one audit record into one point, with exact escaping.

Point shape (one line per record):
    <prefix>_<kind>,event=..,gpu_uuid=..,host=..,job=..,pid=..,project=..,stream=..,user=..
        <value fields>,gpu_index=3i,record="<raw JSON>",record_id="..",seq=17i <point time>

- One record, one point. A point's key is measurement + tag set + time, and the tags
  cannot tell apart every pair of records of one cycle (three XIDs on one GPU, one pid on
  two MIG instances share all of them), so the point time is the record's `time_ns`
  plus a small offset taken from the record's own `seq`: `(seq mod slots) * step`
  (`PointTime`). `seq` is dense per host and stream (both are tags) and a cycle's records
  get consecutive seqs, so records of one cycle that share their tags get different
  times; cycles are far more than one window apart, so they never meet. A replayed
  record has the same seq, so it lands on its own point again (idempotent). Series
  cardinality does not grow: a tag unique per record (the record id) would make every
  record its own series, and InfluxDB 1.x refuses writes once a tag has 100,000 values
  (`max-values-per-tag`). InfluxDB keeps nanoseconds: 10^6 slots of 1 ns, so the point
  is less than 1 ms after the record. VictoriaMetrics keeps milliseconds: 1000 slots of
  1 ms (less than 1 s after; distinct while a cycle has under 1000 records that share
  their tags and cycles are at least 1 s apart, also across an exporter restart, whose
  first record waits for that). The record's exact time stays in the
  `record` field, which is what read-back selects on.
- Tags are an index for queries, not evidence: the evidence is the `record` string field,
  which carries the exact spooled JSON so `audit verify` can re-check the hash chain.
  user/project/job tags are optional (`identity_tags`): their cardinality is that of the
  cluster's users/projects/jobs, which is fine for most clusters and not for some.
- Numeric samples (`values`, gpu_seconds, energy_joules) are always written as floats, so
  a sample that happens to be whole in one record never conflicts with the same field's
  float type in another (a "field type conflict" would dead-letter good records).
  Counters that are integers by nature (seq, gpu_index, the XID code) are written as `i`.
- NaN and +-inf cannot be written. Records should not contain them; if one does, the
  field is omitted and a string field `nonfinite_fields="name,..."` names what was
  omitted: never a silent drop, and the raw record still holds the original text.
  Likewise two value names that sanitise to the same field key: the second is named in
  `unwritable_fields`.
- Tag values that line protocol cannot carry are sanitised (each control character, and
  each backslash that would escape a delimiter or end the value, becomes `_`); empty
  tag values are omitted, as line protocol forbids them.

This module must never drop a field silently and never do I/O.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_audit.errors import GpuAuditError

MAX_STRING_FIELD = 64 * 1024  # InfluxDB's limit on one string field value (bytes)

_MEAS_SPECIAL = frozenset(", ")
_KEY_SPECIAL = frozenset(",= ")
_FIXED_FIELDS = frozenset(
    {"seq", "record_id", "record", "nonfinite_fields", "unwritable_fields", "gpu_index", "xid"}
)
_TOP_LEVEL_FLOATS = ("gpu_seconds", "energy_joules")
# a schema-3 usage record's sums and extremes (docs/AUDIT.md), each a float field
_USAGE_FLOATS = ("dt", "n", "s", "c", "b", "i", "e", "pe", "ms", "gs", "gd", "gi", "ge",
                 "gpe", "gms", "gmx", "gmt", "gua", "gux")


class EncodeError(GpuAuditError, ValueError):
    """The record cannot become a point (missing time, too large): a dead letter."""


@dataclass(frozen=True)
class PointTime:
    """Where a record's point sits: time_ns + (seq mod slots) * step_ns."""

    slots: int
    step_ns: int

    @property
    def window_ns(self) -> int:
        """Every point lies in [time_ns, time_ns + window_ns)."""
        return self.slots * self.step_ns


INFLUX_POINT_TIME = PointTime(slots=1_000_000, step_ns=1)  # ns precision: < 1 ms
VICTORIAMETRICS_POINT_TIME = PointTime(slots=1000, step_ns=1_000_000)  # ms: < 1 s


def point_time_ns(doc: Mapping[str, Any], scheme: PointTime = INFLUX_POINT_TIME) -> int:
    """The point time of a record (its `time_ns` must be an int; without `seq`: time_ns)."""
    time_ns: int = doc["time_ns"]
    seq = doc.get("seq")
    if type(seq) is not int:
        return time_ns
    return time_ns + (seq % scheme.slots) * scheme.step_ns


_NEEDS_WORK = re.compile(r"[\x00-\x1f\x7f\\, =]")
_SLOW_PATH = re.compile(r"[\x00-\x1f\x7f\\]")
_MEAS_TABLE = str.maketrans({",": "\\,", " ": "\\ "})
_KEY_TABLE = str.maketrans({",": "\\,", " ": "\\ ", "=": "\\="})


def _escape(text: str, special: frozenset[str]) -> str:
    """Escape a measurement, tag key/value or field key.

    InfluxDB 1.x/2.x scan `\\x` as a pair and unescape only `\\,`, `\\=` and `\\ `, so a
    backslash right before a delimiter or at the very end cannot be represented: it
    becomes `_`. Control characters (a newline would end the line) become `_` too.
    """
    if not _NEEDS_WORK.search(text):
        return text
    if not _SLOW_PATH.search(text):
        return text.translate(_MEAS_TABLE if special is _MEAS_SPECIAL else _KEY_TABLE)
    out: list[str] = []
    last = len(text) - 1
    for i, ch in enumerate(text):
        if ch < " " or ch == "\x7f":
            out.append("_")
        elif ch == "\\":
            nxt = text[i + 1] if i < last else ""
            out.append("_" if nxt == "" or nxt in _KEY_SPECIAL else "\\")
        elif ch in special:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


@functools.lru_cache(maxsize=8192)
def escape_measurement(name: str) -> str:
    return _escape(name, _MEAS_SPECIAL)


@functools.lru_cache(maxsize=65536)
def escape_key(key: str) -> str:
    """Tag keys, tag values and field keys."""
    return _escape(key, _KEY_SPECIAL)


def escape_string_field(value: str) -> str:
    """A double-quoted string field value: `"` and `\\` escaped; newlines are legal inside."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _tag_value(value: Any) -> str | None:
    if value is None or isinstance(value, (dict, list)):
        return None
    text = str(value)
    return text if text != "" else None


def _event_name(doc: Mapping[str, Any]) -> Any:
    event = doc.get("event")
    if isinstance(event, Mapping):
        return event.get("type") or event.get("name")
    return event


def measurement_for(doc: Mapping[str, Any], prefix: str) -> str:
    kind = str(doc.get("kind") or "record")
    return f"{prefix}_{kind}"


def _sub(doc: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = doc.get(key)
    # `type(...) is dict` first: decoded JSON is always a plain dict, and an ABC
    # isinstance check costs more than the rest of the lookup
    return value if type(value) is dict or isinstance(value, Mapping) else _EMPTY


_EMPTY: Mapping[str, Any] = {}
# Tag keys in the order InfluxDB stores them (sorted); none of them needs escaping.
_TAG_ORDER = ("event", "gpu_uuid", "host", "job", "pid", "project", "stream", "user")
_IDENTITY = frozenset({"user", "project", "job"})


def record_tags(doc: Mapping[str, Any], *, identity_tags: bool) -> dict[str, str]:
    """The tag set of a record (unescaped; empty values left out), in sorted key order."""
    gpu = _sub(doc, "gpu")
    proc = _sub(doc, "process")
    # a schema-3 usage record names its GPU and holder at the top level
    usage = doc.get("kind") == "usage"
    attribution = doc if usage else _sub(doc, "attribution")
    candidates: dict[str, Any] = {
        "event": _event_name(doc) if doc.get("kind") == "event" else None,
        "gpu_uuid": doc.get("uuid") if usage else gpu.get("uuid"),
        "host": doc.get("host"),
        "pid": proc.get("pid"),
        "stream": doc.get("stream"),
    }
    if identity_tags:
        for key in ("user", "project", "job"):
            candidates[key] = attribution.get(key)
    tags: dict[str, str] = {}
    for key in _TAG_ORDER:
        value = candidates.get(key)
        if value is None:
            continue
        if type(value) is str:
            if value:
                tags[key] = value
            continue
        text = _tag_value(value)
        if text is not None:
            tags[key] = text
    return tags


def _tag_set(tags: Mapping[str, str]) -> str:
    """`,key=value,...` with escaped values, keys in sorted order."""
    parts = []
    for key, value in tags.items():
        # integers (pid) never need escaping and would only churn the escape cache
        parts.append(f",{key}={value if value.isdigit() else escape_key(value)}")
    return "".join(parts)


def encode_record(
    doc: Mapping[str, Any],
    raw: bytes,
    record_id: str,
    *,
    prefix: str = "gpu_audit",
    identity_tags: bool = True,
    point_time: PointTime = INFLUX_POINT_TIME,
) -> bytes:
    """One line (without the trailing newline) for one audit record.

    Raises EncodeError when the record has no integer `time_ns` or its raw JSON is larger
    than InfluxDB accepts in one string field.
    """
    time_ns = doc.get("time_ns")
    if type(time_ns) is not int and (not isinstance(time_ns, int) or isinstance(time_ns, bool)):
        raise EncodeError("record has no integer time_ns")
    raw_text = raw.decode("utf-8")  # also proves the bytes are UTF-8
    if len(raw) > MAX_STRING_FIELD:
        raise EncodeError(
            f"record is {len(raw)} bytes; InfluxDB string fields hold at most {MAX_STRING_FIELD}"
        )

    fields: dict[str, str] = {}  # escaped key -> encoded value
    nonfinite: list[str] = []
    unwritable: list[str] = []

    def put_float(name: str, value: Any) -> None:
        kind = type(value)
        if (kind is not float and kind is not int) and (
            isinstance(value, bool) or not isinstance(value, (int, float))
        ):
            return
        if not math.isfinite(value):
            nonfinite.append(name)
            return
        key = escape_key(name)
        if key in fields:
            # two names that sanitise to the same key: keep the first, name the other
            unwritable.append(name)
            return
        fields[key] = repr(value) if kind is float else repr(float(value))

    values = doc.get("values")
    if type(values) is dict or isinstance(values, Mapping):
        for name, value in values.items():
            key = name if type(name) is str else str(name)
            put_float(f"value_{key}" if key in _FIXED_FIELDS else key, value)
    for name in _TOP_LEVEL_FLOATS:
        if name in doc and name not in fields:
            put_float(name, doc[name])
    if doc.get("kind") == "usage":
        for name in _USAGE_FLOATS:
            if name in doc:
                put_float(name, doc[name])
    gpu = _sub(doc, "gpu")
    index = doc.get("idx") if doc.get("kind") == "usage" else gpu.get("index")
    if isinstance(index, int):
        fields["gpu_index"] = f"{index}i"
    xid = doc.get("xid")
    if isinstance(xid, Mapping):  # an xid event: {"code", "time", "time_ns"}
        xid = xid.get("code")
    if isinstance(xid, int) and not isinstance(xid, bool):
        fields["xid"] = f"{xid}i"
    seq = doc.get("seq")
    if isinstance(seq, int) and not isinstance(seq, bool):
        fields["seq"] = f"{seq}i"
    fields["record_id"] = escape_string_field(record_id)
    fields["record"] = escape_string_field(raw_text)
    if nonfinite:
        fields["nonfinite_fields"] = escape_string_field(",".join(sorted(nonfinite)))
    if unwritable:
        fields["unwritable_fields"] = escape_string_field(",".join(sorted(unwritable)))

    # sorted tags are what InfluxDB stores; sending them sorted saves it the work
    head = escape_measurement(measurement_for(doc, prefix)) + _tag_set(
        record_tags(doc, identity_tags=identity_tags)
    )
    body = ",".join([f"{k}={fields[k]}" for k in sorted(fields)])
    return f"{head} {body} {point_time_ns(doc, point_time)}".encode()
