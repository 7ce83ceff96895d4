"""The per-job GPU report at job end, through the real epilog: the run's allocation from
slurmctld and the prolog's job-mapping file, its usage from the node's audit trail, kept
as a `job_finished` record (stream `slurm`), a report file and Slurm's AdminComment, and
printed by `gpu-audit slurm jobreport JOBID` from each of those."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from gpu_audit import slurmcmd
from gpu_audit.audit.verify import verify_spool_dir
from tests.polling import wait_for
from tests.slurm.cluster import SlurmCluster, gpu_uuid
from tests.slurm.conftest import JobEnv, NodeExporter


def jobreport(slurm: SlurmCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpu_audit_app", "slurm", "jobreport", *args],
                          env=slurm.env, capture_output=True, text=True, timeout=60,
                          check=False)


def _report(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text())
    return doc


def test_epilog_reports_a_busy_and_an_idle_job_and_jobreport_prints_them(
    slurm: SlurmCluster, jobenv: JobEnv, nodes: dict[str, NodeExporter]
) -> None:
    """A busy job (1 GPU on n1, 80 % SM, 6 GiB) and an idle one (2 GPUs on n2, 0 %):
    each run's report holds slurmctld's start and end (as sacct has them), GPU-hours
    allocated = GPUs x elapsed, the time its process held the GPUs, the busy share, the
    idle-held time, the peak memory of 80 GiB and the energy; the idle job gets the note
    that its GPUs sat idle. `jobreport` prints the same from the node's report files,
    from AdminComment (any host), and from the audit trail's record, which verifies."""
    a, b = slurm.users
    script = jobenv.script(slurm, "report.sh", f"""\
        exec {jobenv.python} {jobenv.code}/usegpu.py --sleep 8
        """)
    busy = slurm.sbatch(script, "-p", "low", "-w", "n1", "--gres=gpu:1", "--account=physics",
                        "-o", "/dev/null", user=jobenv.user(a),
                        env={**jobenv.env, "GPU_AUDIT_SIM_UTIL": "0.8",
                             "GPU_AUDIT_SIM_MEMORY": "6GiB"})
    idle = slurm.sbatch(script, "-p", "high", "-w", "n2", "--gres=gpu:2", "--account=vision",
                        "-o", "/dev/null", user=jobenv.user(b),
                        env={**jobenv.env, "GPU_AUDIT_SIM_UTIL": "0"})
    files = {busy: slurm.root / "nodes" / "n1" / "slurm" / "reports" / f"{busy}.0.json",
             idle: slurm.root / "nodes" / "n2" / "slurm" / "reports" / f"{idle}.0.json"}
    for job in (busy, idle):
        slurm.wait_job(job, ["COMPLETED"], 120)
    wait_for(lambda: all(f.exists() for f in files.values()), 60, "both epilogs' reports")
    acct = {r["JobIDRaw"]: r for r in slurmcmd.parsable(slurm.run(
        ["sacct", "-X", "-n", "-P", "-j", f"{busy},{idle}", "-o",
         "JobIDRaw,Start,End,ElapsedRaw"]).stdout, ("JobIDRaw", "Start", "End", "ElapsedRaw"))}

    r_busy, r_idle = _report(files[busy]), _report(files[idle])
    for r, job, gpus in ((r_busy, busy, 1), (r_idle, idle, 2)):
        assert r["time_source"] == "slurm"
        assert r["start_time"] == slurmcmd.parse_time(acct[job]["Start"])
        assert r["end_time"] == slurmcmd.parse_time(acct[job]["End"])
        assert r["allocated_gpu_seconds"] == gpus * int(acct[job]["ElapsedRaw"])
        used = r["usage"]["gpu_seconds"]
        assert 0.4 * r["allocated_gpu_seconds"] < used <= r["allocated_gpu_seconds"] + 2 * gpus
        assert r["usage"]["memory_total_bytes"] == 80 * 1024**3
        assert r["usage"]["energy_joules"] > 0 and r["usage"]["processes"] == 1
        assert r["simulated"] is True
    assert (r_busy["user"], r_busy["account"], r_busy["partition"]) == (
        "root" if jobenv.as_root else a.name, "physics", "low")
    assert r_busy["gpus"][0] in {gpu_uuid("n1", 0), gpu_uuid("n1", 1)}
    # usage records keep seconds to the millisecond (docs/AUDIT.md): a ratio of two sums
    # over a few seconds is 0.8 to about 1e-4
    assert abs(r_busy["usage"]["busy_gpu_seconds"] / r_busy["usage"]["gpu_seconds"] - 0.8) < 1e-3
    assert r_busy["usage"]["peak_memory_bytes"] == 6 * 1024**3
    assert r_busy["usage"]["idle_held_gpu_seconds"] == 0
    assert sorted(r_idle["gpus"]) == [gpu_uuid("n2", 0), gpu_uuid("n2", 1)]
    assert r_idle["usage"]["busy_gpu_seconds"] == 0
    assert r_idle["usage"]["idle_held_gpu_seconds"] == r_idle["usage"]["gpu_seconds"]

    text = jobreport(slurm, busy, "--slurm-dir", str(files[busy].parents[1]))
    assert text.returncode == 0, text.stderr
    assert f"Job ID: {busy}   run 0 on n1" in text.stdout
    assert "GPU busy (SM utilisation): 80.0% of the time held" in text.stdout
    assert "Peak GPU memory: 6.00 GiB of 80.0 GiB (7.5%)" in text.stdout
    assert "a smaller GPU or a MIG slice would do" in text.stdout
    assert "SIMULATED" in text.stdout
    text = jobreport(slurm, idle, "--slurm-dir", str(files[idle].parents[1]))
    assert "The GPUs sat idle (< 5 % busy) 100% of the time they were held" in text.stdout

    # from any host: Slurm's AdminComment (stored once slurmdbd has the job's end); and
    # from the audit trail's record
    wait_for(lambda: jobreport(slurm, busy, "--slurm-dir", "/nonexistent").returncode == 0,
             60, "the report in AdminComment")
    by_comment = jobreport(slurm, busy, "--slurm-dir", "/nonexistent", "--json")
    assert by_comment.returncode == 0, by_comment.stderr
    assert json.loads(by_comment.stdout) == [r_busy]
    spool = files[idle].parents[1] / "spool"
    by_trail = jobreport(slurm, idle, "--trail", str(spool), "--json")
    assert by_trail.returncode == 0, by_trail.stderr
    (from_trail,) = json.loads(by_trail.stdout)
    assert {k: from_trail[k] for k in ("job_id", "gpus", "start_time", "end_time", "usage")} == {
        k: r_idle[k] for k in ("job_id", "gpus", "start_time", "end_time", "usage")}
    report = verify_spool_dir(spool, None)
    assert report.ok, report.render()

    missing = jobreport(slurm, "999999", "--slurm-dir", "/nonexistent")
    assert missing.returncode == 1 and "no GPU report for job 999999" in missing.stderr


TRAIN = """\
import tempfile, time
from gpu_audit_ckpt import Checkpointer
ck = Checkpointer(tempfile.mkdtemp())
for step in range(1, 21):
    ck.report(step, loss=1.0 / step, total_steps=1000)
    time.sleep(0.1)
"""


def test_the_report_says_how_far_the_run_got_and_what_it_ran(
    slurm: SlurmCluster, jobenv: JobEnv, nodes: dict[str, NodeExporter]
) -> None:
    """Under the real slurmd: the prolog makes the job's events file, the step wrapper
    points the helper at it, and the epilog puts the run's progress (step 20 of 1000, the
    time it still needed) and the job's environment in the report, then removes the
    file."""
    a = slurm.users[0]
    (slurm.shared / "train_progress.py").write_text(TRAIN)
    (slurm.shared / "train_progress.py").chmod(0o644)
    events = slurm.root / "events" / "n1"
    script = jobenv.script(slurm, "progress.sh", f"""\
        export GPU_AUDIT_SLURM_EVENTS_DIR={events}
        srun {jobenv.code}/slurm/requeue-on-preempt.sh {jobenv.python} \\
            {slurm.shared / 'train_progress.py'}
        """)
    job = slurm.sbatch(script, "-p", "low", "-w", "n1", "--gres=gpu:1", "-o", "/dev/null",
                       user=jobenv.user(a), env=dict(jobenv.env))
    done = slurm.wait_job(job, ["COMPLETED", "FAILED"], 120)
    assert done["JobState"] == "COMPLETED", done
    path = slurm.root / "nodes" / "n1" / "slurm" / "reports" / f"{job}.0.json"
    wait_for(path.exists, 60, "the epilog's report")
    report = _report(path)
    p = report["progress"]
    assert (p["step"], p["total_steps"], p["fraction"]) == (20, 1000, 0.02)
    assert p["steps_per_second"] > 0 and p["remaining_seconds"] > 0
    assert report["environment"]["python"].count(".") == 2
    assert not (events / f"{job}.jsonl").exists()
    out = jobreport(slurm, str(job), "--slurm-dir", str(path.parents[1])).stdout
    assert "Progress: step 20 of 1000 (2.0%)" in out
