"""In-process InfluxDB write/query server (v1 `/write` + `/query`, v2 `/api/v2/write` +
`/api/v2/query`) for fault injection.

Stores points by (series key, time), overwriting on duplicates as InfluxDB does, and
counts overwrites. Misbehaves on command: any Fault (status, Retry-After, slow, reset),
413 above `max_body` bytes, and partial writes for lines `reject` selects — named in the
body (`unable to parse '<line>'`, as for parse errors) or unnamed (`field type conflict`),
with v1's 400 "partial write" / v2's 422, or v2's 400 "nothing written".
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

from tests.sinks.lp_parser import ParseError, Point, parse_line, split_lines
from tests.sinks.servers.http_base import FaultHandler, FaultServer

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
        self.reject_style: Literal["named", "unnamed", "all_or_nothing"] = "named"
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
        good: list[Point] = []
        bad: list[str] = []
        for line in split_lines(text):
            try:
                point = parse_line(line)
            except ParseError:
                bad.append(line)
                continue
            if srv.reject is not None and srv.reject(line):
                bad.append(line)
            else:
                good.append(point)
        style = srv.reject_style
        if bad and style == "all_or_nothing" and v2:
            msg = "; ".join(f"unable to parse '{ln}': invalid field format" for ln in bad)
            self.reply(400, json.dumps({"code": "invalid", "message": msg}).encode())
            return
        with srv.lock:
            srv.writes += 1
            for point in good:
                srv.store(point)
        if not bad:
            self.reply(204)
            return
        if style == "unnamed":
            reason = (
                'field type conflict: input field "x" on measurement "m" is type float, '
                f"already exists as type integer dropped={len(bad)}"
            )
        else:
            reason = "\n".join(f"unable to parse '{ln}': invalid field format" for ln in bad)
            reason += f" dropped={len(bad)}"
        if v2:
            self.reply(422, json.dumps({"code": "unprocessable entity",
                                        "message": f"partial write: {reason}"}).encode())
        else:
            self.reply(400, json.dumps({"error": f"partial write: {reason}"}).encode())

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
