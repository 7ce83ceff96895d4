"""The sinks name record fields as the records have them: every field the
Elasticsearch/OpenSearch index template maps exists in the v2 or the v3 (usage record)
JSON schema, with a mapping of the same shape (an object mapped as an object, a number as
a number), so no record is rejected by its own index template and no mapping names a
field that never comes. Both versions share an index, so a field both have must have one
shape in both."""

from __future__ import annotations

from typing import Any

from gpu_audit.audit.schema import record_schema
from shipper.sinks.elasticsearch import encode
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig

_SCALAR = {"keyword": {"string"}, "date_nanos": {"string"}, "long": {"integer"},
           "integer": {"integer"}, "double": {"number", "integer"}, "boolean": {"boolean"}}


def _schema_types(prop: dict[str, Any], defs: dict[str, Any]) -> set[str]:
    if "$ref" in prop:
        target: Any = defs
        for step in prop["$ref"].removeprefix("#/$defs/").split("/"):
            target = target[step]
        return _schema_types(target, defs)
    if "const" in prop:
        value = prop["const"]
        return {"boolean"} if isinstance(value, bool) else {"string"}
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
        if "properties" in m and "array" in types:  # an array of objects (v3 tasks)
            items = prop.get("items", {})
            if "$ref" in items:
                target: Any = defs
                for step in items["$ref"].removeprefix("#/$defs/").split("/"):
                    target = target[step]
                items = target
            _check(m["properties"], items.get("properties", {}), defs, f"{where}.", problems)
            continue
        if "properties" in m:
            if "object" not in types:
                problems.append(f"{where}: mapped as an object, records hold {types}")
                continue
            _check(m["properties"], prop.get("properties", {}), defs, f"{where}.", problems)
        elif not types & _SCALAR.get(m.get("type", ""), set()):
            problems.append(f"{where}: mapped as {m.get('type')}, records hold {types}")


def test_search_index_template_names_only_record_fields_with_their_shapes() -> None:
    """Every property of the index template is a v2 or v3 record field of a matching type
    (before: `xid` was mapped as an integer though records hold an object, so every
    XID event would be rejected, and attribution mapped `department`, `pod` and
    `namespace`, which records never had: they are `k8s_pod` and `k8s_namespace`)."""
    cfg = ElasticsearchSinkConfig(type="elasticsearch", hosts=["http://127.0.0.1:9200"])
    mapping = encode.template_body(cfg)["template"]["mappings"]["properties"]
    v2, v3 = record_schema(2), record_schema(3)
    usage = v3["$defs"]["usage"]["properties"]
    defs = {**v2["$defs"], **v3["$defs"]}
    problems: list[str] = []
    for name, m in mapping.items():
        in_v2, in_v3 = name in v2["properties"], name in usage
        if not (in_v2 or in_v3):
            problems.append(f"{name}: not a field of v2 or v3 records")
        if in_v2:
            _check({name: m}, v2["properties"], defs, "", problems)
        if in_v3:
            _check({name: m}, usage, defs, "", problems)
    assert problems == []


def test_v3_fields_never_change_the_shape_of_a_v2_field() -> None:
    """A field both versions have (in one index) has one JSON type in both."""
    v2, v3 = record_schema(2), record_schema(3)
    defs = {**v2["$defs"], **v3["$defs"]}
    usage = v3["$defs"]["usage"]["properties"]
    clash = {name: (_schema_types(v2["properties"][name], defs), _schema_types(p, defs))
             for name, p in usage.items() if name in v2["properties"]}
    assert all(a & b for a, b in clash.values()), clash
