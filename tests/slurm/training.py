"""Checkpointed training jobs on the test cluster, through the shipped wrappers.

A job is submitted with `deploy/slurm/sbatch-checkpoint.sh` (`--signal=USR1@...
--requeue --open-mode=append`), and its batch script runs the example trainer as a job
step under `deploy/slurm/requeue-on-preempt.sh`, holding the GPUs Slurm gave it
(tests/slurm/usegpu.py). The helper's events file (GPU_AUDIT_EVENTS_FILE) tells what
happened in each run: the preemption request, the checkpoint committed, the exit, the
resume. `lost_work()` measures what each interruption cost.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.slurm.cluster import SlurmCluster, User
from tests.slurm.jobenv import JobEnv


@dataclass
class TrainingJob:
    job_id: str
    workdir: Path
    script: str  # examples/<script>
    out: Path  # final parameters
    events_file: Path
    args: list[str] = field(default_factory=list)

    def events(self) -> list[dict[str, Any]]:
        if not self.events_file.exists():
            return []
        complete = self.events_file.read_bytes().rpartition(b"\n")[0]
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def step(self) -> int:
        steps = [e["step"] for e in self.events() if e["event"] == "metrics"]
        return max(steps, default=0)

    def output(self) -> str:
        path = self.workdir / "job.out"
        return path.read_text(errors="replace") if path.exists() else ""


def submit_training(cluster: SlurmCluster, jobenv: JobEnv, name: str, *, script: str,
                    steps: int, step_sleep: float, user: User, options: list[str],
                    every_steps: int = 50) -> TrainingJob:
    """Submit `examples/<script>` as a checkpointed job (see the module docstring)."""
    work = cluster.shared / name
    work.mkdir(mode=0o777)
    work.chmod(0o777)
    out = work / ("params.npz" if script.endswith("numpy.py") else "params.pt")
    args = ["--steps", str(steps), "--checkpoint-dir", str(work / "ckpt"), "--out", str(out),
            "--every-steps", str(every_steps), "--step-sleep", str(step_sleep)]
    batch = jobenv.script(cluster, f"{name}.sh", f"""\
        echo "run $SLURM_RESTART_COUNT on $SLURMD_NODENAME at $(date +%s.%N)"
        srun {jobenv.code}/slurm/requeue-on-preempt.sh {jobenv.python} {jobenv.code}/usegpu.py \\
            {jobenv.code}/examples/{script} {' '.join(args)}
        """)
    env = {**jobenv.env, "GPU_AUDIT_EVENTS_FILE": str(work / "events.jsonl"),
           "GPU_AUDIT_CKPT_LEAD_SECONDS": "60"}
    job = cluster.sbatch(batch, f"--account={user.account}", "-o", str(work / "job.out"),
                         "-J", name, *options, user=jobenv.user(user),
                         wrapper=jobenv.code / "slurm" / "sbatch-checkpoint.sh", env=env)
    return TrainingJob(job, work, script, out, work / "events.jsonl", args)


def reference_run(jobenv: JobEnv, job: TrainingJob, where: Path) -> subprocess.Popen[bytes]:
    """The same training, uninterrupted, outside Slurm (started now, finished later)."""
    where.mkdir()
    args = list(job.args)
    args[args.index("--checkpoint-dir") + 1] = str(where / "ckpt")
    args[args.index("--out") + 1] = str(where / job.out.name)
    args[args.index("--step-sleep") + 1] = "0"
    env = {**os.environ, **jobenv.env}
    env.pop("GPU_AUDIT_EVENTS_FILE", None)
    return subprocess.Popen([sys.executable, str(jobenv.code / "examples" / job.script), *args],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def wait_step(job: TrainingJob, at_least: int, timeout: float = 120) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        step = job.step()
        if step >= at_least:
            return step
        time.sleep(0.05)
    raise AssertionError(f"job {job.job_id} did not reach step {at_least} in {timeout}s:\n"
                         f"{job.output()}")


@dataclass
class Interruption:
    """What one preemption (or failure) cost, from the job's own events."""

    signal_to_commit_s: float  # signal delivered -> checkpoint durable
    commit_to_exit_s: float  # checkpoint durable -> the trainer exited (75)
    exit_to_resume_s: float  # exited -> the requeued run resumed from the checkpoint
    committed_step: int
    resumed_step: int
    steps_redone: int  # steps run after the resumed-from checkpoint, done again


def lost_work(job: TrainingJob) -> list[Interruption]:
    """One entry per `preempt_exit` that was followed by a `resumed`."""
    events = job.events()
    out: list[Interruption] = []
    last_step = 0
    commit: dict[str, Any] | None = None
    signal_time: float | None = None
    exit_event: dict[str, Any] | None = None
    for e in events:
        kind = e["event"]
        if kind == "metrics":
            last_step = max(last_step, int(e["step"]))
        elif kind == "checkpoint_committed":
            # usually reason "preempt"; "periodic" when the signal came at a step that
            # had just been saved (the helper then exits without saving it again)
            commit = e
        elif kind == "preempt_requested":
            signal_time = float(e["signal_time"])
        elif kind == "preempt_exit":
            exit_event = e
        elif (kind == "resumed" and exit_event is not None and commit is not None
              and signal_time is not None):
            out.append(Interruption(
                signal_to_commit_s=max(float(commit["time"]) - signal_time, 0.0),
                commit_to_exit_s=float(exit_event["time"]) - float(commit["time"]),
                exit_to_resume_s=float(e["time"]) - float(exit_event["time"]),
                committed_step=int(commit["step"]), resumed_step=int(e["step"]),
                steps_redone=last_step - int(e["step"])))
            commit = exit_event = signal_time = None
            last_step = int(e["step"])
    return out


def same_parameters(a: Path, b: Path) -> bool:
    """Bit for bit: every array (NumPy .npz) or tensor (torch .pt) equal as bytes."""
    if a.suffix == ".npz":
        import numpy as np

        x, y = np.load(a), np.load(b)
        return sorted(x.files) == sorted(y.files) and all(
            x[k].tobytes() == y[k].tobytes() for k in x.files)
    import torch

    p, q = torch.load(a, weights_only=True), torch.load(b, weights_only=True)
    return bool(p.keys() == q.keys() and all(
        p[k].numpy().tobytes() == q[k].numpy().tobytes() for k in p))
