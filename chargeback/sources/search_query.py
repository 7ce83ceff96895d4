"""The search source's queries: what it asks Elasticsearch/OpenSearch (request bodies,
composite-aggregation paging) and how to connect; chargeback/sources/search.py adds the
answers up into a bill and chargeback/sources/search_chains.py proves the trail complete
from the same pager."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from chargeback.model import Request, SourceData
from gpu_audit.errors import GpuAuditError
from gpu_audit.rules import IDLE_UTILIZATION
from gpu_audit.tls import TlsConfig

PAGE_SIZE = 1000
UNKNOWN_MODEL = "unknown"
POWER_SCRIPT = (
    "doc['values.power_usage_watts'].size() == 0 || doc['elapsed_seconds'].size() == 0"
    " ? 0.0 : doc['values.power_usage_watts'].value * doc['elapsed_seconds'].value"
)


class SearchUnavailable(GpuAuditError):
    """The search backend could not be asked, or answered with an error."""


class SearchClient(Protocol):
    """What this source needs of a client: one `_search` call."""

    def search(self, index: str, body: dict[str, Any]) -> Mapping[str, Any]: ...

    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class SearchSettings:
    """Where the records are: what the configuration's search sink says (read by the
    app layer, gpu_audit_app/chargeback_config.py, since sink configuration is the
    shipper's). Secrets arrive already read, never as names."""

    kind: str  # "elasticsearch" | "opensearch"
    hosts: tuple[str, ...]
    index: str  # "<index_prefix>-*" (daily) or the data stream's name
    cloud_id: str | None = None
    username: str | None = None
    password: str | None = None
    api_key: str | None = None
    tls: TlsConfig = field(default_factory=TlsConfig)
    timeout_s: float = 30.0

    def describe(self) -> str:
        where = f"cloud_id {self.cloud_id}" if self.cloud_id else ", ".join(self.hosts)
        return f"{self.kind} {where} index {self.index}"


# --- request bodies ------------------------------------------------------------------


def _filters(req: Request, kind: str) -> list[dict[str, Any]]:
    start_ns = _ns(req.start)
    end_ns = _ns(req.end)
    out: list[dict[str, Any]] = [
        {"range": {"time_ns": {"gt": start_ns, "lte": end_ns}}},
        {"term": {"kind": kind}},
    ]
    return out


def _not_simulated(req: Request) -> list[dict[str, Any]]:
    return [] if req.include_simulated else [{"term": {"simulated": True}},
                                             {"term": {"sim": True}}]


def _day_source() -> dict[str, Any]:
    # a record at T accounts for (T - elapsed, T]: one at midnight sharp closes the day
    # before, so days start 1 ms after midnight (records are cycles, never that close)
    return {"day": {"date_histogram": {"field": "time", "calendar_interval": "1d",
                                       "time_zone": "UTC", "offset": "+1ms",
                                       "format": "yyyy-MM-dd"}}}


def _terms(name: str, field: str) -> dict[str, Any]:
    return {name: {"terms": {"field": field, "missing_bucket": True}}}


def _sum(field: str) -> dict[str, Any]:
    return {"sum": {"field": field}}


def usage_body(req: Request, after: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Per (user, project, GPU name, day): the attributed processes' accounted sums."""
    composite: dict[str, Any] = {
        "size": PAGE_SIZE,
        "sources": [_terms("user", "attribution.user"), _terms("project", "attribution.project"),
                    _terms("model", "gpu.name"), _day_source()],
    }
    if after is not None:
        composite["after"] = dict(after)
    return {
        "size": 0,
        "query": {"bool": {"filter": [*_filters(req, "process"), {"term": {"attributed": True}}],
                           "must_not": _not_simulated(req)}},
        "aggs": {"rows": {"composite": composite, "aggs": {
            "used": _sum("gpu_seconds"),
            "busy": _sum("busy_gpu_seconds"),
            "energy": _sum("energy_joules"),
            "idle": {"filter": {"range": {"values.utilization_ratio": {"lt": IDLE_UTILIZATION}}},
                     "aggs": {"seconds": _sum("gpu_seconds")}},
        }}},
    }


def unattributed_body(req: Request, after: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Per (GPU name, day): free GPU time and energy; time and energy of unknown owners."""
    composite: dict[str, Any] = {"size": PAGE_SIZE,
                                 "sources": [_terms("model", "gpu.name"), _day_source()]}
    if after is not None:
        composite["after"] = dict(after)
    free = {"bool": {"filter": [{"term": {"values.processes": 0}},
                                {"range": {"gpu_seconds": {"gt": 0}}}]}}
    beside = {"bool": {"filter": [{"term": {"values.processes": 0}}],
                       "must_not": [{"range": {"gpu_seconds": {"gt": 0}}}]}}
    return {
        "size": 0,
        "query": {"bool": {"filter": _filters(req, "unattributed"),
                           "must_not": _not_simulated(req)}},
        "aggs": {"rows": {"composite": composite, "aggs": {
            "free": {"filter": free, "aggs": {"seconds": _sum("gpu_seconds"),
                                              "energy": _sum("energy_joules")}},
            "beside": {"filter": beside, "aggs": {"energy": _sum("energy_joules")}},
            "unknown": {"filter": {"bool": {"must_not": [free, beside]}},
                        "aggs": {"seconds": _sum("gpu_seconds"),
                                 "energy": _sum("energy_joules")}},
        }}},
    }


def fleet_body(req: Request, after: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Per (GPU name, day): up time and energy, down time, integrated power."""
    composite: dict[str, Any] = {"size": PAGE_SIZE,
                                 "sources": [_terms("model", "gpu.name"), _day_source()]}
    if after is not None:
        composite["after"] = dict(after)
    return {
        "size": 0,
        "query": {"bool": {"filter": _filters(req, "gpu"),
                           "must_not": [*_not_simulated(req),
                                        {"prefix": {"gpu.uuid": "MIG-"}}]}},
        "aggs": {"rows": {"composite": composite, "aggs": {
            "up": {"filter": {"term": {"gpu.up": True}},
                   "aggs": {"seconds": _sum("gpu_seconds"), "energy": _sum("energy_joules"),
                            "power": {"sum": {"script": {"source": POWER_SCRIPT,
                                                         "lang": "painless"}}}}},
            "down": {"filter": {"term": {"gpu.up": False}},
                     "aggs": {"seconds": _sum("elapsed_seconds")}},
        }}},
    }


def usage3_body(req: Request, after: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Version 3: per (user, project, GPU name, day) the holders' sums."""
    composite: dict[str, Any] = {
        "size": PAGE_SIZE,
        "sources": [_terms("user", "user"), _terms("project", "project"),
                    _terms("model", "model"), _day_source()],
    }
    if after is not None:
        composite["after"] = dict(after)
    return {
        "size": 0,
        "query": {"bool": {"filter": [*_filters(req, "usage"), {"range": {"s": {"gte": 0}}}],
                           "must_not": _not_simulated(req)}},
        "aggs": {"rows": {"composite": composite, "aggs": {
            name: _sum(name) for name in ("s", "c", "b", "i", "e", "pe")}}},
    }


def fleet3_body(req: Request, after: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Version 3: per (GPU name, day) the GPUs' own sums."""
    composite: dict[str, Any] = {"size": PAGE_SIZE,
                                 "sources": [_terms("model", "model"), _day_source()]}
    if after is not None:
        composite["after"] = dict(after)
    return {
        "size": 0,
        "query": {"bool": {"filter": [*_filters(req, "usage"), {"range": {"gs": {"gte": 0}}}],
                           "must_not": _not_simulated(req)}},
        "aggs": {"rows": {"composite": composite, "aggs": {
            name: _sum(name) for name in ("gs", "gd", "gi", "ge", "gpe")}}},
    }


USAGE_KINDS = ["gpu", "process", "unattributed", "usage"]


def simulated_body(req: Request) -> dict[str, Any]:
    """How many usage records in the period are simulated."""
    return {
        "size": 0,
        "track_total_hits": True,
        "query": {"bool": {
            "filter": [{"range": {"time_ns": {"gt": _ns(req.start), "lte": _ns(req.end)}}},
                       {"terms": {"kind": USAGE_KINDS}}],
            "should": [{"term": {"simulated": True}}, {"term": {"sim": True}}],
            "minimum_should_match": 1}},
    }


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _ns(t: dt.datetime) -> int:
    t = t if t.tzinfo is not None else t.replace(tzinfo=dt.UTC)
    return (t - _EPOCH) // dt.timedelta(microseconds=1) * 1000


def canonical(body: Mapping[str, Any]) -> str:
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS).decode()


def _value(agg: Any, *path: str) -> float:
    for p in path:
        agg = agg.get(p) if isinstance(agg, Mapping) else None
    v = agg.get("value") if isinstance(agg, Mapping) else None
    return float(v) if isinstance(v, int | float) else 0.0


def _opt(agg: Any, name: str) -> int | None:
    """A min/max as an integer, None for an empty bucket (ES answers null)."""
    v = agg.get(name, {}).get("value") if isinstance(agg, Mapping) else None
    return round(v) if isinstance(v, int | float) else None


def _day(key: Any) -> str:
    """A day bucket key: "yyyy-MM-dd" (the format asked for) or epoch milliseconds."""
    if isinstance(key, str):
        return key[:10]
    if isinstance(key, int | float):
        return dt.datetime.fromtimestamp(key / 1000, tz=dt.UTC).date().isoformat()
    raise SearchUnavailable(f"unexpected day bucket key {key!r}")


class _Pager:
    """Runs a composite query page by page, recording every body."""

    def __init__(self, client: SearchClient, settings: SearchSettings, data: SourceData,
                 progress: Callable[[int], None] | None) -> None:
        self.client, self.settings, self.data, self.progress = client, settings, data, progress

    def ask(self, body: dict[str, Any]) -> Mapping[str, Any]:
        self.data.queries.append(f"POST {self.settings.index}/_search {canonical(body)}")
        try:
            resp = self.client.search(self.settings.index, body)
        except SearchUnavailable:
            raise
        except Exception as exc:  # noqa: BLE001 - every client failure becomes one clear error
            raise SearchUnavailable(
                f"{self.settings.describe()}: {type(exc).__name__}: {exc}") from None
        if not isinstance(resp, Mapping):
            raise SearchUnavailable(f"{self.settings.describe()}: answer is not a JSON object")
        shards = resp.get("_shards")
        if isinstance(shards, Mapping) and shards.get("failed"):
            raise SearchUnavailable(
                f"{self.settings.describe()}: {shards.get('failed')} shard(s) failed: "
                f"{orjson.dumps(shards.get('failures', [])[:3]).decode()}")
        if self.progress is not None:
            self.progress(1)
        return resp

    def buckets(
        self, make: Callable[[Request, Mapping[str, Any] | None], dict[str, Any]], req: Request
    ) -> Iterator[Mapping[str, Any]]:
        after: Mapping[str, Any] | None = None
        while True:
            resp = self.ask(make(req, after))
            rows = resp.get("aggregations", {}).get("rows", {})
            page = rows.get("buckets", [])
            yield from page
            after = rows.get("after_key")
            if not page or after is None:
                return
