"""The 60 s audit trail bills what the per-cycle trail bills: one simulated
node, played twice in virtual time through the real producer and archive sink, once
writing a record set per 5 s sample (schema 2) and once adding the samples up per
minute (schema 3); the two bills agree within 0.01 % on every row and column."""

from __future__ import annotations

import datetime as dt
from dataclasses import fields
from pathlib import Path

import pytest

from chargeback.compute import build_bill
from chargeback.model import Bill, Request
from chargeback.run import load_tables
from chargeback.sources.archive import read_archive
from gpu_audit.archive import PartLines, list_parts
from gpu_audit_app.chargeback.sim import simulate_archive

pytestmark = pytest.mark.timeout(600)

EXAMPLES = Path(__file__).resolve().parents[2] / "chargeback" / "examples"
START = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
END = START + dt.timedelta(hours=2)


def _bill(tmp: Path, interval: float) -> tuple[Bill, int]:
    archive = tmp / f"archive-{interval:g}"
    simulate_archive("busy", START, END, archive, tmp / f"cfg-{interval:g}.yaml", step=5.0,
                     audit_interval=interval)
    req = Request(start=START, end=END, source="archive", config=None,
                  prometheus_url=None, rates=str(EXAMPLES / "rates.yaml"),
                  directory=str(EXAMPLES / "directory.yaml"), idle_policy="proportional",
                  out=str(tmp / "out"), include_simulated=True)
    rates, directory = load_tables(str(EXAMPLES / "rates.yaml"),
                                   str(EXAMPLES / "directory.yaml"))
    data = read_archive(req, archive)
    assert data.verified is True and data.completeness is not None
    assert data.completeness.gaps == []
    size = 0
    for p in list_parts(archive):
        reader = PartLines(p.path)
        size += sum(len(line) + 1 for _, lines in reader.chunks() for line in lines)
    return build_bill(data, rates, directory, "proportional"), size


def test_the_minute_trail_bills_the_per_cycle_trail_within_a_hundredth_of_a_percent(
        tmp_path: Path) -> None:
    per_cycle, big = _bill(tmp_path, 5.0)
    per_minute, small = _bill(tmp_path, 60.0)
    numbers = [f.name for f in fields(per_cycle.rows[0])
               if f.name not in ("kind", "department", "project", "user")]
    a = {(r.kind, r.department, r.project, r.user): r for r in per_cycle.rows}
    b = {(r.kind, r.department, r.project, r.user): r for r in per_minute.rows}
    assert a.keys() == b.keys() and len(a) > 3
    for key, row in a.items():
        for name in numbers:
            x, y = getattr(row, name), getattr(b[key], name)
            assert y == pytest.approx(x, rel=1e-4, abs=1e-9), (key, name, x, y)
    assert per_minute.reconciliation.fleet_gpu_hours == pytest.approx(
        per_cycle.reconciliation.fleet_gpu_hours, rel=1e-4)
    # and the trail it bills from is a small fraction of the per-cycle one
    assert small * 5 < big
