"""Billing by Slurm account and partition, reconciled with Slurm's own accounting.

Five GPU jobs of two users and accounts in both partitions run on the cluster: on n1 a
low job is preempted by a high one and runs again (two runs of one job), on n2 three
jobs share two GPUs (one waits). Then `gpu-audit chargeback bill --group-by slurm
--compare-with slurm` bills the period from the nodes' audit trails (exporter archives
and spools, the epilog's `slurm` stream) and reads real `sacct` for the same period:
every row's allocated GPU-hours agree with sacct's GPU TRES-hours within 0.5 %, every
run is on both sides, and the measured use is there beside it.
"""

from __future__ import annotations

import csv
import json
import math
import subprocess
import sys
import time
from datetime import UTC, datetime

from gpu_audit.audit.config import AuditConfig
from tests.polling import wait_for
from tests.slurm.cluster import NODES, REPO, SlurmCluster, User
from tests.slurm.conftest import SAMPLE_INTERVAL_S, TRAIL_INTERVAL_S, JobEnv, NodeExporter
from tests.slurm.training import submit_training, wait_step

TOLERANCE = 0.005  # the bar: within 0.5 %


def _stamp(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_bill_by_account_and_partition_agrees_with_sacct(
    slurm: SlurmCluster, jobenv: JobEnv, nodes: dict[str, NodeExporter]
) -> None:
    """Rows (account, partition, user) from the trail; sacct's GPU-hours for the same
    runs beside them; |difference| <= 0.5 % on every row and in total for the runs sacct
    accounted; nothing missing from the trail; the one run Slurm may leave without a
    start (the preempted one) named with the reason."""
    a, b = slurm.users
    wait_for(lambda: not slurm.run(["squeue", "-h"]).stdout.strip(), 120,
             "an empty queue (earlier tests' jobs gone)")
    # a job step (srun): preemption signals the job's steps, so the preempted one ends
    # within GraceTime and is requeued (a batch script doing the work itself is not
    # signalled, and ends TIMEOUT at the grace time's end: docs/SLURM.md)
    hold = jobenv.script(slurm, "bill-hold.sh", f"""\
        srun {jobenv.python} {jobenv.code}/usegpu.py --sleep "$HOLD_SECONDS"
        """)
    # the interval record holding earlier tests' last seconds is dated at the interval's
    # end (or the cycle that crosses it): the window starts after it, or it would bill
    # their seconds here (a run found in the trail and not in sacct for this window)
    time.sleep(TRAIL_INTERVAL_S + 2.0)
    t0 = math.floor(time.time())
    time.sleep(1.0)
    def submit(user: User, acct: str, part: str, *, node: str, gpus: int, secs: int,
               util: str) -> str:
        return slurm.sbatch(hold, "-p", part, "-w", node, f"--gres=gpu:{gpus}",
                            f"--account={acct}", "-o", "/dev/null", user=jobenv.user(user),
                            env={**jobenv.env, "HOLD_SECONDS": str(secs),
                                 "GPU_AUDIT_SIM_UTIL": util})

    # a checkpointed training job (sbatch-checkpoint.sh, requeue-on-preempt.sh), preempted
    # by a high job on n1: it checkpoints, is requeued and runs again (two runs)
    training = submit_training(slurm, jobenv, "bill-train", script="train_numpy.py",
                               steps=400, step_sleep=0.02, user=b,
                               options=["-p", "low", "-w", "n1", "--gres=gpu:2"])
    preempted = training.job_id
    jobs = [preempted,
            submit(a, "physics", "high", node="n2", gpus=1, secs=15, util="0.2"),
            submit(a, "physics", "low", node="n2", gpus=1, secs=20, util="0.9"),
            submit(b, "vision", "low", node="n2", gpus=1, secs=10, util="0")]
    wait_step(training, 50)
    # preempts the first
    jobs.append(submit(a, "physics", "high", node="n1", gpus=2, secs=8, util="0.5"))
    for job in jobs:
        slurm.wait_job(job, ["COMPLETED"], 240)
    assert int(slurm.job(preempted)["Restarts"]) == 1
    def recorded() -> bool:
        names = {p.name for n in NODES
                 for p in (slurm.root / "nodes" / n / "slurm" / "reports").glob("*.json")}
        return all(f"{j}.0.json" in names for j in jobs) and f"{preempted}.1.json" in names

    wait_for(recorded, 60, "every run's epilog record")
    time.sleep(2.0)  # the exporters' last cycles of those jobs
    t1 = math.ceil(time.time())

    trails = []
    for n in NODES:
        base = slurm.root / "nodes" / n
        trails += ["--trail", str(base / "archive"), "--trail", str(base / "spool"),
                   "--trail", str(base / "slurm" / "spool")]
    out = slurm.root / "bill"
    done = subprocess.run(
        [sys.executable, "-m", "gpu_audit_app", "chargeback", "bill", "--group-by", "slurm",
         "--compare-with", "slurm", "--from", _stamp(t0), "--to", _stamp(t1),
         "--rates", str(REPO / "chargeback" / "examples" / "rates.yaml"),
         "--include-simulated", "--out", str(out), *trails],
        env=slurm.env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    doc = json.loads((out / "slurm-chargeback.json").read_text())
    assert doc["verification_problems"] == [], doc["verification_problems"]
    assert doc["missing_from_trail"] == [], doc
    # Slurm 22.05 clears the start of the run it requeued for the preemption in slurmdbd
    # a moment after the requeue (most runs here; not always): sacct then bills that run
    # 0 GPU-seconds and lists it in no period. The bill names it and says why; every run
    # sacct did account agrees with the trail.
    first = json.loads(next(p for n in NODES for p in (
        slurm.root / "nodes" / n / "slurm" / "reports").glob(f"{preempted}.0.json")
    ).read_text())
    cleared = bool(doc["not_in_sacct"])
    if cleared:
        assert doc["not_in_sacct"] == [
            f"job {preempted} (run from {_stamp(first['start_time'])}; sacct has a run of "
            "it without a start time)"], doc["not_in_sacct"]
        assert doc["inputs"]["sacct"]["runs_without_start"] == 1
        assert any("no start time" in n for n in doc["notes"]), doc["notes"]
    assert doc["inputs"]["sacct"]["command"][0] == "sacct"
    owner = {a.name: "root" if jobenv.as_root else a.name,
             b.name: "root" if jobenv.as_root else b.name}
    want = {("physics", "high", owner[a.name]), ("physics", "low", owner[a.name]),
            ("vision", "low", owner[b.name])}
    rows = {(r["account"], r["partition"], r["user"]): r for r in doc["rows"]}
    assert set(rows) == want, rows
    runs = {("vision", "low", owner[b.name]): 3, ("physics", "high", owner[a.name]): 2,
            ("physics", "low", owner[a.name]): 1}
    # GPUs x runs: the training's two runs on 2 GPUs and a 1-GPU job; a 1-GPU and a
    # 2-GPU job; one 1-GPU job
    gpu_runs = {("vision", "low", owner[b.name]): 5, ("physics", "high", owner[a.name]): 3,
                ("physics", "low", owner[a.name]): 1}
    # Use is sampled: the sample that first sees a process credits it the interval before
    # (up to max_elapsed_intervals sampling intervals after a pause, as on a loaded
    # machine), and Slurm's run times are whole seconds; so use may pass the allocation
    # by that much on each GPU of each run (a full run once read 30.0 used in 26 allocated).
    first_sight = AuditConfig().max_elapsed_intervals * SAMPLE_INTERVAL_S + 1.0
    # what sacct lacks: the preempted run, when Slurm cleared its start
    lost = {("vision", "low", owner[b.name]): (1, first["allocated_gpu_seconds"])
            } if cleared else {}
    for key, r in rows.items():
        lost_runs, lost_seconds = lost.get(key, (0, 0.0))
        assert r["runs"] == r["sacct_runs"] + lost_runs == runs[key], (key, r)
        assert r["sacct_gpu_seconds"] > 0
        slurm_side = r["sacct_gpu_seconds"] + lost_seconds
        assert abs(r["allocated_gpu_seconds"] - slurm_side) <= TOLERANCE * slurm_side, (key, r)
        if not lost_runs:
            assert abs(r["difference_ratio"]) <= TOLERANCE, (key, r)
        assert 0 < r["used_gpu_seconds"] <= (r["allocated_gpu_seconds"]
                                             + gpu_runs[key] * first_sight), (key, r)
        assert r["energy_joules"] > 0
        # the A100-SXM4-80GB price of the rates file (JSON numbers have 6 decimals)
        assert math.isclose(r["gpu_cost"], r["allocated_gpu_seconds"] / 3600 * 1.50,
                            abs_tol=1e-6)
    total = doc["total"]
    assert total["runs"] == len(jobs) + 1  # + the preempted run
    assert total["sacct_runs"] == total["runs"] - len(lost)
    slurm_total = total["sacct_gpu_seconds"] + sum(v[1] for v in lost.values())
    assert abs(total["allocated_gpu_seconds"] - slurm_total) <= TOLERANCE * slurm_total
    busy = rows[("physics", "low", owner[a.name])]
    # 0.9 busy to the usage records' millisecond resolution (a few records: 18.004 busy
    # of 20.004 used is 0.8999800)
    assert math.isclose(busy["busy_gpu_seconds"], 0.9 * busy["used_gpu_seconds"],
                        abs_tol=0.005), busy
    # the preempted run's times are Slurm's too (from slurmdbd: its job record already
    # describes the next run when the epilog runs)
    sources = {json.loads(p.read_text())["time_source"]
               for n in NODES for p in (slurm.root / "nodes" / n / "slurm" / "reports").glob(
                   f"{preempted}.*.json")}
    assert sources == {"slurm"}

    with (out / "slurm-chargeback.csv").open(newline="") as fh:
        lines = list(csv.DictReader(fh))
    assert [x["account"] for x in lines][-1] == "total" and len(lines) == len(want) + 1
    assert all(x["sacct_gpu_hours"] and x["difference_percent"] for x in lines)
    print(f"slurm bill: {total['allocated_gpu_seconds']:.0f} GPU-s allocated vs "
          f"{total['sacct_gpu_seconds']:.0f} in sacct ({100 * total['difference_ratio']:+.3f} %"
          f"{'; the preempted run has no start in sacct' if cleared else ''})")

