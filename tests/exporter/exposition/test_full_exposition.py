"""The complete `/metrics` body, byte for byte: the rendered snapshot followed by every
live family (sampler, attribution, audit producer, shipper and spool, and the per-scrape
serving families), as `gpu-audit run` assembles them.

Everything that varies in a real run is fixed: the snapshot is the hand-built one of the
render tests, the sampler and attribution counters are set, the audit producer writes
the records of that snapshot to an in-memory spool under a fixed clock, the shipper's
statuses are fixed values, and the snapshot age reads a fixed clock. The body is fetched
from a real MetricsServer (identity and gzip) and compared with
tests/exporter/exposition/golden/full_metrics.prom (regenerate with UPDATE_GOLDEN=1 after an
intended change, and review the diff). promtool must accept it.
"""

from __future__ import annotations

import dataclasses
import gzip
import urllib.request
from collections.abc import Iterator, Mapping
from types import SimpleNamespace
from typing import Any, cast

import pytest
from prometheus_client import CollectorRegistry

from exporter.app import SamplerCollector
from exporter.exposition.render import RenderOptions, render_snapshot
from exporter.sampler import SamplerStats
from gpu_audit.audit import AuditConfig, AuditProducer
from gpu_audit.audit.metrics import AuditCollector
from gpu_audit.http import state as serving
from gpu_audit.http.server import MetricsServer
from gpu_audit.http.state import LatestState
from shipper.metrics import Histogram, ShipperCollector, SinkStatus, SpoolStatus
from tests.core.audit.fakes import MemorySpool
from tests.exporter.exposition.goldens import check_golden, promtool_check
from tests.exporter.exposition.snapshots import small_snapshot

NOW = 1_790_000_000.0  # the fixed wall clock of the scrape


class _Resolver:
    def stats(self) -> Mapping[str, int]:
        return {"cache_hits": 40, "cache_misses": 3, "proc_vanished": 1}


def _producer() -> AuditProducer:
    """A producer that wrote exporter_start and the records of two cycles."""
    snap = small_snapshot()
    producer = AuditProducer(AuditConfig(interval_seconds=5.0), MemorySpool(), host="node-1",
                             exporter_version="0.0.0-golden", simulated=False,
                             clock=lambda: snap.timestamp - 1.0)
    producer.start()
    producer.on_snapshot(snap)
    producer.on_snapshot(dataclasses.replace(snap, timestamp=snap.timestamp + 5.0))
    return producer


def _shipper() -> ShipperCollector:
    batches = Histogram()
    for seconds in (0.004, 0.02, 0.3, 7.0):
        batches.observe(seconds)
    statuses = [
        SinkStatus(sink="archive", kind="archive", position=120, committed=100, end=130,
                   delivered=118, dead_lettered=2, dropped={}, retried=3, redelivered=1,
                   lag_seconds=4.5, last_success=NOW - 2.0, blocked_reason=None,
                   conservation_ok=True, batches=batches, state="up"),
        SinkStatus(sink="es", kind="elasticsearch", position=90, committed=90, end=130,
                   delivered=88, dead_lettered=0, dropped={"spool_skipped": 2}, retried=9,
                   redelivered=0, lag_seconds=61.0, last_success=None,
                   blocked_reason="auth", conservation_ok=True, batches=Histogram(),
                   state="blocked"),
    ]
    spool = SpoolStatus(bytes=1_048_576, segments=2, produced=130, full_reason=None,
                        refused={"max_bytes": 4}, evicted=0, corrupt=1)
    return ShipperCollector(lambda: statuses, lambda: spool, lambda: NOW)


def _get(url: str, gzipped: bool) -> bytes:
    req = urllib.request.Request(url, headers={"Accept-Encoding": "gzip"} if gzipped else {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        body = resp.read()
        return gzip.decompress(body) if gzipped else body


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[MetricsServer]:
    """A MetricsServer on an ephemeral port serving the fixed state and live registry."""
    monkeypatch.setattr(serving, "time", SimpleNamespace(time=lambda: NOW))
    snap = small_snapshot()
    rendered = render_snapshot(snap, RenderOptions(), now=NOW - 3.0)
    state = LatestState(stale_after_seconds=15.0)
    state.publish(snap, rendered)
    state.set_backend(True)
    registry = CollectorRegistry(auto_describe=True)
    registry.register(AuditCollector(_producer()))
    registry.register(_shipper())
    sampler = SimpleNamespace(stats=SamplerStats(cycles=12, failed_cycles=1,
                                                 listener_errors=0, cpu_seconds=0.75))
    registry.register(SamplerCollector(cast(Any, sampler), cast(Any, _Resolver())))
    srv = MetricsServer("127.0.0.1", 0, state, registry=registry)
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_full_metrics_body_matches_the_golden(server: MetricsServer) -> None:
    """The first scrape of the fixed state serves exactly the golden body, rendered
    snapshot first, then every live and self-metric family."""
    body = _get(f"http://127.0.0.1:{server.port}/metrics", gzipped=False)
    check_golden("full_metrics.prom", body)


def test_gzip_body_is_the_same_exposition(server: MetricsServer) -> None:
    """The gzip-encoded body (compressed snapshot prefix + per-scrape tail) decodes to
    the same bytes as the identity body of the same scrape number."""
    body = _get(f"http://127.0.0.1:{server.port}/metrics", gzipped=True)
    check_golden("full_metrics.prom", body)


def test_promtool_accepts_the_full_body(server: MetricsServer) -> None:
    """The whole body, live families included, passes `promtool check metrics`."""
    body = _get(f"http://127.0.0.1:{server.port}/metrics", gzipped=False)
    rc, out = promtool_check(body)
    assert rc == 0, out
