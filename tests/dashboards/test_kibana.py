"""Kibana saved objects for the audit index: committed NDJSON matches the code, every
field they name exists in the index template the shipper installs, references resolve,
and the data view matches the template's index pattern."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dashboards import kibana
from shipper.sinks.config import ElasticsearchSinkConfig
from shipper.sinks.elasticsearch.encode import index_pattern, template_body

CFG = ElasticsearchSinkConfig.model_validate({"type": "elasticsearch",
                                              "hosts": ["http://es:9200"]})
TEMPLATE = template_body(CFG)


def _in_template(field: str, template: dict[str, Any]) -> bool:
    """An explicit mapping in `properties` (dotted through objects), or a field that a
    dynamic template with a path_match maps (values.* as double)."""
    mappings = template["template"]["mappings"]
    node: dict[str, Any] = {"properties": mappings["properties"]}
    for part in field.split("."):
        props = node.get("properties", {})
        if part not in props:
            break
        node = props[part]
    else:
        return "type" in node
    for dyn in mappings.get("dynamic_templates", []):
        (rule,) = dyn.values()
        pattern = rule.get("path_match")
        if pattern and pattern.endswith(".*") and field.startswith(pattern[:-1]):
            return True
    return False


def test_committed_ndjson_matches_the_code() -> None:
    """dashboards/kibana/gpu-audit.ndjson is what `python -m dashboards.kibana` writes."""
    assert kibana.NDJSON.read_text() == kibana.render()


def test_every_referenced_field_is_in_the_index_template() -> None:
    """Each field a saved object names (time field, columns, sorts, KQL, aggregations)
    is mapped by the shipper's index template, so none shows as unknown in Kibana."""
    fields = kibana.referenced_fields(kibana.saved_objects())
    assert {"time", "gpu_seconds", "attribution.user", "attribution.project",
            "xid.code", "kind", "values.memory_used_bytes"} <= fields
    missing = sorted(f for f in fields if not _in_template(f, TEMPLATE))
    assert missing == []


@pytest.mark.parametrize("field", ["attribution.department", "xid.reason", "gpu", "valuesx.a"])
def test_the_field_check_rejects_unmapped_fields(field: str) -> None:
    """The check is not vacuous: an unmapped field, or an object instead of a leaf, fails."""
    assert not _in_template(field, TEMPLATE)


def test_data_view_matches_the_template_pattern_and_time_field() -> None:
    """The data view's title is the template's index pattern, its time field a date."""
    view = kibana.data_view()["attributes"]
    assert [view["title"]] == TEMPLATE["index_patterns"] == [index_pattern(CFG)]
    mapping = TEMPLATE["template"]["mappings"]["properties"][view["timeFieldName"]]
    assert mapping["type"] in ("date", "date_nanos")


def test_references_resolve_in_import_order() -> None:
    """Every reference names an object of the file that comes before it (Kibana's import
    resolves them; a dangling one would be a missing-reference error)."""
    seen: set[tuple[str, str]] = set()
    lines = kibana.NDJSON.read_text().splitlines()
    for line in lines:
        obj = json.loads(line)
        for ref in obj["references"]:
            assert (ref["type"], ref["id"]) in seen, (obj["id"], ref)
        seen.add((obj["type"], obj["id"]))
    assert {t for t, _ in seen} == {"index-pattern", "search", "visualization", "dashboard"}
    assert len(seen) == len(lines)
