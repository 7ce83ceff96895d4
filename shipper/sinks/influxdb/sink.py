"""InfluxDB sinks: the v1 write API (`/write`) and the v2 API (`/api/v2/write`, which
InfluxDB 3 and VictoriaMetrics accept too), one point per audit record.

Why urllib3 and not influxdb-client: classifying a write needs the exact status code and
error body of every request (partial writes name the rejected lines, 413 means split,
401/404 mean hold), and the batching WriteApi loses its buffer on exit, drops NaN fields
silently and retries on its own. urllib3 gives us the raw answer with nothing in between.

Outcomes (what influxd 1.x and InfluxDB 2.x really answer; see docs/SHIPPER.md):
- 2xx: every line delivered.
- Lines the server could not parse. v1 stores every other line and answers 400 `partial
  write: unable to parse '<line>': <why>` (one per line) ` dropped=0`: the named lines are
  dead letters, the others DELIVERED, nothing is sent again. v2 (2.x) stores nothing
  (400): the named lines are dead letters and the others are sent again.
- Points refused on write (field type conflict, beyond retention): v1 400 `partial write:
  <first reason> dropped=<n>`, v2 422; the other lines were stored, but the answer names
  no line, and influxd reports only the first failing shard. So nothing is assumed: when
  `dropped` equals the lines sent, all were refused (dead letters); otherwise the lines
  that can have the named conflict (measurement and field) and the rest go again as two
  requests (the rest is rewritten onto its own points and confirmed), and an answer that
  names nothing usable is bisected until each refused line stands alone.
- 413: the batch is split in halves and resent; a single line too large is a dead letter.
- 401/403 and 404 (database / bucket not found): SinkError(HOLD).
- 429, 5xx, timeouts and connection errors: SinkError(RETRY, Retry-After) when the first
  request fails; on a follow-up request, the lines not yet settled get that outcome and
  the ones already settled keep theirs (they are not sent again).
Every line put on the wire more than once within a send is reported in
`ItemResult.sends`, so the worker counts it as redelivered. Replays are harmless: a point's
series key and time are the record's own, so a resent line overwrites itself.

This module must never drop a record without a per-record outcome, and never log a
password or token (the URL may carry `p=`; reasons are redacted).
"""

from __future__ import annotations

import abc
import base64
import dataclasses
import gzip
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

import orjson
import urllib3
from pydantic import SecretStr

from gpu_audit.errors import GpuAuditError
from shipper.sinks.base import ItemResult, Outcome, SinkError, SinkRecord
from shipper.sinks.errors import ReadBackUnsupported
from shipper.sinks.httputil import exception_reason, header, make_pool, parse_retry_after
from shipper.sinks.influxdb.config import InfluxV1SinkConfig, InfluxV2SinkConfig
from shipper.sinks.influxdb.encode import (
    INFLUX_POINT_TIME,
    VICTORIAMETRICS_POINT_TIME,
    EncodeError,
    PointTime,
    encode_record,
)
from shipper.sinks.influxdb.response import (
    CONFLICT,
    DROPPED,
    UNABLE,
    error_text,
    field_probe,
    flux_records,
    in_range,
    influxql_records,
    line_reason,
    whole_failure,
)

_Line = tuple[int, bytes]  # (index in the batch, encoded line)


class _Send:
    """One send() call: an outcome and a count of wire sends per record of the batch."""

    def __init__(self, n: int) -> None:
        self.results: list[ItemResult | None] = [None] * n
        self.sends = [0] * n
        self.requests = 0


class _Unsettled(GpuAuditError):
    """A follow-up request failed as a whole: stop sending, settle what is left with it."""

    def __init__(self, error: SinkError) -> None:
        super().__init__(error.reason)
        self.error = error


class _InfluxSink(abc.ABC):
    kind = ""

    def __init__(
        self,
        cfg: InfluxV1SinkConfig | InfluxV2SinkConfig,
        name: str,
        *,
        pool: urllib3.PoolManager | None = None,
    ) -> None:
        self.name = name
        self._cfg = cfg
        self._base = cfg.url.rstrip("/")
        self._pool = pool or make_pool(cfg.tls, cfg.timeout_s, https=cfg.url.startswith("https"))

    # -- per protocol -------------------------------------------------------------
    @abc.abstractmethod
    def _write_request(self) -> tuple[str, dict[str, str], dict[str, str]]:
        """Path, query parameters and headers of a write for this API version."""

    @abc.abstractmethod
    def _partial_kept(self, status: int, body: str) -> bool:
        """Did the server keep the lines it did not reject?"""

    @property
    def point_time(self) -> PointTime:
        """Where this backend's points sit (its timestamp precision decides)."""
        return INFLUX_POINT_TIME

    # -- the shape every sink has -------------------------------------------------
    def start(self) -> None:  # noqa: B027 - a real no-op, not a missing override
        """Nothing to install; connectivity and auth show on the first write."""

    def close(self) -> None:
        self._pool.clear()

    def send(self, batch: Sequence[SinkRecord]) -> Sequence[ItemResult]:
        state = _Send(len(batch))
        lines: list[_Line] = []
        for i, rec in enumerate(batch):
            try:
                line = encode_record(
                    rec.doc,
                    rec.raw,
                    rec.record_id,
                    prefix=self._cfg.measurement_prefix,
                    identity_tags=self._cfg.identity_tags,
                    point_time=self.point_time,
                )
            except (EncodeError, UnicodeDecodeError) as exc:
                state.results[i] = ItemResult(
                    Outcome.DEAD_LETTER, f"line protocol: {exc}", sends=0
                )
                continue
            lines.append((i, line))
        try:
            self._write_group(lines, state)
        except _Unsettled as exc:
            # a follow-up request failed: what is settled stays settled (not sent again)
            err = exc.error
            for i, _ in lines:
                if state.results[i] is None:
                    state.results[i] = ItemResult(err.outcome, err.reason, err.retry_after)
        out: list[ItemResult] = []
        for r, sends in zip(state.results, state.sends, strict=True):
            # every line ends in a result or a raised SinkError; a gap is a bug, not a drop
            assert r is not None, "influx sink left a record without an outcome"
            out.append(r if r.sends == sends else dataclasses.replace(r, sends=sends))
        return out

    def _post(self, body: bytes) -> tuple[int, str, Mapping[str, str]]:
        path, params, headers = self._write_request()
        headers = {**headers, "Content-Type": "text/plain; charset=utf-8"}
        if self._cfg.gzip:
            body = gzip.compress(body, compresslevel=1)
            headers["Content-Encoding"] = "gzip"
        url = self._base + path + "?" + urlencode(params)
        try:
            resp = self._pool.request("POST", url, body=body, headers=headers, retries=False)
        except urllib3.exceptions.HTTPError as exc:
            raise SinkError(Outcome.RETRY, exception_reason(exc)) from None
        return resp.status, resp.data.decode("utf-8", "replace"), resp.headers

    def _write_group(self, group: list[_Line], state: _Send) -> None:
        if not group:
            return
        first = state.requests == 0
        state.requests += 1
        for i, _ in group:
            state.sends[i] += 1
        try:
            status, body, headers = self._post(b"\n".join(line for _, line in group) + b"\n")
            whole = whole_failure(status, body, headers)
        except SinkError as exc:
            whole = exc
        if whole is not None:
            if first:
                raise whole
            raise _Unsettled(whole) from None
        if 200 <= status < 300:
            for i, _ in group:
                state.results[i] = ItemResult(Outcome.DELIVERED)
            return
        reason = f"HTTP {status}: {error_text(body)}"
        if status == 413:
            if len(group) == 1:
                state.results[group[0][0]] = ItemResult(
                    Outcome.DEAD_LETTER, f"line larger than the server accepts: {reason}"
                )
                return
            half = len(group) // 2
            self._write_group(group[:half], state)
            self._write_group(group[half:], state)
            return
        if status in (400, 422):
            self._partial(group, state, status, body, reason)
            return
        # any other 4xx is a property of these lines: isolate and quarantine them
        self._split(group, state, error_text(body), reason)

    def _partial(
        self, group: list[_Line], state: _Send, status: int, body: str, reason: str
    ) -> None:
        kept = self._partial_kept(status, body)
        text = error_text(body)
        named = {m.group(1) for m in UNABLE.finditer(text)}
        dropped_match = DROPPED.search(text)
        dropped = int(dropped_match.group(1)) if dropped_match else None
        rejected = [
            (i, line) for i, line in group if line.decode("utf-8", "replace") in named
        ]
        if rejected and len(rejected) == len(named):
            rejected_idx = {i for i, _ in rejected}
            for i, line in rejected:
                state.results[i] = ItemResult(Outcome.DEAD_LETTER, line_reason(text, line))
            rest = [(i, line) for i, line in group if i not in rejected_idx]
            # influxd names unparsable lines only when every parsed point was stored, and
            # counts them in `dropped` as 0 (they are no points): the rest is stored
            if kept and dropped in (None, 0, len(rejected)):
                for i, _ in rest:
                    state.results[i] = ItemResult(Outcome.DELIVERED)
            else:
                self._write_group(rest, state)
            return
        if kept and dropped == len(group):
            # every line sent was refused: nothing to find out by sending them again
            for i, _ in group:
                state.results[i] = ItemResult(Outcome.DEAD_LETTER, reason)
            return
        self._split(group, state, text, reason)

    def _split(self, group: list[_Line], state: _Send, text: str, reason: str) -> None:
        """Lines refused without their names: send again in parts until each refused
        line stands alone. Lines the server had kept are rewritten onto themselves."""
        if len(group) == 1:
            state.results[group[0][0]] = ItemResult(Outcome.DEAD_LETTER, reason)
            return
        conflict = CONFLICT.search(text)
        if conflict is not None:
            suspect = field_probe(conflict.group(2), conflict.group(1))
            suspects = [(i, line) for i, line in group if suspect(line)]
            if 0 < len(suspects) < len(group):
                # the lines that cannot have this conflict are most likely stored: one
                # request confirms them; the suspects most likely all fail again
                chosen = {i for i, _ in suspects}
                self._write_group([g for g in group if g[0] not in chosen], state)
                self._write_group(suspects, state)
                return
        half = len(group) // 2
        self._write_group(group[:half], state)
        self._write_group(group[half:], state)

    @abc.abstractmethod
    def read_back(self, start_ns: int, end_ns: int) -> Iterator[Mapping[str, Any]]:
        """The records the backend holds with time in [start_ns, end_ns)."""


class InfluxV1Sink(_InfluxSink):
    kind = "influxdb_v1"

    def __init__(
        self,
        cfg: InfluxV1SinkConfig,
        name: str,
        *,
        password: SecretStr | None = None,
        pool: urllib3.PoolManager | None = None,
    ) -> None:
        super().__init__(cfg, name, pool=pool)
        self._v1 = cfg
        self._password = password

    def _auth(self) -> tuple[dict[str, str], dict[str, str]]:
        cfg = self._v1
        if cfg.username is None:
            return {}, {}
        secret = self._password.get_secret_value() if self._password else ""
        if cfg.auth == "query":
            return {"u": cfg.username, "p": secret}, {}
        token = base64.b64encode(f"{cfg.username}:{secret}".encode()).decode()
        return {}, {"Authorization": f"Basic {token}"}

    def _write_request(self) -> tuple[str, dict[str, str], dict[str, str]]:
        params, headers = self._auth()
        params = {"db": self._v1.database, "precision": "ns", **params}
        if self._v1.retention_policy:
            params["rp"] = self._v1.retention_policy
        return "/write", params, headers

    def _partial_kept(self, status: int, body: str) -> bool:
        return "partial write" in body

    def start(self) -> None:
        """An empty write proves the server answers, the credentials and the database."""
        status, body, headers = self._post(b"")
        if 200 <= status < 300:
            return
        if status in (401, 403):
            raise SinkError(Outcome.HOLD, f"not authorised: HTTP {status}: {error_text(body)}")
        if status == 404:
            raise SinkError(Outcome.HOLD, f"database missing: HTTP {status}: {error_text(body)}")
        raise SinkError(
            Outcome.RETRY,
            f"HTTP {status}: {error_text(body)}",
            parse_retry_after(header(headers, "Retry-After")),
        )

    def read_back(self, start_ns: int, end_ns: int) -> Iterator[Mapping[str, Any]]:
        """InfluxQL over `/query` (epoch=ns, chunked) for the `record` field in range."""
        cfg = self._v1
        source = f"/^{cfg.measurement_prefix}_/"
        if cfg.retention_policy:
            source = f'"{cfg.retention_policy}".{source}'
        # only integers and the validated prefix/rp go into the query text
        # a point sits up to one window after its record's time: widen, then select on
        # the record's own time_ns below
        query = (
            f'SELECT "record" FROM {source} '  # noqa: S608
            f"WHERE time >= {int(start_ns)} AND time < {int(end_ns) + self.point_time.window_ns}"
        )
        params, headers = self._auth()
        params = {
            "db": cfg.database, "q": query, "epoch": "ns", "chunked": "true",
            "chunk_size": "10000", **params,
        }
        url = self._base + "/query?" + urlencode(params)
        try:
            resp = self._pool.request(
                "GET", url, headers=headers, preload_content=False, retries=False
            )
        except urllib3.exceptions.HTTPError as exc:
            raise SinkError(Outcome.RETRY, exception_reason(exc)) from None
        try:
            if resp.status != 200:
                raise SinkError(
                    Outcome.RETRY, f"query HTTP {resp.status}: {error_text(resp.data.decode())}"
                )
            buffer = b""
            for chunk in resp.stream(65536):
                buffer += chunk
                *complete, buffer = buffer.split(b"\n")
                for line in complete:
                    yield from in_range(influxql_records(line), start_ns, end_ns)
            yield from in_range(influxql_records(buffer), start_ns, end_ns)
        finally:
            resp.release_conn()


class InfluxV2Sink(_InfluxSink):
    kind = "influxdb_v2"

    def __init__(
        self,
        cfg: InfluxV2SinkConfig,
        name: str,
        *,
        token: SecretStr | None = None,
        pool: urllib3.PoolManager | None = None,
    ) -> None:
        super().__init__(cfg, name, pool=pool)
        self._v2 = cfg
        self._token = token

    def _headers(self) -> dict[str, str]:
        if self._token is None:
            return {}
        return {"Authorization": f"Token {self._token.get_secret_value()}"}

    def _write_request(self) -> tuple[str, dict[str, str], dict[str, str]]:
        params = {"bucket": self._v2.bucket, "precision": "ns"}
        if self._v2.org:
            params["org"] = self._v2.org
        return "/api/v2/write", params, self._headers()

    def _partial_kept(self, status: int, body: str) -> bool:
        # v2: 422 = some points rejected, the others stored; 400 = the whole batch refused
        return status == 422

    @property
    def point_time(self) -> PointTime:
        if self._v2.flavour == "victoriametrics":
            return VICTORIAMETRICS_POINT_TIME
        return INFLUX_POINT_TIME

    def read_back(self, start_ns: int, end_ns: int) -> Iterator[Mapping[str, Any]]:
        """Flux over `/api/v2/query` (real InfluxDB 2); not possible on VictoriaMetrics."""
        if self._v2.flavour == "victoriametrics":
            raise ReadBackUnsupported(
                f"sink {self.name}: VictoriaMetrics keeps only numeric fields, not the "
                "`record` string field, so records cannot be read back from it; verify "
                "against another sink (archive, Elasticsearch, InfluxDB)"
            )
        flux = (
            f'from(bucket: {orjson.dumps(self._v2.bucket).decode()})'
            f" |> range(start: time(v: {int(start_ns)}),"
            f" stop: time(v: {int(end_ns) + self.point_time.window_ns}))"
            f' |> filter(fn: (r) => r._measurement =~ /^{self._v2.measurement_prefix}_/'
            ' and r._field == "record")'
            ' |> keep(columns: ["_time", "_value"])'
        )
        params = {"org": self._v2.org} if self._v2.org else {}
        url = self._base + "/api/v2/query?" + urlencode(params)
        body = orjson.dumps(
            {"query": flux, "type": "flux",
             "dialect": {"header": True, "annotations": [], "delimiter": ","}}
        )
        headers = {**self._headers(), "Content-Type": "application/json",
                   "Accept": "application/csv"}
        try:
            resp = self._pool.request("POST", url, body=body, headers=headers, retries=False)
        except urllib3.exceptions.HTTPError as exc:
            raise SinkError(Outcome.RETRY, exception_reason(exc)) from None
        if resp.status != 200:
            raise SinkError(
                Outcome.RETRY, f"query HTTP {resp.status}: {error_text(resp.data.decode())}"
            )
        yield from in_range(flux_records(resp.data), start_ns, end_ns)
