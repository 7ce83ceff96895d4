"""The report on the simulator's archive (`gpu-audit chargeback simulate`): it runs,
its totals are the bill's, and the sentence says the data is simulated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_audit_app.cli import main

pytestmark = pytest.mark.timeout(180)
PERIOD = ["--from", "2026-11-03T00:00:00Z", "--to", "2026-11-04T00:00:00Z"]


def test_the_simulator_archive(tmp_path: Path) -> None:
    cb = tmp_path / "cb"
    assert main(["chargeback", "simulate", "idle", *PERIOD, "--out", str(cb)]) == 0
    config = cb / "gpu-audit-sim.yaml"
    out = tmp_path / "cap"
    assert main(["capacity", "--config", str(config), "--include-simulated", *PERIOD,
                 "--out", str(out), "--no-png"]) == 0
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["sentence"].startswith("SIMULATED DATA, not real hardware: Over the 1 day(s)")
    recon = json.loads((cb / "chargeback.json").read_text())["reconciliation"]
    site = next(r for r in doc["rows"] if r["month"] == "period" and r["model"] == "all models")
    assert site["installed_gpu_hours"] - site["down_gpu_hours"] == pytest.approx(
        recon["fleet_gpu_hours"], abs=1e-9)
    assert site["free_gpu_hours"] == pytest.approx(recon["idle_gpu_hours"], abs=1e-9)
    assert site["held_idle_gpu_hours"] > 0  # the idle scenario holds a GPU idle
    # without --include-simulated there is nothing real to report
    assert main(["capacity", "--config", str(config), *PERIOD, "--out",
                 str(tmp_path / "none"), "--no-png"]) == 1
