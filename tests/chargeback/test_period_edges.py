"""A period takes what its records account for, (time_ns - dt, time_ns], not the records
stamped in it: a tenant that changes exactly at the period's edge is billed to the right
period, from the archive and from Prometheus alike (the same rows, the same hours).

The node samples every 10 s, its audit records close every minute; alice holds the GPU
up to B, bob after it. The periods end (or start) at B and reach 90 s to the other
side, so their far edge falls in the middle of a one-minute record: that record is
split by time. Before, the archive billed the records stamped in [from, to): 120 s for
90 s, and a straddling record wholly in the period it ends in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chargeback.compute import build_bill
from chargeback.directory import load_directory
from chargeback.model import Bill, Request
from chargeback.rates import load_rates
from chargeback.sources.archive import read_archive
from chargeback.sources.prometheus import read_prometheus
from gpu_audit.model.snapshot import Snapshot
from tests.chargeback.archives import produce, write_archive
from tests.chargeback.promfill import backfilled_prometheus
from tests.chargeback.test_cross_source import EXAMPLES, OpenMetrics, Run
from tests.core.audit.factory import ALICE, BOB, gpu, proc, snapshot

pytestmark = pytest.mark.timeout(300)

B = datetime(2026, 11, 3, 12, 0, tzinfo=UTC)
STEP = 10
SPAN = 600  # seconds on either side of B


def _snaps() -> list[Snapshot]:
    b = B.timestamp()
    out = []
    for k in range(2 * SPAN // STEP + 1):
        t = b - SPAN + STEP * k
        pid = 101 if t <= b else 102
        out.append(snapshot(t, [gpu(0, util=0.5, energy=1000.0 * k, power=100.0,
                                    processes=[proc(pid, sm=0.5)])],
                            {101: ALICE, 102: BOB}, interval=STEP, simulated=True))
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    tmp = tmp_path_factory.mktemp("edges")
    snaps = _snaps()
    b = B.timestamp()
    archive = tmp / "archive"
    write_archive(archive, produce(snaps, host="edge-node", simulated=True,
                                   start_s=b - SPAN - 1, stop_s=b + SPAN + 1, interval_s=60.0))
    om = OpenMetrics()
    for s in snaps:
        om(s)
    run = Run(B - timedelta(seconds=SPAN), B + timedelta(seconds=SPAN), STEP)
    with backfilled_prometheus(tmp, run,  # type: ignore[arg-type]
                               records={"gpu:gpu_up:max", "gpu:gpu_held:bool"},
                               writer=om.write) as prom:
        yield archive, prom.url


def _req(start: datetime, end: datetime) -> Request:
    return Request(start=start, end=end, source="archive", config=None, prometheus_url=None,
                   rates=None, directory=None, idle_policy="none", out="out",
                   include_simulated=True)


def _bills(archive: Path, url: str, start: datetime, end: datetime) -> tuple[Bill, Bill]:
    req = _req(start, end)
    rates = load_rates(EXAMPLES / "rates.yaml")
    directory = load_directory(EXAMPLES / "directory.yaml")
    a = build_bill(read_archive(req, archive), rates, directory, "none")
    p = build_bill(read_prometheus(dataclasses.replace(
        req, source="prometheus", prometheus_url=url)), rates, directory, "none")
    return a, p


@pytest.mark.parametrize(("before", "after", "owner"), [
    (90, 0, "alice"), (0, 90, "bob"), (120, 0, "alice"), (0, 120, "bob")])
def test_an_owner_change_at_the_edge_bills_the_same_rows_from_both_sources(
        sources: tuple[Path, str], before: int, after: int, owner: str) -> None:
    archive, url = sources
    start, end = B - timedelta(seconds=before), B + timedelta(seconds=after)
    a, p = _bills(archive, url, start, end)
    rows_a = {(r.kind, r.user): r for r in a.rows if r.kind == "owner"}
    rows_p = {(r.kind, r.user): r for r in p.rows if r.kind == "owner"}
    assert rows_a.keys() == rows_p.keys() == {("owner", owner)}
    hours = (before + after) / 3600
    for rows in (rows_a, rows_p):
        r = rows["owner", owner]
        assert r.used_gpu_hours == pytest.approx(hours, rel=1e-6), (rows is rows_a, r)
        assert r.charged_gpu_hours == pytest.approx(hours, rel=1e-6)


def test_a_sealed_part_reaching_over_the_edge_is_read_and_split(tmp_path: Path) -> None:
    """Keyed, the bill takes authentic seals unread; a part whose first record's interval
    begins before the period (the seal's first_start_ns) is read and split instead."""
    keyfile = tmp_path / "k"
    keyfile.write_bytes(b"k\n")
    b = B.timestamp()
    archive = tmp_path / "a"
    write_archive(archive, produce(_snaps(), host="edge-node", simulated=True,
                                   start_s=b - SPAN - 1, stop_s=b + SPAN + 1,
                                   interval_s=60.0, key_file=keyfile),
                  max_file_bytes=4096, seal_key=b"k")
    for before, after, owner in ((90, 0, ("alice", "vision")), (0, 90, ("bob", "nlp")),
                                 (330, 0, ("alice", "vision"))):
        d = read_archive(_req(B - timedelta(seconds=before), B + timedelta(seconds=after)),
                         archive, key=b"k")
        used = {o: u.used_gpu_seconds for (o, _m), u in d.usage.items()}
        assert used == pytest.approx({owner: float(before + after)}), (before, after)
    full = read_archive(_req(B - timedelta(seconds=SPAN), B + timedelta(seconds=SPAN)),
                        archive, key=b"k")
    assert any("(sealed: its rollup)" in q for q in full.queries)
