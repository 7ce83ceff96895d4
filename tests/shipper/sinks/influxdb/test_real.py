"""The InfluxDB sinks against the real servers: InfluxDB 1.6 (`influxd`) for v1 and
read_back, VictoriaMetrics for the v2 write API."""

from __future__ import annotations

import itertools
import json
import urllib.parse
import urllib.request
from typing import Any

import orjson
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shipper.sinks.base import Outcome
from shipper.sinks.influxdb.config import InfluxV1SinkConfig, InfluxV2SinkConfig
from shipper.sinks.influxdb.encode import encode_record, point_time_ns
from shipper.sinks.influxdb.sink import InfluxV1Sink, InfluxV2Sink
from tests.realservers import vm_flush
from tests.shipper.sinks.influxdb.lp_parser import parse_line
from tests.shipper.sinks.records import BASE_NS, make_batch, make_record


def v1_sink(url: str, db: str, **kw: Any) -> InfluxV1Sink:
    cfg = InfluxV1SinkConfig.model_validate(
        {"type": "influxdb_v1", "url": url, "database": db, **kw})
    return InfluxV1Sink(cfg, "influx")


def influxql(url: str, db: str, q: str) -> Any:
    query = urllib.parse.urlencode({"db": db, "q": q, "epoch": "ns"})
    with urllib.request.urlopen(f"{url}/query?{query}", timeout=10) as resp:
        return json.loads(resp.read())["results"][0]


def count_points(url: str, db: str) -> int:
    res = influxql(url, db, 'SELECT count("seq") FROM /gpu_audit_.*/')
    return sum(s["values"][0][1] for s in res.get("series", []))


def test_v1_real_influxd_delivers_replays_idempotently_and_reads_back(
        influxd: tuple[str, str]) -> None:
    """Real influxd: a batch lands once, a replay overwrites, read_back returns the records,
    and each point sits at the record's exact ns time plus its seq offset."""
    url, db = influxd
    sink = v1_sink(url, db)
    sink.start()
    batch = make_batch(30) + make_batch(5, start=30, kind="gpu") + make_batch(
        3, start=35, kind="event")
    assert {r.outcome for r in sink.send(batch)} == {Outcome.DELIVERED}
    assert {r.outcome for r in sink.send(batch)} == {Outcome.DELIVERED}
    assert count_points(url, db) == 38
    got = list(sink.read_back(BASE_NS, BASE_NS + 10**9))
    assert sorted(g["seq"] for g in got) == list(range(38))
    by_seq = {g["seq"]: g for g in got}
    assert by_seq[7] == orjson.loads(batch[7].raw)
    res = influxql(url, db, 'SELECT "seq" FROM "gpu_audit_process" WHERE "seq" = 7')
    assert res["series"][0]["values"][0][0] == batch[7].doc["time_ns"] + 7  # seq 7: +7 ns


def test_v1_real_influxd_field_type_conflict_quarantines_only_those_records(
        influxd: tuple[str, str]) -> None:
    """A real 'partial write: field type conflict' dead-letters exactly the conflicting
    records (found by bisection), and the others are stored."""
    url, db = influxd
    # make `seq` a string field in gpu_audit_process for this shard
    body = f'gpu_audit_process,host=other seq="text" {BASE_NS - 10}'.encode()
    req = urllib.request.Request(f"{url}/write?db={db}&precision=ns", data=body, method="POST")
    urllib.request.urlopen(req, timeout=10).close()
    sink = v1_sink(url, db)
    batch = make_batch(3, kind="gpu") + make_batch(2, start=3, kind="process") + make_batch(
        2, start=5, kind="gpu")
    results = sink.send(batch)
    assert [r.outcome for r in results] == [Outcome.DELIVERED] * 3 + [
        Outcome.DEAD_LETTER] * 2 + [Outcome.DELIVERED] * 2
    assert "field type conflict" in results[3].reason
    got = sorted(r["seq"] for r in sink.read_back(BASE_NS, BASE_NS + 10**9))
    assert got == [0, 1, 2, 5, 6]


def test_v1_real_influxd_gzip(influxd: tuple[str, str]) -> None:
    """gzip-compressed writes are accepted by the real server."""
    url, db = influxd
    sink = v1_sink(url, db, gzip=True)
    assert {r.outcome for r in sink.send(make_batch(10))} == {Outcome.DELIVERED}
    assert count_points(url, db) == 10


_seqs = itertools.count(10**6)  # a fresh timestamp per example, never shared
_odd_text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=20)


@settings(max_examples=40, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(user=_odd_text, project=_odd_text, value_name=_odd_text)
def test_escaping_round_trips_through_real_influxd(
        influxd: tuple[str, str], user: str, project: str, value_name: str) -> None:
    """Whatever the tag values and field names, the real influxd reads back exactly the
    tag values our reference parser reads from the line, and the record unchanged."""
    url, db = influxd
    seq = next(_seqs)
    rec = make_record(seq, values={value_name: 1.5},
                      attribution={"user": user, "project": project, "job": "j"})
    line = encode_record(rec.doc, rec.raw, rec.record_id).decode()
    expected = parse_line(line)
    sink = v1_sink(url, db)
    assert [r.outcome for r in sink.send([rec])] == [Outcome.DELIVERED]
    t = point_time_ns(rec.doc)
    res = influxql(url, db, f'SELECT "user", "project", "record" FROM "gpu_audit_process" '
                            f"WHERE time = {t}")
    cols = res["series"][0]["columns"]
    row = dict(zip(cols, res["series"][0]["values"][-1], strict=True))
    assert row["user"] == expected.tags["user"]
    assert row["project"] == expected.tags["project"]
    assert orjson.loads(row["record"]) == orjson.loads(rec.raw)


def test_v2_api_against_real_victoria_metrics(victoria_metrics: str) -> None:
    """/api/v2/write to real VictoriaMetrics: every numeric field arrives as a
    <measurement>_<field> series; a replay adds no extra samples."""
    cfg = InfluxV2SinkConfig.model_validate({"type": "influxdb_v2", "url": victoria_metrics,
                                             "bucket": "audit", "org": "o",
                                             "flavour": "victoriametrics"})
    sink = InfluxV2Sink(cfg, "vm")
    batch = make_batch(20)
    assert {r.outcome for r in sink.send(batch)} == {Outcome.DELIVERED}
    assert {r.outcome for r in sink.send(batch)} == {Outcome.DELIVERED}
    vm_flush(victoria_metrics)
    query = urllib.parse.urlencode({"match[]": '{__name__="gpu_audit_process_seq"}',
                                    "start": str(BASE_NS // 10**9 - 60),
                                    "end": str(BASE_NS // 10**9 + 60)})
    with urllib.request.urlopen(f"{victoria_metrics}/api/v1/export?{query}",
                                timeout=10) as resp:
        series = [json.loads(line) for line in resp.read().splitlines() if line.strip()]
    seqs = sorted(v for s in series for v in s["values"])
    assert seqs == list(range(20))
    labels = series[0]["metric"]
    assert labels["host"] == "node-1" and labels["user"] == "alice"
    assert "pid" in labels and "gpu_uuid" in labels
    stamps = sorted(t for s in series for t in s["timestamps"])
    # VM keeps milliseconds; the point of seq s sits s ms after the record
    assert stamps == [r.doc["time_ns"] // 1_000_000 + r.doc["seq"] for r in batch]
