"""`gpu-audit capacity --source slurm` against the real cluster: sacct's allocation of a
real GPU job, the GPUs `scontrol show node` lists as installed, a drained node named, and
busy / held idle / down written as not known (never 0)."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.polling import wait_for
from tests.slurm.cluster import GPUS_PER_NODE, NODES, SlurmCluster


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _sacct_elapsed(slurm: SlurmCluster, job: str) -> float:
    out = slurm.run(["sacct", "-n", "-P", "-X", "-j", job, "-o", "ElapsedRaw"]).stdout
    return float(out.split()[0])


def test_capacity_from_slurm(slurm: SlurmCluster) -> None:
    wait_for(lambda: not slurm.run(["squeue", "-h"]).stdout.strip(), 120,
             "an empty queue (earlier tests' jobs gone)")
    t0 = float(int(time.time()))
    time.sleep(1.0)
    script = slurm.root / "capacity-sleep.sh"
    script.write_text("#!/bin/sh\nsleep 3\n")
    script.chmod(0o755)
    job = slurm.sbatch(script, "-w", NODES[0], "--gres=gpu:2", "-o", "/dev/null")
    slurm.wait_job(job, ["COMPLETED"], 120)
    wait_for(lambda: _sacct_elapsed(slurm, job) > 0
             and "Unknown" not in slurm.run(["sacct", "-n", "-P", "-X", "-j", job, "-o",
                                             "End"]).stdout, 60, "the job's end in sacct")
    elapsed = _sacct_elapsed(slurm, job)
    drained = NODES[-1]
    slurm.run(["scontrol", "update", f"nodename={drained}", "state=drain",
               "reason=capacity-test"])
    try:
        if os.environ.get("GPU_AUDIT_RECORD_SLURM"):  # refresh tests/capacity/slurm/
            Path(os.environ["GPU_AUDIT_RECORD_SLURM"]).write_text(
                slurm.run(["scontrol", "show", "node", "-o"]).stdout)
        t1 = time.time() + 2.0
        out = slurm.root / "capacity"
        done = subprocess.run(
            [sys.executable, "-m", "gpu_audit_app", "capacity", "--source", "slurm",
             "--from", _stamp(t0), "--to", _stamp(t1 + 60), "--bin", "hour", "--out",
             str(out), "--no-png"],
            env=slurm.env, capture_output=True, text=True, timeout=120, check=False)
    finally:
        slurm.run(["scontrol", "update", f"nodename={drained}", "state=resume"])
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((out / "capacity.json").read_text())
    site = next(r for r in doc["rows"] if r["month"] == "period" and r["model"] == "all models")
    # 2 GPUs for the job's whole run, as sacct counts it (ElapsedRaw, whole seconds)
    assert site["allocated_gpu_hours"] * 3600 == pytest.approx(2 * elapsed, abs=1e-6)
    assert site["installed_gpus"] == pytest.approx(len(NODES) * GPUS_PER_NODE, rel=1e-6)
    with (out / "capacity.csv").open() as f:
        row = next(r for r in csv.DictReader(f)
                   if r["month"] == "period" and r["gpu_model"] == "all models")
    assert row["busy_gpu_hours"] == row["held_idle_gpu_hours"] == row["down_gpu_hours"] == ""
    assert doc["not_known"] == ["busy", "held_idle", "down"]
    assert "busy, held-idle, down time not known from slurm" in doc["sentence"]
    assert any(n.startswith("Slurm now: ") and drained in n and "DRAIN" in n
               for n in doc["notes"]), doc["notes"]
