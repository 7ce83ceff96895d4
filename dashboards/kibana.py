"""Kibana saved objects for the audit index, written as NDJSON into dashboards/kibana/.

A data view on the shipper's daily indices (`gpu-audit-*`, time field `time`), saved
searches (a user's records, XID events, unattributed usage) and a dashboard of GPU-hours
by user and by project over time. Imported with `gpu-audit dashboards push --kibana URL`
or Kibana's Stack Management > Saved objects > Import.

Every field named here exists in the index template (shipper/sinks/elasticsearch/encode.py
`template_body`): tests/dashboards/test_kibana.py checks it. GPU-hours are the sum of the
process records' `gpu_seconds`, shown in hours by the data view's duration format.
Usage sums leave simulated records out (`not simulated : true`), as chargeback does.

    python -m dashboards.kibana            # write dashboards/kibana/gpu-audit.ndjson
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

KIBANA_DIR = Path(__file__).resolve().parent / "kibana"
NDJSON = KIBANA_DIR / "gpu-audit.ndjson"
DATA_VIEW_ID = "gpu-audit-records"
INDEX_PATTERN = "gpu-audit-*"
TIME_FIELD = "time"
USAGE = 'kind : "process" and attribution.user : * and not simulated : true'
_INDEX_REF = "kibanaSavedObjectMeta.searchSourceJSON.index"
_VERSION = "8.0.0"


def _source(query: str) -> dict[str, Any]:
    return {"searchSourceJSON": json.dumps({
        "query": {"query": query, "language": "kuery"}, "filter": [],
        "indexRefName": _INDEX_REF}, sort_keys=True)}


def _index_ref() -> list[dict[str, str]]:
    return [{"name": _INDEX_REF, "type": "index-pattern", "id": DATA_VIEW_ID}]


def data_view() -> dict[str, Any]:
    formats = {"gpu_seconds": {"id": "duration", "params": {
        "inputFormat": "seconds", "outputFormat": "asHours", "outputPrecision": 2}}}
    return {"type": "index-pattern", "id": DATA_VIEW_ID, "references": [],
            "attributes": {"title": INDEX_PATTERN, "name": "gpu-audit records",
                           "timeFieldName": TIME_FIELD,
                           "fieldFormatMap": json.dumps(formats, sort_keys=True)}}


def saved_search(sid: str, title: str, description: str, query: str, columns: list[str]
                 ) -> dict[str, Any]:
    return {"type": "search", "id": sid, "references": _index_ref(),
            "attributes": {"title": title, "description": description, "columns": columns,
                           "sort": [[TIME_FIELD, "desc"]],
                           "kibanaSavedObjectMeta": _source(query)}}


def searches() -> list[dict[str, Any]]:
    return [
        saved_search("gpu-audit-user-records", "gpu-audit: records of a user",
                     "Every process record with an owner; replace * with a user name.",
                     'kind : "process" and attribution.user : *',
                     ["host", "gpu.uuid", "attribution.user", "attribution.project",
                      "attribution.job", "process.pid", "process.name", "gpu_seconds",
                      "energy_joules"]),
        saved_search("gpu-audit-xids", "gpu-audit: XID errors",
                     "XID events: which GPU reported which XID code, and when.",
                     'kind : "event" and xid.code : *',
                     ["host", "gpu.uuid", "gpu.index", "xid.code", "xid.time"]),
        saved_search("gpu-audit-unattributed", "gpu-audit: unattributed usage",
                     "GPU memory or utilisation no identified process explains.",
                     'kind : "unattributed" and (values.memory_used_bytes > 0 '
                     "or values.utilization_ratio > 0)",
                     ["host", "gpu.uuid", "values.memory_used_bytes",
                      "values.utilization_ratio", "values.processes", "gpu_seconds"]),
    ]


def gpu_hours_chart(vid: str, title: str, split_field: str) -> dict[str, Any]:
    """A stacked bar chart over time: sum of gpu_seconds (shown in hours), one stack
    per value of `split_field`."""
    aggs = [
        {"id": "1", "enabled": True, "type": "sum", "schema": "metric",
         "params": {"field": "gpu_seconds", "customLabel": "GPU-hours"}},
        {"id": "2", "enabled": True, "type": "date_histogram", "schema": "segment",
         "params": {"field": TIME_FIELD, "interval": "auto", "min_doc_count": 1,
                    "extended_bounds": {}}},
        {"id": "3", "enabled": True, "type": "terms", "schema": "group",
         "params": {"field": split_field, "size": 10, "order": "desc", "orderBy": "1",
                    "otherBucket": True, "otherBucketLabel": "Other",
                    "missingBucket": False}},
    ]
    params = {
        "type": "histogram", "addTooltip": True, "addLegend": True,
        "legendPosition": "right", "times": [], "addTimeMarker": False,
        "categoryAxes": [{"id": "CategoryAxis-1", "type": "category", "position": "bottom",
                          "show": True, "scale": {"type": "linear"},
                          "labels": {"show": True, "filter": True, "truncate": 100},
                          "title": {}}],
        "valueAxes": [{"id": "ValueAxis-1", "name": "LeftAxis-1", "type": "value",
                       "position": "left", "show": True,
                       "scale": {"type": "linear", "mode": "normal"},
                       "labels": {"show": True, "rotate": 0, "filter": False,
                                  "truncate": 100},
                       "title": {"text": "GPU-hours"}}],
        "seriesParams": [{"show": True, "type": "histogram", "mode": "stacked",
                          "data": {"label": "GPU-hours", "id": "1"},
                          "valueAxis": "ValueAxis-1", "drawLinesBetweenPoints": True,
                          "showCircles": True}],
        "grid": {"categoryLines": False},
    }
    vis_state = {"title": title, "type": "histogram", "aggs": aggs, "params": params}
    return {"type": "visualization", "id": vid, "references": _index_ref(),
            "attributes": {"title": title, "description": "", "uiStateJSON": "{}",
                           "version": 1, "visState": json.dumps(vis_state, sort_keys=True),
                           "kibanaSavedObjectMeta": _source(USAGE)}}


def charts() -> list[dict[str, Any]]:
    return [gpu_hours_chart("gpu-audit-gpu-hours-by-user", "GPU-hours by user",
                            "attribution.user"),
            gpu_hours_chart("gpu-audit-gpu-hours-by-project", "GPU-hours by project",
                            "attribution.project")]


def dashboard(panels: list[dict[str, Any]]) -> dict[str, Any]:
    layout = [(0, 0, 24, 15), (24, 0, 24, 15), (0, 15, 48, 15), (0, 30, 24, 15),
              (24, 30, 24, 15)]
    panels_json = []
    references = []
    for i, (obj, (x, y, w, h)) in enumerate(zip(panels, layout, strict=True)):
        panels_json.append({"version": _VERSION, "type": obj["type"], "panelIndex": str(i + 1),
                            "gridData": {"x": x, "y": y, "w": w, "h": h, "i": str(i + 1)},
                            "embeddableConfig": {}, "panelRefName": f"panel_{i}"})
        references.append({"name": f"panel_{i}", "type": obj["type"], "id": obj["id"]})
    return {"type": "dashboard", "id": "gpu-audit-usage", "references": references,
            "attributes": {
                "title": "gpu-audit: GPU usage by user and project",
                "description": "GPU-hours by user and project over time, from the audit "
                               "trail (process records' gpu_seconds); XIDs and unattributed "
                               "usage below.",
                "panelsJSON": json.dumps(panels_json, sort_keys=True),
                "optionsJSON": json.dumps({"useMargins": True, "hidePanelTitles": False}),
                "timeRestore": True, "timeFrom": "now-30d", "timeTo": "now",
                "refreshInterval": {"pause": True, "value": 0}, "version": 1,
                "kibanaSavedObjectMeta": {"searchSourceJSON": json.dumps(
                    {"query": {"query": "", "language": "kuery"}, "filter": []})}}}


def saved_objects() -> list[dict[str, Any]]:
    """Referenced objects come before the objects that reference them."""
    found = searches()
    made = charts()
    board = dashboard([made[0], made[1], found[0], found[1], found[2]])
    return [data_view(), *found, *made, board]


def render() -> str:
    return "".join(json.dumps(obj, sort_keys=True) + "\n" for obj in saved_objects())


# --- the fields the objects name, for the template check -----------------------------

_KQL_FIELD = re.compile(r"([A-Za-z_@][\w.@]*)\s*(?::|>=|<=|>|<)")


def referenced_fields(objects: list[dict[str, Any]]) -> set[str]:
    """Every document field the objects name: time field, formats, columns, sorts,
    KQL queries and aggregation fields."""
    fields: set[str] = set()
    for obj in objects:
        attrs = obj["attributes"]
        if obj["type"] == "index-pattern":
            fields.add(attrs["timeFieldName"])
            fields.update(json.loads(attrs.get("fieldFormatMap", "{}")))
        fields.update(attrs.get("columns", []))
        fields.update(col for col, _ in attrs.get("sort", []))
        meta = attrs.get("kibanaSavedObjectMeta")
        if meta:
            query = json.loads(meta["searchSourceJSON"])["query"]["query"]
            fields.update(m for m in _KQL_FIELD.findall(query)
                          if m not in {"and", "or", "not"})
        if "visState" in attrs:
            for agg in json.loads(attrs["visState"])["aggs"]:
                if "field" in agg["params"]:
                    fields.add(agg["params"]["field"])
    return fields


def main() -> int:
    KIBANA_DIR.mkdir(parents=True, exist_ok=True)
    NDJSON.write_text(render())
    print(NDJSON)
    return 0


if __name__ == "__main__":
    sys.exit(main())
