"""The sinks against the real products in containers (testcontainers): Elasticsearch,
OpenSearch, InfluxDB 2 and Fluentd. They need a Docker engine and skip, saying so, where
none answers. Each really delivers a batch, re-delivers it and reads it back.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr

from shipper.sinks.base import Outcome
from shipper.sinks.elasticsearch.bulk import SearchSink
from shipper.sinks.elasticsearch.client import ElasticClient
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig
from shipper.sinks.fluentd.config import FluentdSinkConfig
from shipper.sinks.fluentd.sink import FluentdSink
from shipper.sinks.influxdb.config import InfluxV2SinkConfig
from shipper.sinks.influxdb.sink import InfluxV2Sink
from shipper.sinks.opensearch.client import OpenSearchClient
from shipper.sinks.opensearch.config import OpenSearchSinkConfig
from tests.shipper.sinks.records import BASE_NS, make_batch


def _docker_reason() -> str | None:
    try:
        import docker

        docker.from_env().ping()
    except Exception as exc:
        return f"no Docker engine answers ({type(exc).__name__}); testcontainers tests need one"
    return None


_REASON = _docker_reason()
pytestmark = [pytest.mark.docker, pytest.mark.skipif(_REASON is not None, reason=_REASON or "")]

ES_IMAGE = "docker.elastic.co/elasticsearch/elasticsearch:9.1.5"
OS_IMAGE = "opensearchproject/opensearch:2.15.0"
INFLUX_IMAGE = "influxdb:2.7"
FLUENTD_IMAGE = "fluent/fluentd:v1.17-1"
WINDOW = (BASE_NS - 10**9, BASE_NS + 10**10)


def _deliver_twice_and_read_back(sink: Any, n: int = 50) -> None:
    batch = make_batch(n)
    sink.start()
    assert {r.outcome for r in sink.send(batch)} == {Outcome.DELIVERED}
    assert {r.outcome for r in sink.send(batch)} == {Outcome.DELIVERED}
    got = list(sink.read_back(*WINDOW))
    assert sorted(g["id"] for g in got) == sorted(r.record_id for r in batch)  # once each
    assert {g["seq"]: g for g in got}[7] == dict(batch[7].doc)


@pytest.fixture(scope="module")
def es_url() -> Iterator[str]:
    from testcontainers.community.elasticsearch import ElasticSearchContainer

    with ElasticSearchContainer(ES_IMAGE, mem_limit="2G") as es:
        yield f"http://{es.get_container_host_ip()}:{es.get_exposed_port(9200)}"


def test_elasticsearch_delivers_dedupes_and_reads_back(es_url: str) -> None:
    """Real Elasticsearch: bulk create, the replay is all 409s, read_back returns each once."""
    cfg = ElasticsearchSinkConfig.model_validate(
        {"type": "elasticsearch", "hosts": [es_url], "number_of_replicas": 0})
    _deliver_twice_and_read_back(SearchSink(cfg, "es", ElasticClient(cfg)))


def test_elasticsearch_data_stream(es_url: str) -> None:
    """Real Elasticsearch data stream: create + @timestamp, read back without @timestamp."""
    cfg = ElasticsearchSinkConfig.model_validate(
        {"type": "elasticsearch", "hosts": [es_url], "number_of_replicas": 0,
         "index_mode": "data_stream", "template_name": "gpu-audit-ds"})
    _deliver_twice_and_read_back(SearchSink(cfg, "es-ds", ElasticClient(cfg)))


def test_opensearch_delivers_dedupes_and_reads_back() -> None:
    """Real OpenSearch through opensearch-py: same contract as Elasticsearch."""
    from testcontainers.community.opensearch import OpenSearchContainer

    with OpenSearchContainer(OS_IMAGE) as os_:
        conf = os_.get_config()
        cfg = OpenSearchSinkConfig.model_validate(
            {"type": "opensearch", "hosts": [f"http://{conf['host']}:{conf['port']}"],
             "number_of_replicas": 0})
        _deliver_twice_and_read_back(SearchSink(cfg, "os", OpenSearchClient(cfg)))


def test_influxdb2_delivers_overwrites_and_reads_back_with_flux() -> None:
    """Real InfluxDB 2: /api/v2/write with a token, replay overwrites, Flux read_back."""
    from testcontainers.community.influxdb.version2 import InfluxDb2Container

    with InfluxDb2Container(INFLUX_IMAGE, init_mode="setup", admin_token="tok-123",
                            username="admin", password="password123", org_name="org",
                            bucket="audit") as influx:
        cfg = InfluxV2SinkConfig.model_validate(
            {"type": "influxdb_v2", "url": influx.get_url(), "org": "org", "bucket": "audit"})
        _deliver_twice_and_read_back(InfluxV2Sink(cfg, "influx2", token=SecretStr("tok-123")))


def test_fluentd_forward_with_acks(tmp_path: Path) -> None:
    """Real Fluentd in_forward: chunks are acknowledged and each record is emitted once."""
    from testcontainers.core.container import DockerContainer

    conf = tmp_path / "fluent.conf"
    conf.write_text(
        "<source>\n  @type forward\n  port 24224\n  bind 0.0.0.0\n</source>\n"
        "<match gpu_audit.**>\n  @type stdout\n</match>\n")
    container = (DockerContainer(FLUENTD_IMAGE)
                 .with_volume_mapping(str(tmp_path), "/fluentd/etc", "ro")
                 .with_exposed_ports(24224))
    with container:
        host = container.get_container_host_ip()
        port = int(container.get_exposed_port(24224))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        cfg = FluentdSinkConfig.model_validate(
            {"type": "fluentd", "host": host, "port": port, "ack_timeout_s": 20})
        sink = FluentdSink(cfg, "fluentd")
        sink.start()
        batch = make_batch(20)
        assert {r.outcome for r in sink.send(batch)} == {Outcome.DELIVERED}
        def logs() -> str:
            return b"".join(x or b"" for x in container.get_logs()).decode()

        # fluentd's stdout output flushes on its own schedule: wait for it, not a guess
        deadline = time.monotonic() + 60
        while (not all(rec.record_id in logs() for rec in batch)
               and time.monotonic() < deadline):
            time.sleep(0.2)
        out = logs()
        for rec in batch:
            assert out.count(rec.record_id) == 1
