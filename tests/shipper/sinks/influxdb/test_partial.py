"""Partial writes against the in-process Influx server answering as influxd 1.x and
InfluxDB 2.x do: lines the server kept are not sent again where the answer proves they
were kept, and every line that is sent again is reported (`ItemResult.sends`)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from shipper.sinks.base import Outcome, SinkRecord
from shipper.sinks.influxdb.config import InfluxV1SinkConfig, InfluxV2SinkConfig
from shipper.sinks.influxdb.encode import encode_record
from shipper.sinks.influxdb.sink import InfluxV1Sink, InfluxV2Sink
from tests.shipper.sinks.records import make_batch
from tests.shipper.sinks.servers.influx import InfluxServer


@pytest.fixture
def server() -> Iterator[InfluxServer]:
    with InfluxServer() as srv:
        yield srv


def v1(server: InfluxServer) -> InfluxV1Sink:
    cfg = InfluxV1SinkConfig.model_validate(
        {"type": "influxdb_v1", "url": server.url, "database": "audit", "timeout_s": 5})
    return InfluxV1Sink(cfg, "influx1")


def v2(server: InfluxServer) -> InfluxV2Sink:
    cfg = InfluxV2SinkConfig.model_validate(
        {"type": "influxdb_v2", "url": server.url, "bucket": "audit", "timeout_s": 5})
    return InfluxV2Sink(cfg, "influx2")


def _mixed(n_before: int, n_gpu: int, n_after: int) -> list[SinkRecord]:
    """Process records around a few gpu records (the ones a conflict will hit)."""
    return (make_batch(n_before) + make_batch(n_gpu, start=n_before, kind="gpu")
            + make_batch(n_after, start=n_before + n_gpu))


def _conflict_on_gpu_seq(server: InfluxServer) -> None:
    # `seq` of gpu_audit_gpu already exists as a string: every gpu record conflicts
    server.field_types[("gpu_audit_gpu", "seq")] = "string"


def test_v1_unparsable_lines_are_named_and_nothing_is_sent_twice(server: InfluxServer) -> None:
    """influxd 1.x names the lines it could not parse (`dropped=0`: they are not points)
    and stored every other line: the named ones are dead letters, the rest delivered,
    after ONE request; no line is sent twice."""
    sink = v1(server)
    batch = make_batch(48)
    server.reject = lambda line: "seq=3i" in line or "seq=40i" in line
    results = sink.send(batch)
    expected = [Outcome.DELIVERED] * 48
    expected[3] = expected[40] = Outcome.DEAD_LETTER
    assert [r.outcome for r in results] == expected
    assert "invalid field format" in results[3].reason
    assert server.write_requests == 1
    assert [r.sends for r in results] == [1] * 48
    assert len(server.points) == 46 and server.overwrites == 0


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_field_type_conflict_resends_the_unnamed_rest_once_and_counts_it(
        server: InfluxServer, version: str) -> None:
    """A field type conflict names a field and a measurement, not lines (v1 400 partial
    write, v2 422). The lines that can conflict and the others go again as two requests:
    the conflicting ones are all refused again (dead letters, `dropped` equals the whole
    request), the others are stored; no line is sent more than twice, and each second
    send is reported in `sends`."""
    sink = v1(server) if version == "v1" else v2(server)
    _conflict_on_gpu_seq(server)
    batch = _mixed(30, 3, 30)
    results = sink.send(batch)
    assert [r.outcome for r in results] == [Outcome.DELIVERED] * 30 + [
        Outcome.DEAD_LETTER] * 3 + [Outcome.DELIVERED] * 30
    assert "field type conflict" in results[30].reason
    assert [r.sends for r in results] == [2] * 63
    assert server.write_requests == 3
    assert len(server.points) == 60


def test_partial_write_that_refused_every_line_is_not_bisected(server: InfluxServer) -> None:
    """When `dropped` equals the number of lines sent, every line was refused: all are
    dead letters after one request."""
    sink = v1(server)
    _conflict_on_gpu_seq(server)
    results = sink.send(make_batch(8, kind="gpu"))
    assert [r.outcome for r in results] == [Outcome.DEAD_LETTER] * 8
    assert server.write_requests == 1
    assert [r.sends for r in results] == [1] * 8


def test_unnamed_rejection_without_a_usable_reason_is_bisected_and_counted(
        server: InfluxServer) -> None:
    """A partial write naming nothing usable is bisected until the refused line is alone;
    every line's number of sends is reported, and the sum of the extra sends equals the
    extra lines the server received."""
    sink = v1(server)
    server.reject = lambda line: "seq=5i" in line
    server.reject_style = "unnamed"
    results = sink.send(make_batch(8))
    assert [r.outcome for r in results] == [Outcome.DELIVERED] * 5 + [
        Outcome.DEAD_LETTER] + [Outcome.DELIVERED] * 2
    received = sum(len(body.splitlines()) for body in server.bodies)
    assert sum(r.sends for r in results) == received
    assert max(r.sends for r in results) > 1


def test_v2_unparsable_lines_refuse_the_body_and_the_rest_is_resent_counted(
        server: InfluxServer) -> None:
    """InfluxDB 2.x stores nothing of a body with an unparsable line (400): the named line
    is a dead letter and the others are sent again once, reported as such."""
    sink = v2(server)
    server.reject = lambda line: "seq=2i" in line
    results = sink.send(make_batch(4))
    assert [r.outcome for r in results] == [Outcome.DELIVERED, Outcome.DELIVERED,
                                            Outcome.DEAD_LETTER, Outcome.DELIVERED]
    assert [r.sends for r in results] == [2, 2, 1, 2]
    assert len(server.points) == 3


def test_failure_after_a_partial_write_keeps_what_was_delivered(server: InfluxServer) -> None:
    """A 503 on a follow-up request does not throw away the outcomes already known: lines
    stored by an earlier request stay DELIVERED, only the unresolved ones are RETRY."""
    sink = v1(server)
    _conflict_on_gpu_seq(server)
    server.write_status[3] = 503  # the follow-up with the conflicting lines (after the rest)
    results = sink.send(_mixed(4, 2, 4))
    assert [r.outcome for r in results] == [Outcome.DELIVERED] * 4 + [
        Outcome.RETRY] * 2 + [Outcome.DELIVERED] * 4
    assert len(server.points) == 8


def test_413_halves_are_counted_as_resends(server: InfluxServer) -> None:
    """A 413 stores nothing; the halves that follow are second sends and are reported."""
    sink = v1(server)
    batch = make_batch(4)
    two = [encode_record(r.doc, r.raw, r.record_id) for r in batch[:2]]
    server.max_body = len(b"\n".join(two)) + 1
    results = sink.send(batch)
    assert [r.outcome for r in results] == [Outcome.DELIVERED] * 4
    assert [r.sends for r in results] == [2] * 4
