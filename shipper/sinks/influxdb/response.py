"""How the InfluxDB sinks read an answer: of a write, whole-request failures (auth,
missing database or bucket, busy), the error text, and what a partial-write answer names
(the unparsable lines, `dropped=`, the field type conflict); of a read-back query, the
records in an InfluxQL or Flux answer.

Pure; no I/O. The decisions built on these (what is delivered, dead-lettered or sent
again) are in sink.py and docs/SHIPPER.md "Partial writes". Nothing here is an outcome
on its own: `field_probe` only decides how lines are grouped for the next request.
"""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import orjson

from shipper.sinks.base import Outcome, SinkError
from shipper.sinks.httputil import header, parse_retry_after
from shipper.sinks.influxdb.encode import escape_key, escape_measurement

UNABLE = re.compile(r"unable to parse '((?:[^'\\]|\\.|'(?! *:))*)'")
DROPPED = re.compile(r"dropped=(\d+)")
# influxd's reason for a refused point: `input field "F" on measurement "M" is type T`
CONFLICT = re.compile(r'input field "((?:[^"\\]|\\.)*)" on measurement "((?:[^"\\]|\\.)*)"')


def whole_failure(status: int, body: str, headers: Mapping[str, str]) -> SinkError | None:
    """The SinkError for an answer about the whole request (auth, missing db, busy)."""
    if 200 <= status < 300:
        return None
    reason = f"HTTP {status}: {error_text(body)}"
    if status in (401, 403):
        return SinkError(Outcome.HOLD, f"not authorised: {reason}")
    if status == 404 or (status == 400 and "retention policy not found" in body):
        return SinkError(Outcome.HOLD, f"database/bucket missing: {reason}")
    if status == 429 or status >= 500 or status == 408:
        return SinkError(Outcome.RETRY, reason, parse_retry_after(header(headers, "Retry-After")))
    return None


def field_probe(measurement: str, field: str) -> Callable[[bytes], bool]:
    """Does an encoded line write `field` on `measurement`? (A guess that only decides
    how lines are grouped for the next request, never an outcome.)"""
    head = escape_measurement(measurement).encode()
    key = escape_key(field).encode() + b"="
    starts = (head + b",", head + b" ")

    def probe(line: bytes) -> bool:
        return line.startswith(starts) and (b" " + key in line or b"," + key in line)

    return probe


def error_text(body: str) -> str:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body.strip()[:2000]
    if isinstance(data, dict):
        for key in ("error", "message"):
            if isinstance(data.get(key), str):
                return str(data[key])
    return body.strip()[:2000]


def line_reason(text: str, line: bytes) -> str:
    decoded = line.decode("utf-8", "replace")
    for part in re.split(r"\n|; ", text):
        if decoded in part:
            tail = part.split(decoded, 1)[1].lstrip("': ")
            return f"rejected by InfluxDB: {tail[:300] or part[:300]}"
    return f"rejected by InfluxDB: {text[:300]}"


def in_range(
    records: Iterator[Mapping[str, Any]], start_ns: int, end_ns: int
) -> Iterator[Mapping[str, Any]]:
    """The records whose own time_ns is in [start_ns, end_ns) (points sit up to one window
    after their record, so read-back queries a wider range)."""
    for doc in records:
        t = doc.get("time_ns")
        if isinstance(t, int) and start_ns <= t < end_ns:
            yield doc


def influxql_records(line: bytes) -> Iterator[Mapping[str, Any]]:
    """The records in one line of a chunked InfluxQL answer (v1 read-back)."""
    if not line.strip():
        return
    data = orjson.loads(line)
    for result in data.get("results", []):
        if "error" in result:
            raise SinkError(Outcome.RETRY, f"query error: {result['error']}")
        for series in result.get("series", []):
            col = series["columns"].index("record")
            for row in series.get("values", []):
                if row[col] is not None:
                    yield orjson.loads(row[col])


def flux_records(data: bytes) -> Iterator[Mapping[str, Any]]:
    """The records in the `record` column of a Flux CSV answer (v2 read-back)."""
    value_col: int | None = None
    for row in csv.reader(io.StringIO(data.decode("utf-8"))):
        if not row:
            value_col = None
            continue
        if "_value" in row:
            value_col = row.index("_value")
            continue
        if value_col is not None and value_col < len(row) and row[value_col]:
            yield orjson.loads(row[value_col])
