"""The report from Prometheus (the chargeback test month backfilled into a real
Prometheus with the recording rules): day bins, each read as a bill of that day would
be; its totals are the month's bill's."""

from __future__ import annotations

import csv
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpu_audit_app.cli import main
from tests.chargeback.month import scenario
from tests.chargeback.promfill import Backfilled, backfilled_prometheus

pytestmark = [pytest.mark.timeout(600),
              pytest.mark.skipif(shutil.which("prometheus") is None or
                                 shutil.which("promtool") is None,
                                 reason="prometheus and promtool not installed")]


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backfilled]:
    with backfilled_prometheus(tmp_path_factory.mktemp("month"), scenario(step=300)) as p:
        yield p


def test_prometheus_month_totals_are_the_bills(prom: Backfilled, tmp_path: Path) -> None:
    m = scenario()
    period = ["--from", m.start.isoformat(), "--to", m.end.isoformat()]
    assert main(["capacity", "--source", "prometheus", "--prometheus-url", prom.url,
                 *period, "--out", str(tmp_path / "cap"), "--no-png"]) == 0
    assert main(["chargeback", "bill", "--source", "prometheus", "--prometheus-url", prom.url,
                 *period, "--out", str(tmp_path / "cb")]) == 0
    doc = json.loads((tmp_path / "cap" / "capacity.json").read_text())
    recon = json.loads((tmp_path / "cb" / "chargeback.json").read_text())["reconciliation"]
    rows = {r["model"]: r for r in doc["rows"] if r["month"] == "period"}
    site = rows["all models"]
    # 4 real GPUs x 720 h but the month's first 5-minute step (the first sample stands
    # for the step before it), one A100 down 24 h (tests/chargeback/month.py)
    assert site["installed_gpu_hours"] == pytest.approx(4 * (720 - 5 / 60), abs=1e-6)
    assert site["down_gpu_hours"] == pytest.approx(24, abs=1e-6)
    assert site["installed_gpu_hours"] - site["down_gpu_hours"] == pytest.approx(
        recon["fleet_gpu_hours"], abs=1e-6)
    assert rows["NVIDIA H100 80GB HBM3"]["allocated_gpu_hours"] == pytest.approx(
        720 - 5 / 60, abs=1e-6)
    # Prometheus knows allocation: allocated is the bill's allocated GPU-hours, not the
    # time held, but capped at each model's up time per bin: on 2026-11-10 the three
    # A100s are allocated 72 GPU-h while one of them is down (48 h up, 24 h down), and a
    # down GPU's allocation is down time, not capacity in use
    with (tmp_path / "cb" / "chargeback.csv").open() as f:
        billed = sum(float(r["allocated_gpu_hours"] or 0) for r in csv.DictReader(f)
                     if r["kind"] != "idle")
    assert site["allocated_gpu_hours"] == pytest.approx(billed - (72 - (48 + 5 / 60)),
                                                        abs=1e-6)
    assert doc["basis"].startswith("allocated: GPU time allocated to jobs")
    assert len(doc["series"]) == 30  # day bins, each read on its own
