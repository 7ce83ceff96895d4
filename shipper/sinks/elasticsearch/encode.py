"""What the Elasticsearch and OpenSearch sinks put on the wire: the `_bulk` NDJSON body
(`create` with `_id` = record id), the index chosen from the record's own time, the
composable index template and the read-back search. Pure functions; no I/O.

How the answers are classified is response.py. This module must never decide to drop a
record: a record it cannot encode gets a DEAD_LETTER result with the reason.
"""

from __future__ import annotations

import datetime as dt
import functools
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from shipper.sinks.base import ItemResult, Outcome, SinkRecord
from shipper.sinks.elasticsearch.config import SearchSinkConfigBase as SearchConfig


def index_for(doc: Mapping[str, Any], cfg: SearchConfig) -> str:
    """The index (or data stream) for a record, from the record's own event time."""
    if cfg.index_mode == "data_stream":
        return cfg.data_stream
    return _daily_index(cfg.index_prefix, cfg.date_format, doc["time_ns"] // 1_000_000_000)


@functools.lru_cache(maxsize=1024)
def _daily_index(prefix: str, date_format: str, second: int) -> str:
    # keyed by the second (the finest a strftime format can name), so it is exact for
    # any date_format; records of one collection cycle share the second
    day = dt.datetime.fromtimestamp(second, tz=dt.UTC)
    return f"{prefix}-{day.strftime(date_format)}"


def index_pattern(cfg: SearchConfig) -> str:
    return cfg.data_stream if cfg.index_mode == "data_stream" else f"{cfg.index_prefix}-*"


def _timestamp(doc: Mapping[str, Any]) -> str:
    text = doc.get("time")
    if isinstance(text, str) and text:
        return text
    sec, nsec = divmod(int(doc["time_ns"]), 1_000_000_000)
    stamp = dt.datetime.fromtimestamp(sec, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%S")
    return f"{stamp}.{nsec:09d}Z"


V3 = "gpu-audit.record/3"  # interval usage records: no `time` of their own


def source_bytes(rec: SinkRecord, cfg: SearchConfig) -> bytes:
    """The document as sent: the raw record, plus `@timestamp` for data streams and
    `time` (the date field the index template maps) for a schema-3 record, which keeps
    only `time_ns`."""
    raw = rec.raw.strip()
    added = b""
    if cfg.index_mode == "data_stream" and "@timestamp" not in rec.doc:
        added += b'"@timestamp":' + orjson.dumps(_timestamp(rec.doc))
    if rec.doc.get("schema") == V3 and "time" not in rec.doc:
        added += (b"," if added else b"") + b'"time":' + orjson.dumps(_timestamp(rec.doc))
    if not added:
        return raw
    if not raw.endswith(b"}"):
        raise ValueError("raw record is not a JSON object")
    sep = b"," if raw[:-1].strip() != b"{" else b""
    return raw[:-1] + sep + added + b"}"


def strip_added(doc: dict[str, Any], cfg: SearchConfig) -> dict[str, Any]:
    """Undo what source_bytes added, so read_back returns the record as spooled."""
    if cfg.index_mode == "data_stream":
        doc.pop("@timestamp", None)
    if doc.get("schema") == V3:
        doc.pop("time", None)
    return doc


def build_body(
    batch: Sequence[SinkRecord], cfg: SearchConfig, results: list[ItemResult | None]
) -> tuple[bytes, list[int]]:
    """NDJSON `create` pairs for the records that can be sent; the others get a result.

    Returns the body and the batch positions it carries, in order.
    """
    parts: list[bytes] = []
    sent: list[int] = []
    for i, rec in enumerate(batch):
        try:
            index = index_for(rec.doc, cfg)
            source = source_bytes(rec, cfg)
        except (KeyError, TypeError, ValueError, OverflowError, OSError) as exc:
            results[i] = ItemResult(Outcome.DEAD_LETTER, f"cannot index record: {exc!r}")
            continue
        action = {"create": {"_index": index, "_id": rec.record_id}}
        parts.append(orjson.dumps(action))
        parts.append(source)
        sent.append(i)
    return b"\n".join(parts) + b"\n", sent


def template_body(cfg: SearchConfig) -> dict[str, Any]:
    """The composable index template: keyword ids, date_nanos time, numeric values."""
    keyword = {"type": "keyword"}
    properties: dict[str, Any] = {
        "id": keyword, "schema": keyword, "kind": keyword, "stream": keyword,
        "seq": {"type": "long"}, "prev_hash": keyword, "hash": keyword,
        "time": {"type": "date_nanos"}, "time_ns": {"type": "long"}, "host": keyword,
        "gpu": {"properties": {"uuid": keyword, "index": {"type": "integer"}, "name": keyword}},
        "process": {"properties": {"pid": {"type": "long"}, "name": keyword,
                                   "uid": {"type": "long"}}},
        # field names as records have them (tests/core/audit/test_sink_field_names.py)
        "attribution": {"properties": {"user": keyword, "project": keyword, "job": keyword,
                                       "k8s_pod": keyword, "k8s_namespace": keyword}},
        "gpu_seconds": {"type": "double"}, "energy_joules": {"type": "double"},
        "xid": {"properties": {"code": {"type": "integer"}, "time": {"type": "date_nanos"},
                               "time_ns": {"type": "long"}}},
        "simulated": {"type": "boolean"},
        # schema 3 (the interval usage record): GPU and holder at the top level, sums
        # and extremes as numbers (double: a float field would round the sums)
        "uuid": keyword, "model": keyword, "user": keyword, "project": keyword,
        "idx": {"type": "integer"}, "n": {"type": "integer"}, "sim": {"type": "boolean"},
        **{name: {"type": "double"} for name in ("dt", "s", "c", "b", "i", "gs", "gd", "gi",
                                                  "gua", "gux")},
        **{name: {"type": "long"} for name in ("e", "pe", "ms", "ge", "gpe", "gms", "gmx",
                                                  "gmt")},
        "tasks": {"properties": {"pid": {"type": "long"}, "name": keyword, "job": keyword,
                                 "sj": keyword,
                                 "s": {"type": "double"}, "mx": {"type": "long"},
                                 "ua": {"type": "double"}, "ux": {"type": "double"}}},
    }
    if cfg.index_mode == "data_stream":
        properties["@timestamp"] = {"type": "date_nanos"}
    body: dict[str, Any] = {
        "index_patterns": [index_pattern(cfg)],
        "priority": 200,
        "template": {
            "settings": {"number_of_shards": cfg.number_of_shards,
                         "number_of_replicas": cfg.number_of_replicas},
            "mappings": {
                "dynamic_templates": [
                    {"values_as_double": {"path_match": "values.*",
                                          "mapping": {"type": "double"}}},
                    {"strings_as_keyword": {"match_mapping_type": "string",
                                            "mapping": {"type": "keyword",
                                                        "ignore_above": 1024}}},
                ],
                "properties": properties,
            },
        },
        "_meta": {"managed_by": "gpu-audit"},
    }
    if cfg.index_mode == "data_stream":
        body["data_stream"] = {}
    return body


def search_body(start_ns: int, end_ns: int, size: int, after: list[Any] | None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "query": {"range": {"time_ns": {"gte": start_ns, "lt": end_ns}}},
        "sort": [{"stream": "asc"}, {"seq": "asc"}, {"id": "asc"}],
        "size": size,
    }
    if after is not None:
        body["search_after"] = after
    return body
