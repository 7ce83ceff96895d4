"""The in-process Elasticsearch / OpenSearch server of the sink tests, taught enough of
`_search` aggregations to answer chargeback's search source: `bool` queries of `range`,
`term`, `terms` and `prefix`; `composite` aggregations of `terms` (with `missing_bucket`)
and `date_histogram` (1 day, UTC, `yyyy-MM-dd`) sources, paged with `size` / `after`;
`sum` (of a field, or of the one script the source sends: power x elapsed), `min`,
`max`, `value_count` and `filter` sub-aggregations; `track_total_hits` counts. Every
`_search` body is kept in `bodies`.

What it does not do is refused with a 400 naming it, so a query the source starts
sending that this fake cannot answer fails the test instead of answering wrongly.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from typing import Any, Literal

from tests.shipper.sinks.servers.search import SearchServer, _Handler


class Unsupported(Exception):
    pass


def _get(doc: Mapping[str, Any], field: str) -> Any:
    cur: Any = doc
    for part in field.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def _matches(doc: Mapping[str, Any], q: Mapping[str, Any]) -> bool:
    (op, arg), = q.items()
    if op == "bool":
        unknown = set(arg) - {"filter", "must_not", "must", "should", "minimum_should_match"}
        if unknown:
            raise Unsupported(f"bool {sorted(unknown)}")
        should = arg.get("should", [])
        # with a filter, should clauses only count when minimum_should_match says so
        needed = arg.get("minimum_should_match", 0 if ("filter" in arg or "must" in arg)
                         else min(1, len(should)))
        return (all(_matches(doc, c) for c in [*arg.get("filter", []), *arg.get("must", [])])
                and not any(_matches(doc, c) for c in arg.get("must_not", []))
                and sum(_matches(doc, c) for c in should) >= needed)
    if op == "range":
        (field, bounds), = arg.items()
        v = _get(doc, field)
        if not isinstance(v, int | float):
            return False
        checks = {"gte": v.__ge__, "gt": v.__gt__, "lt": v.__lt__, "lte": v.__le__}
        return all(checks[k](b) for k, b in bounds.items())
    if op == "term":
        (field, value), = arg.items()
        v = _get(doc, field)
        if isinstance(value, bool) or isinstance(v, bool):
            return v is value
        return v is not None and v == value
    if op == "terms":
        (field, values), = arg.items()
        return _get(doc, field) in values
    if op == "prefix":
        (field, value), = arg.items()
        v = _get(doc, field)
        return isinstance(v, str) and v.startswith(value)
    raise Unsupported(f"query {op}")


def _source_key(doc: Mapping[str, Any], src: Mapping[str, Any]) -> Any:
    (kind, arg), = src.items()
    if kind == "terms":
        return _get(doc, arg["field"])
    if kind == "date_histogram":
        if (arg.get("calendar_interval"), arg.get("time_zone"), arg.get("format"),
                arg.get("offset"), arg.get("field")) != ("1d", "UTC", "yyyy-MM-dd", "+1ms",
                                                         "time"):
            raise Unsupported(f"date_histogram {arg}")
        t = doc.get("time_ns")  # the same instant as `time`
        if not isinstance(t, int):
            return None
        shifted = (t - 1_000_000) // 10**9
        return dt.datetime.fromtimestamp(shifted, tz=dt.UTC).date().isoformat()
    raise Unsupported(f"composite source {kind}")


def _sum_script(doc: Mapping[str, Any], script: Mapping[str, Any]) -> float:
    from chargeback.sources.search_query import POWER_SCRIPT

    if script.get("source") != POWER_SCRIPT:
        raise Unsupported("a sum script other than power x elapsed")
    power, elapsed = _get(doc, "values.power_usage_watts"), doc.get("elapsed_seconds")
    return float(power * elapsed) if power is not None and elapsed is not None else 0.0


def _aggs(docs: list[Mapping[str, Any]], aggs: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, spec in aggs.items():
        sub = spec.get("aggs", {})
        kinds = set(spec) - {"aggs"}
        if kinds == {"sum"}:
            s = spec["sum"]
            if "script" in s:
                vals = [_sum_script(d, s["script"]) for d in docs]
            else:
                vals = [v for d in docs if isinstance(v := _get(d, s["field"]), int | float)]
            out[name] = {"value": float(sum(vals))}
        elif kinds & {"min", "max", "value_count"} and len(kinds) == 1:
            (kind,) = kinds
            vals = [v for d in docs if isinstance(v := _get(d, spec[kind]["field"]), int | float)
                    and not isinstance(v, bool)]
            if kind == "value_count":
                out[name] = {"value": len(vals)}
            else:  # ES answers null for an empty bucket, and doubles otherwise
                best = (min if kind == "min" else max)(vals) if vals else None
                out[name] = {"value": float(best) if best is not None else None}
        elif kinds == {"filter"}:
            hit = [d for d in docs if _matches(d, spec["filter"])]
            out[name] = {"doc_count": len(hit), **_aggs(hit, sub)}
        elif kinds == {"composite"}:
            out[name] = _composite(docs, spec["composite"], sub)
        else:
            raise Unsupported(f"aggregation {sorted(kinds)}")
    return out


def _composite(docs: list[Mapping[str, Any]], comp: Mapping[str, Any],
               sub: Mapping[str, Any]) -> dict[str, Any]:
    names = [next(iter(s)) for s in comp["sources"]]
    groups: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for d in docs:
        key = []
        for s in comp["sources"]:
            (_name, src), = s.items()
            v = _source_key(d, src)
            (_kind, arg), = src.items()
            if v is None and not arg.get("missing_bucket"):
                break
            key.append(v)
        else:
            groups.setdefault(tuple(key), []).append(d)

    def order(k: tuple[Any, ...]) -> tuple[tuple[bool, Any], ...]:
        return tuple((v is not None, v if v is not None else "") for v in k)  # nulls first

    keys = sorted(groups, key=order)
    after = comp.get("after")
    if after is not None:
        a = tuple(after[n] for n in names)
        keys = [k for k in keys if order(k) > order(a)]
    page = keys[: comp["size"]]
    out: dict[str, Any] = {"buckets": [
        {"key": dict(zip(names, k, strict=True)), "doc_count": len(groups[k]),
         **_aggs(groups[k], sub)} for k in page]}
    if page:
        out["after_key"] = dict(zip(names, page[-1], strict=True))
    return out


class _AggHandler(_Handler):
    server: AggSearchServer

    def _search(self, path: str, query: dict[str, Any]) -> None:
        if "aggs" not in query and not query.get("track_total_hits"):
            super()._search(path, query)
            return
        self.server.bodies.append(query)
        index = path[: -len("/_search")].strip("/") or "*"
        regex = re.compile("^" + ".*".join(re.escape(p) for p in index.split("*")) + "$")
        try:
            with self.server.lock:
                docs = [d for (i, _), d in self.server.docs.items()
                        if regex.match(i) and _matches(d, query.get("query", {"bool": {}}))]
            aggs = _aggs(docs, query.get("aggs", {}))
        except Unsupported as exc:
            self._json(400, {"error": {"type": "parsing_exception", "reason": str(exc)},
                             "status": 400})
            return
        self._json(200, {"took": 1, "timed_out": False,
                         "_shards": {"total": 1, "successful": 1, "failed": 0},
                         "hits": {"total": {"value": len(docs), "relation": "eq"},
                                  "hits": []},
                         "aggregations": aggs})


class AggSearchServer(SearchServer):
    def __init__(self, flavour: Literal["elasticsearch", "opensearch"] = "elasticsearch") -> None:
        super().__init__(flavour)
        self.RequestHandlerClass = _AggHandler
        self.bodies: list[dict[str, Any]] = []
