"""Checkpoint-first preemption on a real Slurm: a training job in the low partition,
submitted through deploy/slurm/sbatch-checkpoint.sh and run under
deploy/slurm/requeue-on-preempt.sh, is preempted by a high-tier job (partition_prio,
PreemptMode=REQUEUE, GraceTime): Slurm's signal makes it commit a checkpoint at the
next step and exit 75, Slurm requeues it, the requeued run resumes from that checkpoint,
and the final parameters equal an uninterrupted run's bit for bit. The work lost is
measured from the job's own events: no step is done twice."""

from __future__ import annotations

import random

import pytest

from tests.slurm.cluster import SlurmCluster
from tests.slurm.conftest import JobEnv, NodeExporter
from tests.slurm.training import (
    lost_work,
    reference_run,
    same_parameters,
    submit_training,
    wait_step,
)

SEED = random.Random().randrange(1 << 30)


def _preempt_and_finish(slurm: SlurmCluster, jobenv: JobEnv, name: str, *, script: str,
                        steps: int, step_sleep: float) -> None:
    rng = random.Random(SEED)
    a, b = slurm.users
    job = submit_training(slurm, jobenv, name, script=script, steps=steps,
                          step_sleep=step_sleep, user=a,
                          options=["-p", "low", "--gres=gpu:1"])
    ref = reference_run(jobenv, job, slurm.shared / f"{name}-ref")
    target = rng.randrange(steps // 6, steps // 2)
    wait_step(job, target)
    node = slurm.job(job.job_id)["NodeList"]
    # a high-tier job that needs every GPU of that node: the low job must go
    preemptor = jobenv.script(slurm, f"{name}-high.sh", f"""\
        exec {jobenv.python} {jobenv.code}/usegpu.py --sleep 3
        """)
    high = slurm.sbatch(preemptor, "-p", "high", "-w", node, "--gres=gpu:2",
                        f"--account={b.account}", "-o", "/dev/null", user=jobenv.user(b),
                        env=jobenv.env)
    done = slurm.wait_job(job.job_id, ["COMPLETED", "FAILED", "CANCELLED"], 240,
                          f"{name} to finish after its preemption")
    assert done["JobState"] == "COMPLETED", job.output()
    assert slurm.wait_job(high, ["COMPLETED"], 60)["JobState"] == "COMPLETED"
    assert ref.wait(240) == 0, ref.stderr.read() if ref.stderr else ""

    kinds = [e["event"] for e in job.events()]
    assert "preempt_requested" in kinds and "preempt_exit" in kinds, (kinds, job.output())
    (lost,) = lost_work(job)  # one preemption, one resume
    assert lost.resumed_step == lost.committed_step >= target
    assert lost.steps_redone == 0
    assert int(done["Restarts"]) >= 1
    out = job.output()
    assert "requeue-on-preempt: checkpointed after a preemption request" in out
    assert f"resumed from step {lost.committed_step}" in out
    assert same_parameters(job.out, slurm.shared / f"{name}-ref" / job.out.name), (
        f"seed {SEED}: final parameters differ from the uninterrupted run")
    print(f"{name}: preempted at step {lost.committed_step} of {steps}; signal->commit "
          f"{lost.signal_to_commit_s:.3f} s, commit->exit {lost.commit_to_exit_s:.3f} s, "
          f"exit->resumed {lost.exit_to_resume_s:.1f} s, steps redone {lost.steps_redone}")


def test_numpy_job_preempted_by_a_high_tier_job_resumes_bit_identical(
    slurm: SlurmCluster, jobenv: JobEnv, nodes: dict[str, NodeExporter]
) -> None:
    """The NumPy example (SGD + momentum, dropout, shuffled batches), preempted at a
    random step: checkpoint at that step, requeued, resumed, bit-identical."""
    _preempt_and_finish(slurm, jobenv, "np-preempt", script="train_numpy.py", steps=600,
                        step_sleep=0.02)


def test_torch_cpu_job_preempted_by_a_high_tier_job_resumes_bit_identical(
    slurm: SlurmCluster, jobenv: JobEnv, nodes: dict[str, NodeExporter]
) -> None:
    """The PyTorch CPU example (Adam, dropout, LR schedule), the same way."""
    pytest.importorskip("torch", reason="torch is not installed (scripts/setup --test "
                        "installs the CPU build)")
    _preempt_and_finish(slurm, jobenv, "pt-preempt", script="train_torch_cpu.py", steps=300,
                        step_sleep=0.03)
