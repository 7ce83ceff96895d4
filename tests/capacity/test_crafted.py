"""The crafted trail and launcher history (tests/capacity/crafted.py) reproduce the
report's numbers exactly, through `gpu-audit capacity` itself; its totals equal
`gpu-audit chargeback`'s for the same period."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from gpu_audit_app.cli import main
from tests.capacity.crafted import DAY, END, write_store, write_trail

pytestmark = pytest.mark.timeout(120)

PERIOD = ["--from", DAY.isoformat(), "--to", END.isoformat()]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("capacity")
    config = write_trail(root)
    store = write_store(root / "state.db")
    before = store.read_bytes(), store.stat().st_mtime_ns
    out = root / "out"
    assert main(["capacity", "--config", str(config), *PERIOD, "--launcher-state",
                 str(store), "--out", str(out), "--no-png", "--bin", "hour"]) == 0
    # read from a snapshot, never written (not even a schema check's UPDATE)
    assert (store.read_bytes(), store.stat().st_mtime_ns) == before
    return root, out


def _rows(out: Path) -> dict[tuple[str, str], dict[str, str]]:
    with (out / "capacity.csv").open() as f:
        return {(r["month"], r["gpu_model"]): r for r in csv.DictReader(f)}


def test_figures_are_the_crafted_hours(run: tuple[Path, Path]) -> None:
    _, out = run
    rows = _rows(out)
    assert [k for k in rows if k[0] == "period"] == [
        ("period", "NVIDIA H100 80GB HBM3"), ("period", "all models")]
    r = rows["period", "all models"]
    got = {k: float(v) for k, v in r.items() if k not in ("month", "gpu_model")}
    assert got["hours"] == 3
    assert got["installed_gpu_hours"] == pytest.approx(12, abs=1e-9)
    assert got["down_gpu_hours"] == pytest.approx(1, abs=1e-9)
    assert got["allocated_gpu_hours"] == pytest.approx(8, abs=1e-9)
    assert got["busy_gpu_hours"] == pytest.approx(4.9, abs=1e-9)
    assert got["held_idle_gpu_hours"] == pytest.approx(2, abs=1e-9)
    assert got["free_gpu_hours"] == pytest.approx(3, abs=1e-9)
    assert got["allocated_gpus_mean"] == pytest.approx(8 / 3, abs=1e-4)
    assert got["allocated_gpus_p95"] == pytest.approx(4, abs=1e-9)
    assert got["allocated_gpus_p99"] == pytest.approx(4, abs=1e-9)
    assert got["hours_at_90pct_allocated"] == 1
    assert got["allocated_pct"] == pytest.approx(100 * 8 / 12, abs=1e-4)
    assert got["allocated_pct_p95"] == pytest.approx(100, abs=1e-9)
    doc = json.loads((out / "capacity.json").read_text())
    series = [(round(s[3], 9), round(s[4], 9), round(s[5], 9), round(s[2], 9))
              for s in doc["series"]]
    assert series == [(2, 1.0, 1, 0), (4, 2.4, 1, 0), (2, 1.5, 0, 1)]


def test_waits_are_the_crafted_waits(run: tuple[Path, Path]) -> None:
    _, out = run
    w = json.loads((out / "capacity.json").read_text())["waits"]
    assert w["known"] and w["sources"] == ["launcher"]
    assert (w["jobs"], w["never_started"]) == (3, 1)
    assert w["queued_gpu_hours"] == pytest.approx(4.5, abs=1e-9)
    assert w["p50_wait_h"] == pytest.approx(1.0, abs=1e-9)
    assert w["p95_wait_h"] == pytest.approx(1.5, abs=1e-9)
    assert w["while_idle_gpu_hours"] == pytest.approx(1.5, abs=1e-9)
    assert w["while_idle_share"] == pytest.approx(1 / 3, abs=1e-9)


def test_the_sentence_is_made_of_these_numbers(run: tuple[Path, Path]) -> None:
    _, out = run
    summary = (out / "summary.txt").read_text()
    first = summary.split("\n\n", 1)[0].replace("\n", " ")
    assert first.startswith("Over the 3 hours 2026-11-03 00:00 to 03:00 UTC the 4 NVIDIA "
                            "H100 80GB HBM3 GPUs averaged 67 % allocated (p95 100 %) and 41 % "
                            "busy; 17 % were held idle and 8 % down; 4.5 GPU-hours of jobs "
                            "waited (p95 wait 1.5 h), 33 % of them while GPUs were held idle")
    assert "forecast" in summary and "too few to fit a trend" in summary
    lines = summary.splitlines()
    assert len(lines) <= 40 and max(map(len, lines)) <= 100  # one screen
    html = (out / "capacity.html").read_text()
    assert "67 % allocated" in html and "<svg" in html


def test_totals_equal_chargeback(run: tuple[Path, Path]) -> None:
    root, out = run
    cb = root / "cb"
    assert main(["chargeback", "bill", "--source", "archive", "--config",
                 str(root / "gpu-audit.yaml"), *PERIOD, "--out", str(cb)]) == 0
    recon = json.loads((cb / "chargeback.json").read_text())["reconciliation"]
    r = _rows(out)["period", "all models"]
    up = float(r["installed_gpu_hours"]) - float(r["down_gpu_hours"])
    assert up == pytest.approx(recon["fleet_gpu_hours"], abs=1e-9)
    assert float(r["down_gpu_hours"]) == pytest.approx(recon["down_gpu_hours"], abs=1e-9)
    # free = up - held: chargeback's idle row
    assert float(r["free_gpu_hours"]) == pytest.approx(recon["idle_gpu_hours"], abs=1e-9)


def test_day_bins_from_one_read_give_the_same_totals(run: tuple[Path, Path]) -> None:
    """--bin day reads the archive once (per-day, per-model sums): the period's totals are
    the hourly run's; only the per-bin figures are coarser (one 3-hour bin here)."""
    root, out = run
    day = root / "day"
    assert main(["capacity", "--config", str(root / "gpu-audit.yaml"), *PERIOD, "--out",
                 str(day), "--no-png", "--bin", "day"]) == 0
    hourly, daily = _rows(out)["period", "all models"], _rows(day)["period", "all models"]
    for col in ("hours", "installed_gpu_hours", "down_gpu_hours", "allocated_gpu_hours",
                "busy_gpu_hours", "held_idle_gpu_hours", "free_gpu_hours"):
        assert float(daily[col]) == pytest.approx(float(hourly[col]), abs=1e-9), col
    assert float(daily["allocated_gpus_p95"]) == pytest.approx(8 / 3, abs=1e-4)
    assert len(json.loads((day / "capacity.json").read_text())["series"]) == 1
