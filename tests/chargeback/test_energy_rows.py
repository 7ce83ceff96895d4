"""Whose energy the archive bills, so that the archive and Prometheus sources agree
(docs/CHARGEBACK.md, "Energy"): a free GPU's energy is the idle row's, a GPU held only
by owners gives its whole energy to them (the GPU utilisation their processes do not
explain included), and only processes nobody owns make unattributed energy.

One node, 10 s cycles, six measured intervals, through the real producer and sink:
- GPU 0: alice alone (SM 0.2) while the GPU is 0.8 busy; 1000 J per interval;
- GPU 1: free (no process); 500 J per interval;
- GPU 2: alice (SM 0.3) and an unowned process (SM 0.1), util 0.6; 600 J per interval.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from chargeback.compute import build_bill
from chargeback.directory import load_directory
from chargeback.model import UNATTRIBUTED, Request
from chargeback.rates import load_rates
from chargeback.sources.archive import read_archive
from tests.chargeback.archives import produce, write_archive
from tests.core.audit.factory import ALICE, gpu, proc, snapshot

pytestmark = pytest.mark.timeout(60)

DAY = dt.datetime(2026, 11, 3, tzinfo=dt.UTC)
DAY_S = DAY.timestamp()
MODEL = "NVIDIA H100 80GB HBM3"
N = 6
EXAMPLES = Path(__file__).resolve().parents[2] / "chargeback" / "examples"


def _snaps() -> list:  # type: ignore[type-arg]
    return [snapshot(DAY_S + 10 * k, [
        gpu(0, util=0.8, energy=1000.0 * k, power=100.0, processes=[proc(101, sm=0.2)]),
        gpu(1, util=0.0, energy=500.0 * k, power=50.0),
        gpu(2, util=0.6, energy=600.0 * k, power=60.0,
            processes=[proc(201, sm=0.3), proc(202, sm=0.1)]),
    ], {101: ALICE, 201: ALICE}, interval=10.0) for k in range(N + 1)]


def test_free_gpu_energy_is_idle_and_owners_carry_their_gpus_whole(tmp_path: Path) -> None:
    d = tmp_path / "archive"
    d.mkdir()
    write_archive(d, produce(_snaps(), host="n1", start_s=DAY_S - 5, stop_s=DAY_S + 70))
    req = Request(start=DAY, end=DAY + dt.timedelta(hours=1), source="archive", config=None,
                  prometheus_url=None, rates=None, directory=None, idle_policy="none",
                  out="-")
    data = read_archive(req, d)
    alice = data.usage[("alice", "vision"), MODEL]
    un = data.usage[UNATTRIBUTED, MODEL]
    # GPU 0 all alice's (1000 J, not 250 J by her SM and 750 J unattributed); GPU 2
    # split by SM over the held processes and the unexplained rest: alice 0.3, the
    # unowned process and the rest 0.3 of 0.6
    assert alice.energy_joules == pytest.approx(N * (1000 + 300))
    assert un.energy_joules == pytest.approx(N * 300)
    assert un.charged_gpu_seconds == 0  # GPU 2 is charged to alice; the unowned only share
    bill = build_bill(data, load_rates(EXAMPLES / "rates.yaml"),
                      load_directory(EXAMPLES / "directory.yaml"), "none")
    idle = next(r for r in bill.rows if r.kind == "idle")
    assert idle.energy_kwh == pytest.approx(N * 500 / 3.6e6)  # the free GPU 1
    assert idle.charged_gpu_hours == pytest.approx(N * 10 / 3600)


def test_the_search_source_bills_the_same_energy(tmp_path: Path) -> None:
    """The same records through the real search sink into the in-process Elasticsearch:
    the owners' remainder is added to them per model and day, the free GPU is idle."""
    import orjson

    from chargeback.sources.search import SearchSettings, read_search
    from shipper.sinks.base import SinkRecord
    from shipper.sinks.elasticsearch.bulk import SearchSink
    from shipper.sinks.elasticsearch.client import ElasticClient
    from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig
    from tests.chargeback.search_server import AggSearchServer

    raws = produce(_snaps(), host="n1", start_s=DAY_S - 5, stop_s=DAY_S + 70)
    with AggSearchServer("elasticsearch") as srv:
        cfg = ElasticsearchSinkConfig.model_validate(
            {"type": "elasticsearch", "hosts": [srv.url], "timeout_s": 30,
             "number_of_replicas": 0})
        sink = SearchSink(cfg, "es", ElasticClient(cfg))
        sink.start()
        sink.send([SinkRecord(offset=i, record_id=orjson.loads(r)["id"], doc=orjson.loads(r),
                              raw=r) for i, r in enumerate(raws, 1)])
        sink.close()
        req = Request(start=DAY, end=DAY + dt.timedelta(hours=1), source="elasticsearch",
                      config=None, prometheus_url=None, rates=None, directory=None,
                      idle_policy="none", out="-")
        data = read_search(req, SearchSettings(kind="elasticsearch", hosts=(srv.url,),
                                               index="gpu-audit-*", timeout_s=5))
    assert data.usage[("alice", "vision"), MODEL].energy_joules == pytest.approx(N * 1300)
    assert data.usage[UNATTRIBUTED, MODEL].energy_joules == pytest.approx(N * 300)
