"""One point per audit record in the REAL InfluxDB 1.x and the REAL VictoriaMetrics, for
every record kind the audit builder produces; replays add nothing. Also the real
influxd's partial write (a field type conflict): exact outcomes, counted re-sends."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any

import pytest

from gpu_audit.audit.verify import verify_readback
from shipper.sinks.base import Outcome
from shipper.sinks.influxdb import sink as influxdb_sink
from shipper.sinks.influxdb.config import InfluxV1SinkConfig, InfluxV2SinkConfig
from shipper.sinks.influxdb.encode import encode_record
from shipper.sinks.influxdb.sink import InfluxV1Sink, InfluxV2Sink
from tests.realservers import vm_flush
from tests.shipper.sinks.records import BASE_NS, make_batch
from tests.shipper.sinks.trail import audit_trail, kinds, trail_window


def _v1(url: str, db: str) -> InfluxV1Sink:
    cfg = InfluxV1SinkConfig.model_validate(
        {"type": "influxdb_v1", "url": url, "database": db, "timeout_s": 10})
    return InfluxV1Sink(cfg, "influx")


def _influxql(url: str, db: str, q: str) -> Any:
    query = urllib.parse.urlencode({"db": db, "q": q, "epoch": "ns"})
    with urllib.request.urlopen(f"{url}/query?{query}", timeout=10) as resp:
        return json.loads(resp.read())["results"][0]


def _points_per_measurement(url: str, db: str) -> dict[str, int]:
    res = _influxql(url, db, 'SELECT count("record_id") FROM /^gpu_audit_/')
    return {s["name"]: s["values"][0][1] for s in res.get("series", [])}


def test_real_influxd_holds_one_point_per_record_of_every_kind(
        influxd: tuple[str, str]) -> None:
    """Real influxd 1.x: a trail with every record kind (several XIDs on one GPU in one
    cycle, several processes of one owner on one GPU, one pid on two MIG instances) is
    stored as exactly one point per record, per measurement; re-sending the batch adds no
    point; read_back gives every record back and the hash chain verifies."""
    url, db = influxd
    sink = _v1(url, db)
    trail = audit_trail()
    expected = {f"gpu_audit_{kind}": n for kind, n in kinds(trail).items()}
    assert {r.outcome for r in sink.send(trail)} == {Outcome.DELIVERED}
    assert _points_per_measurement(url, db) == expected
    assert {r.outcome for r in sink.send(trail)} == {Outcome.DELIVERED}
    assert _points_per_measurement(url, db) == expected
    got = list(sink.read_back(*trail_window()))
    assert len(got) == len(trail)
    report = verify_readback(got, hmac_key=None, source="influxd")
    assert report.ok, report.render()


def test_real_victoria_metrics_holds_one_sample_per_record_of_every_kind(
        victoria_metrics: str) -> None:
    """Real VictoriaMetrics (deduplicating per millisecond, as the shipper needs it): the
    same trail leaves exactly one `<measurement>_seq` sample per record, with the record's
    seq as its value, and a replay adds none."""
    cfg = InfluxV2SinkConfig.model_validate(
        {"type": "influxdb_v2", "url": victoria_metrics, "bucket": "audit",
         "flavour": "victoriametrics", "timeout_s": 10})
    sink = InfluxV2Sink(cfg, "vm")
    trail = audit_trail()
    expected = sorted(int(r.doc["seq"]) for r in trail)
    for _ in range(2):
        assert {r.outcome for r in sink.send(trail)} == {Outcome.DELIVERED}
        vm_flush(victoria_metrics)
        start, end = trail_window()
        query = urllib.parse.urlencode({"match[]": '{__name__=~"gpu_audit_.*_seq"}',
                                        "start": str(start // 10**9),
                                        "end": str(end // 10**9)})
        with urllib.request.urlopen(f"{victoria_metrics}/api/v1/export?{query}",
                                    timeout=10) as resp:
            series = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
        seqs = sorted(int(v) for s in series for v in s["values"])
        assert seqs == expected


def test_real_influxd_field_type_conflict_dead_letters_only_those_and_counts_resends(
        influxd: tuple[str, str]) -> None:
    """A real partial write (field type conflict on one measurement): exactly the
    conflicting records are dead letters, every other record is stored once, each record
    is sent at most twice, and every re-send is reported in the results."""
    url, db = influxd
    # make `seq` a string field of gpu_audit_gpu in this shard
    body = f'gpu_audit_gpu,host=other seq="text" {BASE_NS - 10}'.encode()
    req = urllib.request.Request(f"{url}/write?db={db}&precision=ns", data=body, method="POST")
    urllib.request.urlopen(req, timeout=10).close()
    batch = make_batch(20) + make_batch(3, start=20, kind="gpu") + make_batch(20, start=23)
    results = _v1(url, db).send(batch)
    outcomes = [r.outcome for r in results]
    assert outcomes == [Outcome.DELIVERED] * 20 + [Outcome.DEAD_LETTER] * 3 + [
        Outcome.DELIVERED] * 20
    assert "field type conflict" in results[20].reason
    assert max(r.sends for r in results) == 2
    assert _points_per_measurement(url, db)["gpu_audit_process"] == 40


def test_real_influxd_unparsable_line_is_named_and_the_rest_is_not_sent_again(
        influxd: tuple[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """A real influxd 1.x answer to a body with one unparsable line (`partial write:
    unable to parse '…' … dropped=0`): that record is a dead letter, the other 19 are
    delivered after the one request, and none is sent twice."""
    url, db = influxd

    def broken_seq_5(doc: Any, raw: bytes, record_id: str, **kw: Any) -> bytes:
        line = encode_record(doc, raw, record_id, **kw)
        return b"gpu_audit_process,host=x seq= 1" if doc["seq"] == 5 else line

    monkeypatch.setattr(influxdb_sink, "encode_record", broken_seq_5)
    sink = _v1(url, db)
    posts: list[str] = []
    real_request = sink._pool.request

    def counting(method: str, url: str, **kw: Any) -> Any:
        posts.append(method)
        return real_request(method, url, **kw)

    monkeypatch.setattr(sink._pool, "request", counting)
    results = sink.send(make_batch(20))
    assert posts == ["POST"]  # one request settled the whole batch
    assert [r.outcome for r in results] == [Outcome.DELIVERED] * 5 + [
        Outcome.DEAD_LETTER] + [Outcome.DELIVERED] * 14
    assert "unable to parse" in results[5].reason or "missing field" in results[5].reason
    assert [r.sends for r in results] == [1] * 20
    assert _points_per_measurement(url, db)["gpu_audit_process"] == 19
