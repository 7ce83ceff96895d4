"""The optional idle-GPU policy against the real cluster: a job holding both GPUs of n2 at
0 % while another GPU job waits for n2 is found from Prometheus; the dry run changes
nothing, `--apply --action flag` sets the job's Comment through scontrol, `--apply
--action requeue` requeues it so the waiting job runs. A busy job is left alone."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.polling import wait_for
from tests.promstack import Prometheus
from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import JobEnv, NodeExporter

WINDOW = 20


def idle_policy(slurm: SlurmCluster, prom: Prometheus,
                *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpu_audit_app", "slurm", "idle", "--prometheus-url", prom.url,
         "--window", str(WINDOW), "--min-runtime", "10", "--include-simulated", *args],
        env=slurm.env, capture_output=True, text=True, timeout=120, check=False)


def test_idle_holder_is_found_flagged_and_requeued_while_a_gpu_job_waits(
    slurm: SlurmCluster, jobenv: JobEnv, nodes: dict[str, NodeExporter], prom: Prometheus
) -> None:
    """Dry run by default; flag and requeue only with --apply; the busy job, and the
    idle one before anybody waits, are left with the reason said."""
    a, b = slurm.users
    hold = jobenv.script(slurm, "idle-hold.sh", f"""\
        exec {jobenv.python} {jobenv.code}/usegpu.py --sleep 120
        """)
    idle = slurm.sbatch(hold, "-p", "low", "-w", "n2", "--gres=gpu:2", "--account=vision",
                        "-o", "/dev/null", user=jobenv.user(b),
                        env={**jobenv.env, "GPU_AUDIT_SIM_UTIL": "0"})
    busy = slurm.sbatch(hold, "-p", "low", "-w", "n1", "--gres=gpu:1", "--account=physics",
                        "-o", "/dev/null", user=jobenv.user(a),
                        env={**jobenv.env, "GPU_AUDIT_SIM_UTIL": "0.8"})
    waiting = ""
    try:
        for job in (idle, busy):
            slurm.wait_job(job, ["RUNNING"], 60)

        def judged() -> bool:
            out = idle_policy(slurm, prom, "--json").stdout
            return any(json.loads(line)["job"] == idle and "not judged" not in
                       json.loads(line)["why"] for line in out.splitlines())

        wait_for(judged, 90, "a full window of the jobs in Prometheus", step=2)
        alone = {d["job"]: d for d in map(json.loads, idle_policy(
            slurm, prom, "--json", "--action", "requeue").stdout.splitlines())}
        assert alone[idle]["action"] is None and "no GPU job is waiting" in alone[idle]["why"]

        waiting = slurm.sbatch(hold, "-p", "low", "-w", "n2", "--gres=gpu:1",
                               "--account=physics", "-o", "/dev/null", user=jobenv.user(a),
                               env=jobenv.env)
        wait_for(lambda: slurm.job(waiting).get("Reason") == "Resources", 30,
                 "the new job waiting for n2's GPUs")
        dry = idle_policy(slurm, prom, "--action", "requeue")
        assert dry.returncode == 0, dry.stderr
        assert f"job {idle} (" in dry.stdout and "would requeue: GPUs 0.0% busy" in dry.stdout
        assert "while 1 GPU job(s) wait" in dry.stdout
        assert f"job {busy} (" in dry.stdout and "leave: GPUs 80.0% busy" in dry.stdout
        assert "dry run: nothing changed" in dry.stderr
        assert slurm.job(idle)["JobState"] == "RUNNING"
        assert slurm.job(waiting)["JobState"] == "PENDING"

        flag = idle_policy(slurm, prom, "--action", "flag", "--apply")
        assert flag.returncode == 0, flag.stdout + flag.stderr
        assert slurm.job(idle)["Comment"].startswith("gpu-audit idle-policy: GPUs 0.0% busy")
        assert slurm.job(busy).get("Comment", "(null)") == "(null)"
        assert slurm.job(idle)["JobState"] == "RUNNING"

        requeue = idle_policy(slurm, prom, "--action", "requeue", "--apply")
        assert requeue.returncode == 0, requeue.stdout + requeue.stderr
        assert f"job {idle} (" in requeue.stdout and ": requeue: GPUs" in requeue.stdout
        slurm.wait_job(waiting, ["RUNNING"], 60, "the waiting job to get n2's GPU")
        record = slurm.job(idle)
        assert record["JobState"] in ("PENDING", "REQUEUED") and int(record["Restarts"]) == 1
        assert slurm.job(busy)["JobState"] == "RUNNING"
    finally:
        slurm.run(["scancel", idle, busy, *([waiting] if waiting else [])], check=False)
        for job in (idle, busy, *([waiting] if waiting else [])):
            slurm.wait_job(job, ["CANCELLED", "COMPLETED"], 60)
