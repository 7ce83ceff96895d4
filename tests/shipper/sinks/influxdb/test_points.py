"""One audit record, one point: no two records share a point key (measurement + tag set +
time), and a replay of the same record lands on its own point again."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gpu_audit.audit.verify import verify_readback
from shipper.sinks.base import Outcome
from shipper.sinks.influxdb.config import InfluxV1SinkConfig, InfluxV2SinkConfig
from shipper.sinks.influxdb.encode import (
    INFLUX_POINT_TIME,
    VICTORIAMETRICS_POINT_TIME,
    encode_record,
    point_time_ns,
)
from shipper.sinks.influxdb.sink import InfluxV1Sink, InfluxV2Sink
from tests.shipper.sinks.influxdb.lp_parser import parse_line
from tests.shipper.sinks.records import make_record
from tests.shipper.sinks.servers.influx import InfluxServer
from tests.shipper.sinks.trail import audit_trail, kinds, trail_window


@pytest.fixture
def server() -> Iterator[InfluxServer]:
    with InfluxServer() as srv:
        yield srv


def _v1(server: InfluxServer) -> InfluxV1Sink:
    cfg = InfluxV1SinkConfig.model_validate(
        {"type": "influxdb_v1", "url": server.url, "database": "audit", "timeout_s": 5})
    return InfluxV1Sink(cfg, "influx1")


def _v2(server: InfluxServer) -> InfluxV2Sink:
    cfg = InfluxV2SinkConfig.model_validate(
        {"type": "influxdb_v2", "url": server.url, "bucket": "audit", "timeout_s": 5})
    return InfluxV2Sink(cfg, "influx2")


def test_every_record_of_a_real_trail_maps_to_its_own_point() -> None:
    """Encoded with InfluxDB's (ns) and VictoriaMetrics' (ms) point times, the records of a
    trail holding every kind, three XIDs on one GPU in one cycle and one pid on two MIG
    instances give as many distinct (series key, time) pairs as there are records."""
    trail = audit_trail()
    for scheme, unit in ((INFLUX_POINT_TIME, 1), (VICTORIAMETRICS_POINT_TIME, 1_000_000)):
        keys = set()
        for rec in trail:
            point = parse_line(encode_record(rec.doc, rec.raw, rec.record_id,
                                             point_time=scheme).decode())
            keys.add((point.series_key, point.time // unit))
        assert len(keys) == len(trail), scheme


def test_point_time_is_deterministic_and_close_to_the_record_time() -> None:
    """The point's time is the record's time_ns plus (seq mod slots) steps: the same record
    always gets the same time, never earlier than the record and within the window."""
    for seq in (1, 2, 999, 1000, 1001, 123_456_789):
        doc = make_record(seq).doc
        for scheme in (INFLUX_POINT_TIME, VICTORIAMETRICS_POINT_TIME):
            t = point_time_ns(doc, scheme)
            assert t == point_time_ns(dict(doc), scheme)
            assert 0 <= t - doc["time_ns"] < scheme.window_ns
    doc = make_record(7).doc
    assert point_time_ns(doc, INFLUX_POINT_TIME) == doc["time_ns"] + 7
    assert point_time_ns(doc, VICTORIAMETRICS_POINT_TIME) == doc["time_ns"] + 7_000_000


def test_xid_code_is_written_as_an_integer_field() -> None:
    """An xid event's code (the record's `xid.code`) is an integer field of its point."""
    xid = next(r for r in audit_trail() if r.doc.get("event") == "xid")
    point = parse_line(encode_record(xid.doc, xid.raw, xid.record_id).decode())
    assert point.fields["xid"] == xid.doc["xid"]["code"]


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_trail_lands_as_one_point_per_record_and_replays_overwrite(
        server: InfluxServer, version: str) -> None:
    """Against the in-process server (which keys points like InfluxDB does), a trail of
    every record kind keeps one point per record; sending it again adds none; read_back
    returns every record and the hash chain verifies."""
    sink = _v1(server) if version == "v1" else _v2(server)
    trail = audit_trail()
    assert {r.outcome for r in sink.send(trail)} == {Outcome.DELIVERED}
    assert len(server.points) == len(trail)
    assert {r.outcome for r in sink.send(trail)} == {Outcome.DELIVERED}
    assert len(server.points) == len(trail)
    assert server.overwrites == len(trail)
    got = list(sink.read_back(*trail_window()))
    assert sorted(g["seq"] for g in got) == [r.doc["seq"] for r in trail]
    assert verify_readback(got, hmac_key=None, source="influx").ok
    assert sum(kinds(trail).values()) == len(trail)


def test_read_back_selects_by_the_record_time_not_the_point_time(server: InfluxServer) -> None:
    """read_back(start, end) returns exactly the records whose own time_ns is in range,
    although their points sit up to one window later."""
    sink = _v1(server)
    base = 1_790_000_000_000_000_000
    # record seq s at base + s: its point sits at base + 2s (offset s ns)
    batch = [make_record(seq, time_ns=base + seq) for seq in range(1, 11)]
    assert {r.outcome for r in sink.send(batch)} == {Outcome.DELIVERED}
    got = sorted(r["seq"] for r in sink.read_back(base + 3, base + 8))
    assert got == [3, 4, 5, 6, 7]  # 2 (point at base+4) out, 7 (point at base+14) in
