"""The InfluxDB sinks against the in-process Influx server: every fault, exact outcomes."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import orjson
import pytest
from pydantic import SecretStr

from shipper.sinks.base import Outcome, SinkError, SinkRecord
from shipper.sinks.errors import ReadBackUnsupported
from shipper.sinks.influxdb.config import InfluxV1SinkConfig, InfluxV2SinkConfig
from shipper.sinks.influxdb.encode import encode_record
from shipper.sinks.influxdb.sink import InfluxV1Sink, InfluxV2Sink
from tests.shipper.sinks.records import BASE_NS, make_batch, make_record
from tests.shipper.sinks.servers.http_base import Fault
from tests.shipper.sinks.servers.influx import InfluxServer


@pytest.fixture
def server() -> Iterator[InfluxServer]:
    with InfluxServer() as srv:
        yield srv


def v1(server: InfluxServer, **kw: object) -> InfluxV1Sink:
    cfg = InfluxV1SinkConfig.model_validate(
        {"type": "influxdb_v1", "url": server.url, "database": "audit", "timeout_s": 2, **kw}
    )
    return InfluxV1Sink(cfg, "influx1", password=SecretStr("s3cret") if "username" in kw else None)


def v2(server: InfluxServer, **kw: object) -> InfluxV2Sink:
    cfg = InfluxV2SinkConfig.model_validate(
        {"type": "influxdb_v2", "url": server.url, "bucket": "audit", "org": "o",
         "timeout_s": 2, **kw}
    )
    return InfluxV2Sink(cfg, "influx2", token=SecretStr("tok"))


def outcomes(results: object) -> list[Outcome]:
    return [r.outcome for r in results]  # type: ignore[attr-defined]


def test_v1_delivers_batch_and_replay_overwrites_same_points(server: InfluxServer) -> None:
    """A delivered batch is stored once per record; resending it overwrites, never adds."""
    sink = v1(server)
    batch = make_batch(20)
    assert outcomes(sink.send(batch)) == [Outcome.DELIVERED] * 20
    assert outcomes(sink.send(batch)) == [Outcome.DELIVERED] * 20
    assert len(server.points) == 20
    assert server.overwrites == 20
    assert sorted(r["id"] for r in server.records()) == sorted(r.record_id for r in batch)


def test_v1_partial_write_quarantines_only_named_lines(server: InfluxServer) -> None:
    """v1 400 'partial write: unable to parse' dead-letters the named lines, delivers the rest."""
    sink = v1(server)
    batch = make_batch(10)
    server.reject = lambda line: "seq=3i" in line or "seq=7i" in line
    results = sink.send(batch)
    expected = [Outcome.DELIVERED] * 10
    expected[3] = expected[7] = Outcome.DEAD_LETTER
    assert outcomes(results) == expected
    assert "invalid field format" in results[3].reason
    assert server.writes == 1  # named lines: no resend needed
    assert len(server.points) == 8


def test_v1_unnamed_rejection_is_bisected_to_the_bad_line(server: InfluxServer) -> None:
    """A partial write that does not name its lines is bisected until the bad one is alone."""
    sink = v1(server)
    server.reject = lambda line: "seq=5i" in line
    server.reject_style = "unnamed"
    results = sink.send(make_batch(8))
    expected = [Outcome.DELIVERED] * 8
    expected[5] = Outcome.DEAD_LETTER
    assert outcomes(results) == expected
    assert "field type conflict" in results[5].reason
    assert server.writes > 1
    assert len(server.points) == 7


def test_v2_422_partial_write_keeps_the_rest(server: InfluxServer) -> None:
    """v2 422 (InfluxDB 2.x: points refused on write, e.g. a field type conflict, the rest
    stored) dead-letters exactly the refused record; the others count as stored."""
    sink = v2(server)
    server.field_types[("gpu_audit_gpu", "seq")] = "string"
    batch = make_batch(1) + make_batch(1, start=1, kind="gpu") + make_batch(2, start=2)
    results = sink.send(batch)
    assert outcomes(results) == [Outcome.DELIVERED, Outcome.DEAD_LETTER,
                                 Outcome.DELIVERED, Outcome.DELIVERED]
    assert "field type conflict" in results[1].reason
    assert len(server.points) == 3


def test_v2_400_nothing_written_resends_the_good_lines(server: InfluxServer) -> None:
    """v2 400 rejects the whole batch: named lines are dead letters, the rest is resent."""
    sink = v2(server)
    server.reject = lambda line: "seq=2i" in line
    results = sink.send(make_batch(4))
    assert outcomes(results) == [Outcome.DELIVERED, Outcome.DELIVERED,
                                 Outcome.DEAD_LETTER, Outcome.DELIVERED]
    assert len(server.points) == 3


def test_413_splits_the_batch_until_it_fits(server: InfluxServer) -> None:
    """413 splits the batch in halves and resends; everything arrives once."""
    sink = v1(server)
    batch = make_batch(16)
    three = [encode_record(r.doc, r.raw, r.record_id) for r in batch[:3]]
    server.max_body = len(b"\n".join(three)) + 1
    assert outcomes(sink.send(batch)) == [Outcome.DELIVERED] * 16
    assert len(server.points) == 16
    assert server.writes == 8  # 16 -> 8 -> 4 -> 2 lines per accepted body


def test_413_on_a_single_line_is_a_dead_letter(server: InfluxServer) -> None:
    """A line larger than the server's limit on its own cannot ever go: dead letter."""
    sink = v1(server)
    server.max_body = 100
    results = sink.send(make_batch(2))
    assert outcomes(results) == [Outcome.DEAD_LETTER, Outcome.DEAD_LETTER]
    assert "larger than the server accepts" in results[0].reason


@pytest.mark.parametrize(
    ("fault", "outcome", "retry_after"),
    [
        (Fault(status=500, body=b'{"error":"timeout"}'), Outcome.RETRY, None),
        (Fault(status=503, retry_after="7"), Outcome.RETRY, 7.0),
        (Fault(status=429, retry_after="2.5"), Outcome.RETRY, 2.5),
        (Fault(status=401, body=b'{"error":"authorization failed"}'), Outcome.HOLD, None),
        (Fault(status=403), Outcome.HOLD, None),
        (Fault(reset=True), Outcome.RETRY, None),
    ],
    ids=["500", "503-retry-after", "429-retry-after", "401", "403", "reset"],
)
def test_whole_request_failures_are_classified(
    server: InfluxServer, fault: Fault, outcome: Outcome, retry_after: float | None
) -> None:
    """5xx/429/reset raise RETRY with Retry-After; 401/403 raise HOLD; nothing is stored."""
    sink = v1(server)
    server.add_fault(fault)
    with pytest.raises(SinkError) as info:
        sink.send(make_batch(3))
    assert info.value.outcome is outcome
    assert info.value.retry_after == retry_after
    assert not server.points


def test_slow_server_times_out_as_retry(server: InfluxServer) -> None:
    """An answer slower than timeout_s is a RETRY (the replay later is idempotent)."""
    sink = v1(server, timeout_s=0.3)
    server.add_fault(Fault(delay_s=1.0, status=204))
    with pytest.raises(SinkError) as info:
        sink.send(make_batch(1))
    assert info.value.outcome is Outcome.RETRY


def test_missing_database_holds(server: InfluxServer) -> None:
    """404 database not found holds the data (config problem), on start and on send."""
    cfg = InfluxV1SinkConfig.model_validate(
        {"type": "influxdb_v1", "url": server.url, "database": "nope"})
    sink = InfluxV1Sink(cfg, "x")
    with pytest.raises(SinkError) as info:
        sink.start()
    assert info.value.outcome is Outcome.HOLD
    with pytest.raises(SinkError) as info:
        sink.send(make_batch(1))
    assert info.value.outcome is Outcome.HOLD


def test_missing_bucket_holds_v2(server: InfluxServer) -> None:
    """v2 404 bucket not found is HOLD."""
    sink = v2(server, bucket="gone")
    with pytest.raises(SinkError) as info:
        sink.send(make_batch(1))
    assert info.value.outcome is Outcome.HOLD


def test_v1_basic_and_query_auth(server: InfluxServer) -> None:
    """Credentials go as Basic auth (default) or u/p parameters; wrong ones HOLD."""
    server.basic = ("bob", "s3cret")
    assert outcomes(v1(server, username="bob", password_env="X").send(make_batch(1))) == [
        Outcome.DELIVERED]
    sink = v1(server, username="bob", password_env="X", auth="query")
    assert outcomes(sink.send(make_batch(1, start=1))) == [Outcome.DELIVERED]
    server.basic = ("bob", "other")
    with pytest.raises(SinkError) as info:
        sink.send(make_batch(1))
    assert info.value.outcome is Outcome.HOLD
    assert "s3cret" not in info.value.reason


def test_v2_token_header_is_sent(server: InfluxServer) -> None:
    """v2 authenticates with `Authorization: Token <token>`; a wrong token HOLDs."""
    server.token = "tok"
    assert outcomes(v2(server).send(make_batch(2))) == [Outcome.DELIVERED] * 2
    server.token = "different"
    with pytest.raises(SinkError) as info:
        v2(server).send(make_batch(1))
    assert info.value.outcome is Outcome.HOLD


def test_gzip_bodies(server: InfluxServer) -> None:
    """gzip: the body goes compressed with Content-Encoding: gzip and decodes to the lines."""
    sink = v1(server, gzip=True)
    assert outcomes(sink.send(make_batch(5))) == [Outcome.DELIVERED] * 5
    assert server.encodings[-1] == "gzip"
    assert len(server.points) == 5
    assert gzip.compress(b"") != b""  # sanity: gzip module is real


def test_record_without_time_ns_and_oversized_are_dead_letters(server: InfluxServer) -> None:
    """A record with no time_ns or above 64 KiB is dead-lettered with a reason; others go."""
    sink = v1(server)
    good = make_record(1)
    big = make_record(2, pad=70 * 1024)
    doc = {**make_record(3).doc, "time_ns": "yesterday"}
    no_time = SinkRecord(3, doc["id"], doc, orjson.dumps(doc))
    results = sink.send([good, big, no_time])
    assert outcomes(results) == [Outcome.DELIVERED, Outcome.DEAD_LETTER, Outcome.DEAD_LETTER]
    assert "64" in results[1].reason or "65536" in results[1].reason
    assert "time_ns" in results[2].reason


def test_read_back_v1_and_v2_return_records_in_range(server: InfluxServer) -> None:
    """read_back returns exactly the stored records whose time is in [start, end)."""
    batch = make_batch(10)
    v1(server).send(batch)
    got = list(v1(server).read_back(BASE_NS + 2_000_000, BASE_NS + 5_000_000))
    assert [r["seq"] for r in got] == [2, 3, 4]
    assert got[0] == dict(batch[2].doc)
    got2 = list(v2(server).read_back(BASE_NS, BASE_NS + 3_000_000))
    assert [r["seq"] for r in got2] == [0, 1, 2]


def test_victoriametrics_read_back_is_refused_clearly(server: InfluxServer) -> None:
    """VictoriaMetrics keeps no string fields: read_back raises ReadBackUnsupported."""
    sink = v2(server, flavour="victoriametrics")
    with pytest.raises(ReadBackUnsupported, match="VictoriaMetrics"):
        list(sink.read_back(0, 1))


def test_transport_errors_never_carry_the_password(server: InfluxServer) -> None:
    """With u/p query auth, a connection reset's reason has the password redacted."""
    sink = v1(server, username="bob", password_env="X", auth="query")
    server.add_fault(Fault(reset=True))
    with pytest.raises(SinkError) as info:
        sink.send(make_batch(1))
    assert "s3cret" not in info.value.reason
    assert "s3cret" not in repr(vars(sink))
