"""What a preemption costs a checkpointed job on a real Slurm cluster.

Starts the test cluster (tests/slurm/cluster.py: slurmctld, two slurmd, munge; no
accounting) and, per repetition, a NumPy training job (examples/train_numpy.py, 20 ms
steps, a periodic checkpoint every 50 steps) submitted through
deploy/slurm/sbatch-checkpoint.sh and run under requeue-on-preempt.sh in the low
partition; once it reaches a random step a high-tier job needing its node's GPUs
preempts it. Measured from the job's own events (gpu_audit_ckpt's events file), per
preemption:

  signal->commit   the preemption signal to the checkpoint being durable
  commit->exit     the checkpoint to the trainer's exit (75)
  exit->resumed    the exit to the requeued run having restored the checkpoint (Slurm's
                   requeue delay, cred_expire = 10 s here, 120 s by default, plus the
                   preemptor's run and the new run's start-up)
  steps redone     steps after the checkpoint resumed from, done again
  periodic-only    the steps the same preemption would have cost a job with periodic
                   checkpoints only (killed at the signal, resumed from its newest
                   periodic checkpoint): derived from the same run's events

    .venv/bin/python bench/bench_slurm_preempt.py [--reps 5] [--json PATH]

Needs root and the Slurm and munge packages (scripts/setup --test).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.slurm.cluster import SlurmCluster
from tests.slurm.jobenv import make_jobenv
from tests.slurm.training import lost_work, submit_training, wait_step

STEPS = 400
EVERY = 50


def one(cluster: SlurmCluster, jobenv: Any, rep: int, rng: random.Random) -> dict[str, Any]:
    a, b = cluster.users
    job = submit_training(cluster, jobenv, f"bench-{rep}", script="train_numpy.py",
                          steps=STEPS, step_sleep=0.02, user=a, every_steps=EVERY,
                          options=["-p", "low", "--gres=gpu:2"])
    target = rng.randrange(60, 300)
    wait_step(job, target)
    node = cluster.job(job.job_id)["NodeList"]
    hold = jobenv.script(cluster, f"bench-high-{rep}.sh", f"""\
        srun {jobenv.python} {jobenv.code}/usegpu.py --sleep 2
        """)
    cluster.sbatch(hold, "-p", "high", "-w", node, "--gres=gpu:2", f"--account={b.account}",
                   "-o", "/dev/null", user=jobenv.user(b), env=jobenv.env)
    done = cluster.wait_job(job.job_id, ["COMPLETED", "FAILED", "CANCELLED"], 300)
    if done["JobState"] != "COMPLETED":
        raise SystemExit(f"job {job.job_id} ended {done['JobState']}:\n{job.output()}")
    (cost,) = lost_work(job)
    periodic = [int(e["step"]) for e in job.events()
                if e["event"] == "checkpoint_committed" and e.get("reason") == "periodic"
                and int(e["step"]) <= cost.committed_step]
    return {"target_step": target, "committed_step": cost.committed_step,
            "signal_to_commit_s": cost.signal_to_commit_s,
            "commit_to_exit_s": cost.commit_to_exit_s,
            "exit_to_resumed_s": cost.exit_to_resume_s, "steps_redone": cost.steps_redone,
            "periodic_only_steps_redone": cost.committed_step - max(periodic, default=0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seed", type=int, default=20261202)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="gpu-audit-slurm-bench-", dir="/tmp"))
    cluster = SlurmCluster(root, accounting=False)
    started = time.monotonic()
    cluster.start()
    try:
        jobenv = make_jobenv(cluster)
        rows = [one(cluster, jobenv, rep, rng) for rep in range(args.reps)]
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    step_s = 0.02
    keys = ("signal_to_commit_s", "commit_to_exit_s", "exit_to_resumed_s", "steps_redone",
            "periodic_only_steps_redone")
    print(f"{args.reps} preemptions of a {STEPS}-step NumPy job (20 ms steps, periodic "
          f"checkpoint every {EVERY}) on Slurm 22.05, cred_expire 10 s "
          f"({time.monotonic() - started:.0f} s in all)")
    print(f"{'':28s}{'median':>10s}{'max':>10s}")
    summary: dict[str, dict[str, float]] = {}
    for k in keys:
        values = [float(r[k]) for r in rows]
        summary[k] = {"median": statistics.median(values), "max": max(values)}
        print(f"{k:28s}{summary[k]['median']:10.3f}{summary[k]['max']:10.3f}")
    lost_now = summary["steps_redone"]["median"] * step_s
    lost_periodic = summary["periodic_only_steps_redone"]["median"] * step_s
    print(f"work redone per preemption: {lost_now:.2f} s checkpoint-first vs "
          f"{lost_periodic:.2f} s with periodic checkpoints only (median)")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "summary": summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
