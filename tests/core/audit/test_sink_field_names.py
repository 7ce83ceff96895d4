"""The sinks name record fields as the v2 record has them: every field the
Elasticsearch/OpenSearch index template maps exists in the v2 JSON schema, with a
mapping of the same shape (an object mapped as an object, a number as a number), so no
record is rejected by its own index template and no mapping names a field that never
comes."""

from __future__ import annotations

from typing import Any

from gpu_audit.audit.schema import record_schema
from shipper.sinks.elasticsearch import encode
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig

_SCALAR = {"keyword": {"string"}, "date_nanos": {"string"}, "long": {"integer"},
           "integer": {"integer"}, "double": {"number", "integer"}, "boolean": {"boolean"}}


def _schema_types(prop: dict[str, Any], defs: dict[str, Any]) -> set[str]:
    if "$ref" in prop:
        return _schema_types(defs[prop["$ref"].rsplit("/", 1)[-1]], defs)
    if "const" in prop:
        return {"string"}
    if "enum" in prop:
        return {"string"}
    t = prop.get("type")
    return {t} if isinstance(t, str) else set(t or ())


def _check(mapping: dict[str, Any], schema_props: dict[str, Any], defs: dict[str, Any],
           path: str, problems: list[str]) -> None:
    for name, m in mapping.items():
        where = f"{path}{name}"
        if name == "@timestamp":
            continue
        prop = schema_props.get(name)
        if prop is None:
            problems.append(f"{where}: not a field of v2 records")
            continue
        types = _schema_types(prop, defs)
        if "properties" in m:
            if "object" not in types:
                problems.append(f"{where}: mapped as an object, records hold {types}")
                continue
            _check(m["properties"], prop.get("properties", {}), defs, f"{where}.", problems)
        elif not types & _SCALAR.get(m.get("type", ""), set()):
            problems.append(f"{where}: mapped as {m.get('type')}, records hold {types}")


def test_search_index_template_names_only_v2_fields_with_their_shapes() -> None:
    """Every property of the index template is a v2 record field of a matching type
    (before: `xid` was mapped as an integer though records hold an object, so every
    XID event would be rejected, and attribution mapped `department`, `pod` and
    `namespace`, which records never had: they are `k8s_pod` and `k8s_namespace`)."""
    cfg = ElasticsearchSinkConfig(type="elasticsearch", hosts=["http://127.0.0.1:9200"])
    mapping = encode.template_body(cfg)["template"]["mappings"]["properties"]
    schema = record_schema(2)
    problems: list[str] = []
    _check(mapping, schema["properties"], schema["$defs"], "", problems)
    assert problems == []
