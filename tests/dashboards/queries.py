"""Read the queries back out of generated dashboard JSON and substitute Grafana's
variables, so they can be run against a real Prometheus (the tests and the bench; test
code, so it does not ship in the dashboards package).

This is the part of Grafana's behaviour the end-to-end test needs: `$var` and `${var}`
replaced by a value (a multi-value "All" by the variable's allValue), `$__range`,
`$__range_s` and `$__rate_interval` by durations, and `label_values(METRIC, LABEL)`
variable queries turned into the Prometheus label-values API call Grafana makes.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

_VAR = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)")
_LABEL_VALUES = re.compile(r"^label_values\((?P<match>.+),\s*(?P<label>\w+)\)$", re.S)


@dataclass(frozen=True)
class Target:
    dashboard: str  # uid
    panel: str  # title
    ref_id: str
    expr: str
    instant: bool


@dataclass(frozen=True)
class VariableQuery:
    dashboard: str
    name: str
    match: str  # series selector
    label: str


def _panels(model: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for panel in model.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # panels inside a collapsed row


def targets(model: Mapping[str, Any]) -> list[Target]:
    out = []
    for panel in _panels(model):
        for t in panel.get("targets", []):
            if "expr" in t:
                out.append(Target(model["uid"], panel.get("title", ""), t.get("refId", ""),
                                  t["expr"], bool(t.get("instant"))))
    return out


def variable_queries(model: Mapping[str, Any]) -> list[VariableQuery]:
    out = []
    for var in model.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var["query"]
        text = query.get("query", "") if isinstance(query, Mapping) else str(query)
        m = _LABEL_VALUES.match(text.strip())
        if m is None:
            raise ValueError(f"{model['uid']}: variable {var['name']}: unsupported query {text!r}")
        out.append(VariableQuery(model["uid"], var["name"], m["match"].strip(), m["label"]))
    return out


def substitute(text: str, values: Mapping[str, str]) -> str:
    """Replace every `$name` / `${name}` / `${name:format}`; an unknown name is an error
    (a query left with a `$` would not parse, or would silently match nothing)."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for variable ${name} in {text!r}")
        return values[name]

    return _VAR.sub(one, text)


def all_values(model: Mapping[str, Any]) -> dict[str, str]:
    """Each variable of a dashboard at "All" (its allValue) or its current value."""
    out: dict[str, str] = {}
    for var in model.get("templating", {}).get("list", []):
        if var.get("includeAll"):
            out[var["name"]] = var.get("allValue") or ".*"
        elif isinstance(var.get("current"), Mapping) and "value" in var["current"]:
            out[var["name"]] = str(var["current"]["value"])
    return out


def builtin_values(range_seconds: int, rate_interval: str = "1m") -> dict[str, str]:
    return {"__range": f"{range_seconds}s", "__range_s": str(range_seconds),
            "__rate_interval": rate_interval, "__interval": "15s"}
