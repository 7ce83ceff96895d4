"""In-process InfluxDB write/query server (v1 `/write` + `/query`, v2 `/api/v2/write` +
`/api/v2/query`) for fault injection.

Stores points by (series key, time), overwriting on duplicates as InfluxDB does, and
counts overwrites. Field types are kept per (measurement, field) as one InfluxDB shard
keeps them: a point whose field has another type is refused with InfluxDB's own
"field type conflict" reason. Answers follow the real servers (influxd 1.x
services/httpd/handler.go, InfluxDB 2.x's write handler):
- v1, lines that do not parse (or that `reject` selects, style "named"): the others are
  stored and the answer is 400 `partial write: unable to parse '<line>': <why>` (one
  per line, joined by newlines) ` dropped=0`: influxd counts only refused *points* in
  `dropped`, and an unparsed line is not a point;
- v1, points refused on write (type conflicts, or `reject` with style "unnamed"): the
  others are stored; 400 `partial write: <first reason> dropped=<n>`: only the first
  reason is named, and when this happens any parse errors of the same body go unmentioned;
- v2 (InfluxDB 2.x), a line that does not parse: 400, nothing stored; points refused on
  write: 422 `failure writing points to database: partial write: <reason> dropped=<n>`,
  the others stored.
Also misbehaves on command: any Fault (status, Retry-After, slow, reset), `write_status`
(answer the Nth write request with a status instead), and 413 above `max_body` bytes.
"""

from __future__ import annotations

import base64
import csv
import io
import json
import re
from collections.abc import Callable
from typing import Literal
from urllib.parse import parse_qs, urlparse

from tests.shipper.sinks.influxdb.lp_parser import ParseError, Point, parse_line, split_lines
from tests.shipper.sinks.servers.http_base import FaultHandler, FaultServer

Key = tuple[tuple[str, tuple[tuple[str, str], ...]], int]


class InfluxServer(FaultServer):
    def __init__(self, *, databases: tuple[str, ...] = ("audit",)) -> None:
        super().__init__(_Handler)
        self.databases = set(databases)
        self.points: dict[Key, Point] = {}
        self.overwrites = 0
        self.writes = 0
        self.bodies: list[bytes] = []
        self.encodings: list[str] = []
        self.max_body: int | None = None
        self.reject: Callable[[str], bool] | None = None
        # which lines `reject` selects: "named" = they fail to parse, "unnamed" = they
        # are refused on write (influxd's field type conflict reason, naming no line)
        self.reject_style: Literal["named", "unnamed"] = "named"
        self.field_types: dict[tuple[str, str], str] = {}  # (measurement, field) -> type
        self.write_status: dict[int, int] = {}  # write request number (from 1) -> status
        self.write_requests = 0
        self.token: str | None = None
        self.basic: tuple[str, str] | None = None

    def store(self, point: Point) -> None:
        key = (point.series_key, point.time)
        if key in self.points:
            self.overwrites += 1
            merged = {**self.points[key].fields, **point.fields}
            point = Point(point.measurement, point.tags, merged, point.time)
        self.points[key] = point

    def records(self) -> list[dict[str, object]]:
        return [json.loads(str(p.fields["record"])) for p in self.points.values()]


class _Handler(FaultHandler):
    server: InfluxServer

    def _authorised(self, query: dict[str, list[str]]) -> bool:
        auth = self.headers.get("Authorization", "")
        if self.server.token is not None and auth != f"Token {self.server.token}":
            return False
        if self.server.basic is not None:
            user, password = self.server.basic
            expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
            via_query = query.get("u") == [user] and query.get("p") == [password]
            if auth != expected and not via_query:
                return False
        return True

    def do_GET(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        if self.apply_fault():
            return
        if url.path == "/ping":
            self.reply(204)
        elif url.path == "/query":
            self._v1_query(query)
        else:
            self.reply(404, b'{"error":"not found"}')

    def do_POST(self) -> None:
        url = urlparse(self.path)
        query = parse_qs(url.query)
        body = self.read_body()
        if self.apply_fault():
            return
        if not self._authorised(query):
            self.reply(401, b'{"error":"authorization failed"}')
            return
        if url.path == "/write":
            self._write(body, query.get("db", [""])[0], v2=False)
        elif url.path == "/api/v2/write":
            self._write(body, query.get("bucket", [""])[0], v2=True)
        elif url.path == "/api/v2/query":
            self._v2_query(body)
        elif url.path == "/query":
            self._v1_query(query)
        else:
            self.reply(404, b'{"error":"not found"}')

    def _write(self, body: bytes, db: str, *, v2: bool) -> None:
        srv = self.server
        with srv.lock:
            srv.bodies.append(body)
            srv.encodings.append(self.headers.get("Content-Encoding", ""))
            srv.write_requests += 1
            forced = srv.write_status.get(srv.write_requests)
        if forced is not None:
            self.reply(forced, json.dumps({"error": f"forced HTTP {forced}"}).encode())
            return
        if db not in srv.databases:
            what = "bucket" if v2 else "database"
            self.reply(404, json.dumps({"code": "not found",
                                        "error": f'{what} not found: "{db}"',
                                        "message": f'{what} "{db}" not found'}).encode())
            return
        if srv.max_body is not None and len(body) > srv.max_body:
            self.reply(413, b'{"error":"Request Entity Too Large"}')
            return
        text = body.decode("utf-8")
        parsed: list[tuple[str, Point]] = []
        unparsed: list[str] = []
        for line in split_lines(text):
            try:
                point = parse_line(line)
            except ParseError:
                unparsed.append(line)
                continue
            if srv.reject is not None and srv.reject_style != "unnamed" and srv.reject(line):
                unparsed.append(line)
            else:
                parsed.append((line, point))
        if unparsed and (v2 or not parsed):
            # v2: all or nothing; v1 with no point parsed: a plain 400, not a partial write
            msg = "\n".join(f"unable to parse '{ln}': invalid field format" for ln in unparsed)
            key = "message" if v2 else "error"
            self.reply(400, json.dumps({"code": "invalid", key: msg}).encode())
            return
        dropped = 0
        reason = ""
        with srv.lock:
            srv.writes += 1
            for line, point in parsed:
                why = self._refusal(line, point)
                if why is not None:
                    dropped += 1
                    reason = reason or why
                    continue
                for field, value in point.fields.items():
                    srv.field_types.setdefault((point.measurement, field), _type(value))
                srv.store(point)
        if dropped:
            partial = f"partial write: {reason} dropped={dropped}"
            if v2:
                self.reply(422, json.dumps({
                    "code": "unprocessable entity",
                    "message": f"failure writing points to database: {partial}"}).encode())
            else:
                self.reply(400, json.dumps({"error": partial}).encode())
        elif unparsed:
            names = "\n".join(f"unable to parse '{ln}': invalid field format" for ln in unparsed)
            self.reply(400, json.dumps({"error": f"partial write: {names} dropped=0"}).encode())
        else:
            self.reply(204)

    def _refusal(self, line: str, point: Point) -> str | None:
        """Why influxd would refuse this parsed point on write, or None (lock held)."""
        srv = self.server
        if srv.reject is not None and srv.reject_style == "unnamed" and srv.reject(line):
            return ('field type conflict: input field "x" on measurement "m" is type float, '
                    "already exists as type integer")
        for field, value in point.fields.items():
            have = srv.field_types.get((point.measurement, field))
            if have is not None and have != _type(value):
                return (f'field type conflict: input field "{field}" on measurement '
                        f'"{point.measurement}" is type {_type(value)}, already exists as '
                        f"type {have}")
        return None

    def _in_range(self, start: int, end: int) -> list[Point]:
        with self.server.lock:
            points = [p for (_, t), p in self.server.points.items() if start <= t < end]
        return sorted(points, key=lambda p: p.time)

    def _v1_query(self, query: dict[str, list[str]]) -> None:
        q = query.get("q", [""])[0]
        m = re.search(r"time >= (\d+) AND time < (\d+)", q)
        if not m:
            self.reply(400, b'{"error":"unsupported query"}')
            return
        points = self._in_range(int(m.group(1)), int(m.group(2)))
        by_measurement: dict[str, list[list[object]]] = {}
        for p in points:
            by_measurement.setdefault(p.measurement, []).append([p.time, p.fields.get("record")])
        # chunked answers: one JSON document per line, one per series
        lines = [
            json.dumps({"results": [{"statement_id": 0, "series": [
                {"name": name, "columns": ["time", "record"], "values": rows}]}]})
            for name, rows in by_measurement.items()
        ] or [json.dumps({"results": [{"statement_id": 0}]})]
        self.reply(200, ("\n".join(lines) + "\n").encode())

    def _v2_query(self, body: bytes) -> None:
        flux = json.loads(body)["query"]
        m = re.search(r"time\(v: (\d+)\).*time\(v: (\d+)\)", flux)
        if not m:
            self.reply(400, b'{"message":"unsupported query"}')
            return
        out = io.StringIO()
        writer = csv.writer(out)
        writer.writerow(["", "result", "table", "_time", "_value"])
        for p in self._in_range(int(m.group(1)), int(m.group(2))):
            writer.writerow(["", "_result", "0", str(p.time), p.fields.get("record")])
        self.reply(200, out.getvalue().encode(), content_type="text/csv")


def _type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "float"
    return "string"
