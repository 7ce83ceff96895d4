"""Schema-3 usage records (the interval trail) through the sinks that reshape records:
InfluxDB points name the GPU and holder and carry the sums as fields; Elasticsearch /
OpenSearch documents gain the `time` date field the index template maps, which read-back
takes off again so `audit verify --sink` re-checks the stored bytes."""

from __future__ import annotations

import orjson

from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.audit.verify import verify_readback
from shipper.sinks.base import SinkRecord
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig
from shipper.sinks.elasticsearch.encode import source_bytes, strip_added
from shipper.sinks.influxdb.encode import encode_record
from tests.core.audit.factory import ALICE, gpu, proc, snapshot
from tests.core.audit.fakes import MemorySpool
from tests.shipper.sinks.influxdb.lp_parser import parse_line

T = 1_796_000_020.0


def _trail() -> list[SinkRecord]:
    spool = MemorySpool()
    clock = iter([T - 1, T + 500])
    p = AuditProducer(AuditConfig(), spool, host="node-7", exporter_version="t",
                      simulated=False, clock=lambda: next(clock))
    p.start()
    for k in range(40):
        p.on_snapshot(snapshot(T + 5 * k, [
            gpu(0, util=0.5, energy=100.0 * k, power=20.0, processes=[proc(101, sm=0.5)]),
            gpu(1, util=0.0, energy=10.0 * k)], {101: ALICE}))
    p.stop()
    out = []
    for i, raw in enumerate(spool.payloads):
        doc = orjson.loads(raw)
        out.append(SinkRecord(offset=i, record_id=doc["id"], doc=doc, raw=raw))
    return out


def test_a_usage_record_is_one_influx_point_with_its_gpu_holder_and_sums() -> None:
    usage = [r for r in _trail() if r.doc["kind"] == "usage"]
    assert usage
    for rec in usage:
        point = parse_line(encode_record(rec.doc, rec.raw, rec.record_id).decode())
        assert point.measurement == "gpu_audit_usage"
        assert point.tags["gpu_uuid"] == rec.doc["uuid"]
        assert point.tags.get("user") == rec.doc.get("user")
        assert point.fields["gpu_index"] == rec.doc["idx"]
        assert point.fields["record"] == rec.raw.decode()
        for name in ("dt", "s", "e", "gs", "ge"):
            if name in rec.doc:
                assert point.fields[name] == float(rec.doc[name]), name


def test_search_documents_gain_time_and_read_back_as_stored() -> None:
    cfg = ElasticsearchSinkConfig.model_validate({"type": "elasticsearch",
                                                  "hosts": ["http://127.0.0.1:9"]})
    trail = _trail()
    back = []
    for rec in trail:
        sent = orjson.loads(source_bytes(rec, cfg))
        if rec.doc["kind"] == "usage":
            assert sent["time"].endswith("Z") and "time" not in rec.doc
        back.append(strip_added(sent, cfg))
    assert [orjson.dumps(d, option=orjson.OPT_SORT_KEYS) for d in back] == [r.raw for r in trail]
    report = verify_readback(back, hmac_key=None)
    assert report.ok, report.render()
