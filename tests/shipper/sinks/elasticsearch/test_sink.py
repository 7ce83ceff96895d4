"""Elasticsearch and OpenSearch sinks against the in-process bulk server."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import SecretStr

from shipper.sinks.base import Outcome, SinkError
from shipper.sinks.elasticsearch import response
from shipper.sinks.elasticsearch.bulk import SearchSink
from shipper.sinks.elasticsearch.client import ElasticClient
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig
from shipper.sinks.opensearch.client import OpenSearchClient
from shipper.sinks.opensearch.config import OpenSearchSinkConfig
from tests.shipper.sinks.records import BASE_NS, make_batch, make_record
from tests.shipper.sinks.servers.http_base import Fault
from tests.shipper.sinks.servers.search import SearchServer

FLAVOURS = ["elasticsearch", "opensearch"]


@pytest.fixture(params=FLAVOURS)
def server(request: pytest.FixtureRequest) -> Iterator[SearchServer]:
    with SearchServer(request.param) as srv:
        yield srv


def make_sink(server: SearchServer, **kw: Any) -> SearchSink:
    data = {"type": server.flavour, "hosts": [server.url], "timeout_s": 2, **kw}
    password = SecretStr("pw") if "username" in kw else None
    if server.flavour == "elasticsearch":
        cfg_es = ElasticsearchSinkConfig.model_validate(data)
        return SearchSink(cfg_es, "es", ElasticClient(cfg_es, password=password))
    cfg_os = OpenSearchSinkConfig.model_validate(data)
    return SearchSink(cfg_os, "os", OpenSearchClient(cfg_os, password=password))


def outcomes(results: Any) -> list[Outcome]:
    return [r.outcome for r in results]


def test_start_installs_composable_template(server: SearchServer) -> None:
    """start() puts the index template: keyword ids, date_nanos time, double values."""
    make_sink(server).start()
    tpl = server.templates["gpu-audit"]
    assert tpl["index_patterns"] == ["gpu-audit-*"]
    props = tpl["template"]["mappings"]["properties"]
    assert props["time"]["type"] == "date_nanos"
    assert props["id"]["type"] == "keyword"
    assert props["attribution"]["properties"]["user"]["type"] == "keyword"


def test_bulk_create_into_daily_index_from_record_time(server: SearchServer) -> None:
    """Records go to gpu-audit-YYYY.MM.DD of their own time, with _id = record id."""
    sink = make_sink(server)
    batch = [*make_batch(3), make_record(9, time_ns=BASE_NS + 86400 * 10 ** 9)]
    assert outcomes(sink.send(batch)) == [Outcome.DELIVERED] * 4
    assert sorted(server.docs) == sorted(
        [("gpu-audit-2026.09.21", r.record_id) for r in batch[:3]]
        + [("gpu-audit-2026.09.22", batch[3].record_id)])


def test_resend_is_409_delivered_and_not_stored_twice(server: SearchServer) -> None:
    """A resent batch answers 409 per item: counted delivered, stored once."""
    sink = make_sink(server)
    batch = make_batch(5)
    sink.send(batch)
    assert outcomes(sink.send(batch)) == [Outcome.DELIVERED] * 5
    assert len(server.docs) == 5
    assert server.conflicts == 5


def test_mixed_item_outcomes_in_one_response(server: SearchServer) -> None:
    """One bulk answer with 201/409/429/400/503: delivered, delivered, retry, dead, retry."""
    sink = make_sink(server)
    batch = make_batch(5)
    sink.send([batch[1]])
    statuses = {2: 429, 3: 400, 4: 503}
    server.item_status = lambda doc: statuses.get(doc["seq"])
    results = sink.send(batch)
    assert outcomes(results) == [Outcome.DELIVERED, Outcome.DELIVERED, Outcome.RETRY,
                                 Outcome.DEAD_LETTER, Outcome.RETRY]
    assert results[3].reason == "400 mapper_parsing_exception: injected 400"
    assert "es_rejected_execution_exception" in results[2].reason
    assert sorted(i for _, i in server.docs) == sorted([batch[0].record_id, batch[1].record_id])
    # the retry sends only the retried items and they land once
    server.item_status = None
    again = [batch[2], batch[4]]
    assert outcomes(sink.send(again)) == [Outcome.DELIVERED] * 2
    assert len(server.docs) == 4


def test_flood_stage_block_is_retried(server: SearchServer) -> None:
    """cluster_block_exception (flood stage) as 429 is RETRY, not dead letter."""
    sink = make_sink(server)
    server.item_status = lambda doc: 429
    assert outcomes(sink.send(make_batch(2))) == [Outcome.RETRY] * 2


def test_index_missing_per_item_holds(server: SearchServer) -> None:
    """404 index_not_found_exception on an item (auto-create off) is HOLD."""
    sink = make_sink(server)
    server.auto_create = False
    results = sink.send(make_batch(1))
    assert outcomes(results) == [Outcome.HOLD]


@pytest.mark.parametrize(
    ("fault", "outcome", "retry_after"),
    [
        (Fault(status=503, body=b'{"error":"unavailable"}', path_contains="_bulk"),
         Outcome.RETRY, None),
        (Fault(status=429, retry_after="3", body=b'{"error":{"type":"es_rejected_execution_'
               b'exception","reason":"queue full"}}', path_contains="_bulk"),
         Outcome.RETRY, 3.0),
        (Fault(status=401, body=b'{"error":{"type":"security_exception","reason":"no"}}',
               path_contains="_bulk"), Outcome.HOLD, None),
        (Fault(status=403, body=b'{"error":"forbidden"}', path_contains="_bulk"),
         Outcome.HOLD, None),
        (Fault(status=404, body=b'{"error":{"type":"index_not_found_exception","reason":"x"}}',
               path_contains="_bulk"), Outcome.HOLD, None),
        (Fault(reset=True, path_contains="_bulk"), Outcome.RETRY, None),
    ],
    ids=["503", "429-retry-after", "401", "403", "404", "reset"],
)
def test_whole_request_failures(
    server: SearchServer, fault: Fault, outcome: Outcome, retry_after: float | None
) -> None:
    """Whole-request 5xx/429/reset -> RETRY (+Retry-After); 401/403/404 -> HOLD."""
    sink = make_sink(server)
    server.add_fault(fault)
    with pytest.raises(SinkError) as info:
        sink.send(make_batch(2))
    assert info.value.outcome is outcome
    assert info.value.retry_after == retry_after
    assert not server.docs


def test_slow_answer_times_out_as_retry(server: SearchServer) -> None:
    """An answer slower than timeout_s is RETRY; the resend after it is idempotent."""
    sink = make_sink(server, timeout_s=0.3)
    server.add_fault(Fault(delay_s=1.0, path_contains="_bulk"))
    batch = make_batch(2)
    with pytest.raises(SinkError) as info:
        sink.send(batch)
    assert info.value.outcome is Outcome.RETRY
    sink2 = make_sink(server)
    assert outcomes(sink2.send(batch)) == [Outcome.DELIVERED] * 2
    assert len(server.docs) == 2


def test_413_splits_and_single_bad_request_is_dead_lettered(server: SearchServer) -> None:
    """413 splits the batch; a single record still refused whole is a dead letter."""
    sink = make_sink(server)
    server.add_fault(Fault(status=413, body=b'{"error":"too large"}', path_contains="_bulk"))
    assert outcomes(sink.send(make_batch(4))) == [Outcome.DELIVERED] * 4
    assert server.bulk_requests == 2
    server.add_fault(Fault(status=400, body=b'{"error":{"type":"x_content_parse_exception",'
                           b'"reason":"bad"}}', path_contains="_bulk"))
    results = sink.send([make_record(10)])
    assert outcomes(results) == [Outcome.DEAD_LETTER]
    assert "x_content_parse_exception" in results[0].reason


def test_basic_auth_is_sent(server: SearchServer) -> None:
    """username + password go as Basic auth; without them the server says 401 -> HOLD."""
    server.basic = "Basic " + base64.b64encode(b"elastic:pw").decode()
    assert outcomes(make_sink(server, username="elastic", password_env="P").send(
        make_batch(1))) == [Outcome.DELIVERED]
    with pytest.raises(SinkError) as info:
        make_sink(server).send(make_batch(1, start=5))
    assert info.value.outcome is Outcome.HOLD


def test_data_stream_mode_adds_timestamp_and_read_back_strips_it(server: SearchServer) -> None:
    """Data streams get create + @timestamp from `time`; read_back returns the record."""
    sink = make_sink(server, index_mode="data_stream")
    sink.start()
    assert server.templates["gpu-audit"]["data_stream"] == {}
    batch = make_batch(3)
    assert outcomes(sink.send(batch)) == [Outcome.DELIVERED] * 3
    stored = server.docs[("gpu-audit.records", batch[0].record_id)]
    assert stored["@timestamp"] == batch[0].doc["time"]
    got = list(sink.read_back(BASE_NS, BASE_NS + 10**9))
    assert got == [dict(r.doc) for r in batch]


def test_read_back_pages_with_search_after(server: SearchServer, monkeypatch: Any) -> None:
    """read_back pages through more hits than one page, in (stream, seq) order, in range."""
    monkeypatch.setattr("shipper.sinks.elasticsearch.bulk._PAGE", 4)
    sink = make_sink(server)
    sink.send(make_batch(11))
    got = list(sink.read_back(BASE_NS + 1_000_000, BASE_NS + 10_000_000))
    assert [r["seq"] for r in got] == list(range(1, 10))


def test_elasticsearch_client_refuses_opensearch_server_clearly() -> None:
    """type: elasticsearch against OpenSearch holds with a hint to use type: opensearch."""
    with SearchServer("opensearch") as srv:
        cfg = ElasticsearchSinkConfig.model_validate({"type": "elasticsearch",
                                                      "hosts": [srv.url]})
        sink = SearchSink(cfg, "es", ElasticClient(cfg))
        with pytest.raises(SinkError) as info:
            sink.send(make_batch(1))
        assert info.value.outcome is Outcome.HOLD
        assert "type: opensearch" in info.value.reason


def test_item_classification_table() -> None:
    """The per-item table: 2xx/409 delivered, 429/5xx/blocks retry, 404 index hold, 4xx dead."""
    def item(status: int, etype: str = "") -> dict[str, Any]:
        return {"create": {"status": status, "error": {"type": etype, "reason": "r"}}}

    assert response.classify_item(item(201)).outcome is Outcome.DELIVERED
    assert response.classify_item(item(409)).outcome is Outcome.DELIVERED
    assert response.classify_item(item(429)).outcome is Outcome.RETRY
    assert response.classify_item(item(403, "cluster_block_exception")).outcome is Outcome.RETRY
    assert response.classify_item(item(502)).outcome is Outcome.RETRY
    assert response.classify_item(item(404, "index_not_found_exception")).outcome is Outcome.HOLD
    assert response.classify_item(item(400, "mapper_parsing_exception")).outcome is \
        Outcome.DEAD_LETTER
    short = response.classify_response({"items": [item(201)]}, 2)
    assert [r.outcome for r in short] == [Outcome.DELIVERED, Outcome.RETRY]
