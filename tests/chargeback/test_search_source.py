"""The search source: the archive test's month-in-miniature delivered by the real search
sink into an in-process Elasticsearch / OpenSearch that answers aggregations (the
contract: the request bodies it is sent, and the answers parsed back), then into a real
Elasticsearch in a container where Docker runs."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from dataclasses import astuple
from pathlib import Path
from typing import Any

import orjson
import pytest

from chargeback.model import UNATTRIBUTED, SourceData
from chargeback.sources import search_query
from chargeback.sources.archive import read_archive
from chargeback.sources.search import SearchSettings, SearchUnavailable, read_search
from gpu_audit.errors import ConfigError
from shipper.sinks.base import SinkRecord
from shipper.sinks.elasticsearch.bulk import SearchSink
from shipper.sinks.elasticsearch.client import ElasticClient
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig
from shipper.sinks.opensearch.client import OpenSearchClient
from shipper.sinks.opensearch.config import OpenSearchSinkConfig
from tests.chargeback.archives import write_archive
from tests.chargeback.search_server import AggSearchServer
from tests.chargeback.test_archive_source import (
    ALICE_O,
    BOB_O,
    MODEL,
    E,
    N,
    _req,
    _runs,
)

pytestmark = pytest.mark.timeout(120)


def _records(interval_s: float | None = None) -> list[SinkRecord]:
    real, sim = _runs(interval_s)
    out = []
    for i, raw in enumerate([*real, *sim], 1):
        doc = orjson.loads(raw)
        out.append(SinkRecord(offset=i, record_id=doc["id"], doc=doc, raw=raw))
    return out


def _deliver(kind: str, url: str, interval_s: float | None = None, **extra: Any) -> None:
    data = {"type": kind, "hosts": [url], "timeout_s": 30, "number_of_replicas": 0, **extra}
    if kind == "elasticsearch":
        es = ElasticsearchSinkConfig.model_validate(data)
        sink = SearchSink(es, "es", ElasticClient(es))
    else:
        os_ = OpenSearchSinkConfig.model_validate(data)
        sink = SearchSink(os_, "os", OpenSearchClient(os_))
    sink.start()
    recs = _records(interval_s)
    for i in range(0, len(recs), 200):
        sink.send(recs[i:i + 200])
    sink.close()


@pytest.fixture(params=["elasticsearch", "opensearch"])
def server(request: pytest.FixtureRequest) -> Iterator[AggSearchServer]:
    with AggSearchServer(request.param) as srv:
        _deliver(request.param, srv.url)
        yield srv


def _settings(kind: str, url: str) -> SearchSettings:
    return SearchSettings(kind=kind, hosts=(url,), index="gpu-audit-*", timeout_s=5)


def _check_against_the_archive(d: SourceData, tmp_path: Path) -> None:
    arch_dir = tmp_path / "archive"
    arch_dir.mkdir()
    write_archive(arch_dir, *_runs())
    a = read_archive(_req(), arch_dir)
    assert d.fleet[MODEL].gpu_seconds == a.fleet[MODEL].gpu_seconds == 4 * N * E
    assert d.fleet[MODEL].down_gpu_seconds == a.fleet[MODEL].down_gpu_seconds
    assert d.fleet[MODEL].energy_joules == a.fleet[MODEL].energy_joules
    assert d.fleet[MODEL].power_energy_joules == pytest.approx(a.fleet[MODEL].power_energy_joules)
    assert d.fleet[MODEL].held_gpu_seconds == a.fleet[MODEL].held_gpu_seconds
    for owner in (ALICE_O, BOB_O, UNATTRIBUTED):
        s, r = d.usage[owner, MODEL], a.usage[owner, MODEL]
        assert s.energy_joules == r.energy_joules, owner
        # charged is scaled per model and day: here it equals the per-interval split
        assert s.charged_gpu_seconds == pytest.approx(r.charged_gpu_seconds), owner
    # used: alice's two processes on GPU 3 each count (documented); the archive once
    assert d.usage[ALICE_O, MODEL].used_gpu_seconds == 3 * N * E
    assert a.usage[ALICE_O, MODEL].used_gpu_seconds == 2 * N * E
    assert d.usage[BOB_O, MODEL].busy_gpu_seconds == pytest.approx(0.25 * N * E)
    assert d.simulated_excluded == a.simulated_excluded > 0
    assert sorted(d.days) == sorted(a.days)
    charged = sum(u.charged_gpu_seconds for u in d.usage.values())
    free = N * E  # GPU 1
    assert charged + free == pytest.approx(d.fleet[MODEL].gpu_seconds)


def test_aggregations_give_the_archive_s_bill(server: AggSearchServer, tmp_path: Path) -> None:
    d = read_search(_req(), _settings(server.flavour, server.url))
    assert d.source == server.flavour and d.verified is None
    _check_against_the_archive(d, tmp_path)


def test_every_request_body_is_recorded_as_canonical_json(server: AggSearchServer) -> None:
    d = read_search(_req(), _settings(server.flavour, server.url))
    sent = [json.dumps(b, sort_keys=True, separators=(",", ":")) for b in server.bodies]
    assert [q.split(" ", 2)[2] for q in d.queries] == sent
    assert all(q.startswith("POST gpu-audit-*/_search {") for q in d.queries)
    first = server.bodies[0]
    filters = first["query"]["bool"]["filter"]
    lo = int(_req().start.timestamp()) * 10**9
    assert {"range": {"time_ns": {"gt": lo, "lte": lo + 2 * 3600 * 10**9}}} in filters
    assert first["query"]["bool"]["must_not"] == [{"term": {"simulated": True}},
                                                  {"term": {"sim": True}}]
    sources = [next(iter(s)) for s in first["aggs"]["rows"]["composite"]["sources"]]
    assert sources == ["user", "project", "model", "day"]
    with_sim = read_search(_req(include_simulated=True), _settings(server.flavour, server.url))
    assert ("mallory", "nlp") in {o for o, _ in with_sim.usage}
    assert with_sim.simulated_excluded == 0


def test_interval_records_bill_as_the_archive_bills_them(tmp_path: Path) -> None:
    """The 60 s trail (schema 3) in the index: the holders' and GPUs' own sums give the
    archive's bill of the same records, and the proof says every stream is whole."""
    with AggSearchServer("elasticsearch") as srv:
        _deliver("elasticsearch", srv.url, interval_s=60.0)
        d = read_search(_req(), _settings("elasticsearch", srv.url))
    arch = tmp_path / "archive"
    arch.mkdir()
    write_archive(arch, *_runs(60.0))
    a = read_archive(_req(), arch)
    assert d.fleet.keys() == a.fleet.keys() and d.usage.keys() == a.usage.keys()
    for m, f in a.fleet.items():
        assert astuple(d.fleet[m]) == pytest.approx(astuple(f)), m
    for k, u in a.usage.items():
        assert astuple(d.usage[k]) == pytest.approx(astuple(u)), k
    assert d.completeness is not None and d.completeness.gaps == []
    assert all("continuous from seq 1" in c for c in d.completeness.chains)


def test_a_record_missing_from_the_index_is_a_named_gap() -> None:
    """Seq contiguity by aggregation (count against max - min + 1 per host and stream):
    a document deleted from the index refuses the bill, naming the stream and how many
    seqs are missing; --allow-gaps bills it, stamped."""
    with AggSearchServer("elasticsearch") as srv:
        _deliver("elasticsearch", srv.url, interval_s=60.0)
        with srv.lock:
            victim = next(k for k, d in srv.docs.items()
                          if d.get("kind") == "usage" and d.get("host") == "gpu-node-07")
            del srv.docs[victim]
        with pytest.raises(SearchUnavailable) as exc:
            read_search(_req(), _settings("elasticsearch", srv.url))
        assert "records are missing" in str(exc.value)
        assert "stream exporter of host gpu-node-07: 1 seq(s) of" in str(exc.value)
        d = read_search(_req(allow_gaps=True), _settings("elasticsearch", srv.url))
        assert d.completeness is not None and d.completeness.allowed


def test_composite_pages_are_followed(
    server: AggSearchServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = read_search(_req(), _settings(server.flavour, server.url))
    monkeypatch.setattr(search_query, "PAGE_SIZE", 1)
    paged = read_search(_req(), _settings(server.flavour, server.url))
    assert len(paged.queries) > len(whole.queries) + 3
    assert any('"after":' in q for q in paged.queries)
    assert paged.usage == whole.usage and paged.fleet == whole.fleet


def test_unreachable_backend_is_a_clear_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for kind in ("elasticsearch", "opensearch"):
        with pytest.raises(SearchUnavailable, match=rf"{kind} http://127.0.0.1:{port}"):
            read_search(_req(), _settings(kind, f"http://127.0.0.1:{port}"))


def test_an_empty_period_is_an_error_not_an_empty_bill() -> None:
    with AggSearchServer("elasticsearch") as srv, \
            pytest.raises(SearchUnavailable, match="no usage"):
        read_search(_req(), _settings("elasticsearch", srv.url))


def test_settings_come_from_the_sink_configuration(tmp_path: Path) -> None:
    from gpu_audit_app.chargeback.sources import archive_source, search_settings

    (tmp_path / "pw").write_text("s3cret\n")
    (tmp_path / "key").write_text("hmac-key\n")
    cfg = tmp_path / "c.yaml"
    key, spool, pw = tmp_path / "key", tmp_path / "spool", tmp_path / "pw"
    cfg.write_text(
        f"audit: {{hmac_key_file: {key}}}\n"
        f"spool: {{directory: {spool}}}\n"
        "shipper:\n  sinks:\n    - {type: archive}\n"
        "    - {type: elasticsearch, hosts: [https://es:9200], username: u,\n"
        f"       password_file: {pw}, tls: {{verify: false}}, index_mode: data_stream}}\n")
    s = search_settings(cfg, "elasticsearch")
    assert (s.hosts, s.index, s.username, s.password) == (
        ("https://es:9200",), "gpu-audit.records", "u", "s3cret")
    assert s.tls.verify is False
    assert archive_source(cfg) == (tmp_path / "archive", b"hmac-key")
    with pytest.raises(ConfigError, match="no opensearch sink"):
        search_settings(cfg, "opensearch")


def _docker_reason() -> str | None:
    try:
        import docker

        docker.from_env().ping()
    except Exception as exc:
        return f"no Docker engine answers ({type(exc).__name__}); testcontainers tests need one"
    return None


@pytest.mark.docker
@pytest.mark.timeout(600)
def test_real_elasticsearch_answers_the_same_aggregations(tmp_path: Path) -> None:
    reason = _docker_reason()
    if reason is not None:
        pytest.skip(reason)
    from testcontainers.community.elasticsearch import ElasticSearchContainer

    with ElasticSearchContainer("docker.elastic.co/elasticsearch/elasticsearch:9.1.5",
                                mem_limit="2G") as es:
        url = f"http://{es.get_container_host_ip()}:{es.get_exposed_port(9200)}"
        _deliver("elasticsearch", url)
        import elasticsearch

        elasticsearch.Elasticsearch(url).indices.refresh(index="gpu-audit-*")
        d = read_search(_req(), _settings("elasticsearch", url))
    _check_against_the_archive(d, tmp_path)


def test_two_archive_sinks_are_chosen_by_name_as_audit_verify_chooses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With two archive sinks, `--sink NAME` names the one to bill from (a sink's name is
    its type unless set, as `spool stats` shows it), and the choice reads the same
    configuration layers as every command (GPU_AUDIT__* overrides included)."""
    from gpu_audit_app.chargeback.sources import archive_source

    cfg = tmp_path / "c.yaml"
    cfg.write_text(
        f"spool: {{directory: {tmp_path / 'spool'}}}\n"
        "shipper:\n  sinks:\n"
        f"    - {{type: archive, directory: {tmp_path / 'local'}}}\n"
        f"    - {{type: archive, name: offsite, directory: {tmp_path / 'nfs'}}}\n")
    with pytest.raises(ConfigError, match=r"2 archive sinks \('archive', 'offsite'\).*--sink"):
        archive_source(cfg)
    assert archive_source(cfg, "offsite")[0] == tmp_path / "nfs"
    assert archive_source(cfg, "archive")[0] == tmp_path / "local"
    with pytest.raises(ConfigError, match="no archive sink named 'nope'"):
        archive_source(cfg, "nope")
    monkeypatch.setenv("GPU_AUDIT__AUDIT__HMAC_KEY_FILE", str(tmp_path / "key"))
    (tmp_path / "key").write_text("offsite-hmac-key-0123456789\n")
    assert archive_source(cfg, "offsite")[1] == b"offsite-hmac-key-0123456789"


def test_chargeback_takes_sink(tmp_path: Path) -> None:
    """`gpu-audit chargeback bill --sink NAME` is an option of the command."""
    from gpu_audit_app.cli import build_parser

    args = build_parser("chargeback").parse_args(
        ["chargeback", "bill", "--month", "2026-11", "--source", "archive", "--sink", "offsite"])
    assert args.sink == "offsite"
