"""`gpu-audit capacity --source elasticsearch|opensearch`: the crafted trail delivered by
the real search sink into the in-process Elasticsearch / OpenSearch of the chargeback
search tests gives the crafted hours, the same as the archive of the same records."""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from gpu_audit_app.cli import main
from shipper.sinks.base import SinkRecord
from shipper.sinks.elasticsearch.bulk import SearchSink
from shipper.sinks.elasticsearch.client import ElasticClient
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig
from shipper.sinks.opensearch.client import OpenSearchClient
from shipper.sinks.opensearch.config import OpenSearchSinkConfig
from tests.capacity.crafted import DAY, END, trail_records, write_trail
from tests.chargeback.search_server import AggSearchServer

pytestmark = pytest.mark.timeout(120)

PERIOD = ["--from", DAY.isoformat(), "--to", END.isoformat()]
FIGURES = ("installed_gpu_hours", "down_gpu_hours", "allocated_gpu_hours", "busy_gpu_hours",
           "held_idle_gpu_hours", "free_gpu_hours", "allocated_gpus_p95",
           "hours_at_90pct_allocated")


def _deliver(kind: str, url: str, payloads: list[bytes]) -> None:
    data = {"type": kind, "hosts": [url], "timeout_s": 30, "number_of_replicas": 0}
    if kind == "elasticsearch":
        es = ElasticsearchSinkConfig.model_validate(data)
        sink = SearchSink(es, "es", ElasticClient(es))
    else:
        os_ = OpenSearchSinkConfig.model_validate(data)
        sink = SearchSink(os_, "os", OpenSearchClient(os_))
    sink.start()
    recs = []
    for i, raw in enumerate(payloads, 1):
        doc = orjson.loads(raw)
        recs.append(SinkRecord(offset=i, record_id=doc["id"], doc=doc, raw=raw))
    sink.send(recs)
    sink.close()


@pytest.fixture(params=["elasticsearch", "opensearch"])
def server(request: pytest.FixtureRequest) -> Iterator[AggSearchServer]:
    with AggSearchServer(request.param) as srv:
        _deliver(request.param, srv.url, trail_records())
        yield srv


def _period(out: Path) -> dict[str, float]:
    with (out / "capacity.csv").open() as f:
        row = next(r for r in csv.DictReader(f)
                   if r["month"] == "period" and r["gpu_model"] == "all models")
    return {k: float(row[k]) for k in FIGURES}


def test_search_sinks_give_the_crafted_hours(server: AggSearchServer, tmp_path: Path) -> None:
    kind = server.flavour
    cfg = tmp_path / "search.yaml"
    cfg.write_text(f"shipper:\n  sinks:\n  - type: {kind}\n    hosts: [{server.url}]\n",
                   encoding="utf-8")
    out = tmp_path / "search"
    assert main(["capacity", "--source", kind, "--config", str(cfg), *PERIOD, "--bin", "hour",
                 "--out", str(out), "--no-png"]) == 0
    got = _period(out)
    # the crafted hours (tests/capacity/crafted.py), as the archive gives them
    assert got["installed_gpu_hours"] == pytest.approx(12, abs=1e-9)
    assert got["down_gpu_hours"] == pytest.approx(1, abs=1e-9)
    assert got["allocated_gpu_hours"] == pytest.approx(8, abs=1e-9)
    assert got["busy_gpu_hours"] == pytest.approx(4.9, abs=1e-9)
    assert got["held_idle_gpu_hours"] == pytest.approx(2, abs=1e-9)
    assert got["free_gpu_hours"] == pytest.approx(3, abs=1e-9)
    assert got["allocated_gpus_p95"] == pytest.approx(4, abs=1e-9)
    assert got["hours_at_90pct_allocated"] == 1
    archive_cfg = write_trail(tmp_path / "a")
    assert main(["capacity", "--config", str(archive_cfg), *PERIOD, "--bin", "hour", "--out",
                 str(tmp_path / "archive"), "--no-png"]) == 0
    assert _period(tmp_path / "archive") == pytest.approx(got, abs=1e-9)
