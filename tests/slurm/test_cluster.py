"""The shipped Slurm prolog and epilog under a real slurmd: the prolog writes the job's
job-mapping file (GPU UUIDs of the gres Slurm allocated, user, account, partition), the
job sees its GPU, and the epilog removes the file when the job ends."""

from __future__ import annotations

import json
import time

from tests.polling import wait_for
from tests.slurm.cluster import SlurmCluster, gpu_uuid
from tests.slurm.conftest import JobEnv


def test_prolog_writes_the_job_mapping_file_and_epilog_removes_it(
    slurm: SlurmCluster, jobenv: JobEnv
) -> None:
    """A one-GPU job on n2 (account vision, partition high): while it runs, n2's
    job-mapping directory holds slurm-<id>.json naming the UUID of the GPU Slurm gave it
    (SLURM_JOB_GPUS mapped through nvidia-smi's index table); after it ends the file is
    gone. The job itself saw CUDA_VISIBLE_DEVICES."""
    user = slurm.users[1]
    script = jobenv.script(slurm, "basic.sh", """\
        echo "gpus=$SLURM_JOB_GPUS cuda=$CUDA_VISIBLE_DEVICES node=$SLURMD_NODENAME"
        sleep 4
        """)
    job = slurm.sbatch(script, "-p", "high", "-w", "n2", "--gres=gpu:1",
                       f"--account={user.account}", "-o", f"{slurm.shared}/basic.%j.out",
                       user=user)
    path = slurm.jobmap_dir("n2") / f"slurm-{job}.json"
    wait_for(path.exists, 60, f"the prolog's {path}")
    doc = json.loads(path.read_text())
    started = slurm.wait_job(job, ["RUNNING", "COMPLETED"])
    assert doc["version"] == 1
    assert (doc["job_id"], doc["slurm_job_id"]) == (job, job)
    assert (doc["user"], doc["account"], doc["partition"]) == (user.name, "vision", "high")
    assert doc["restart_count"] == 0
    assert len(doc["gpus"]) == 1 and doc["gpus"][0] in {gpu_uuid("n2", 0), gpu_uuid("n2", 1)}
    assert abs(doc["start_time"] - time.time()) < 120 and doc["end_time"] is None
    assert started["NodeList"] == "n2"

    slurm.wait_job(job, ["COMPLETED"], 60)
    wait_for(lambda: not path.exists(), 30, f"the epilog removing {path}")
    out = (slurm.shared / f"basic.{job}.out").read_text()
    gpu_index = int(out.split()[0].split("=")[1])
    assert doc["gpus"] == [gpu_uuid("n2", gpu_index)]
    assert f"cuda={gpu_index}" in out and "node=n2" in out
    assert list(slurm.jobmap_dir("n2").iterdir()) == []
