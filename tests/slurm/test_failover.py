"""A GPU dies under a running job: the job resumes on the other node, bit-identical.

A checkpointed NumPy training job runs on one node's simulated GPU. The GPU reports XID 79
and falls off (live events to the simulator). The node's exporter reports it down; the
shipped health check (deploy/slurm/healthcheck.sh, slurmd's HealthCheckProgram) drains
the node with the reason and requeues the job; Slurm signals it (it checkpoints), it runs
again on the other node, resumes from its checkpoint and ends with the same parameters as
an uninterrupted run. Prometheus, evaluating the shipped alert rules, fires GpuLost for
that GPU naming the job's owner.
"""

from __future__ import annotations

import json
import time
from typing import Any

from tests.netutil import http_get
from tests.polling import wait_for
from tests.promstack import Prometheus
from tests.slurm.cluster import NODES, SlurmCluster, gpu_uuid
from tests.slurm.conftest import JobEnv, NodeExporter
from tests.slurm.training import (
    lost_work,
    reference_run,
    same_parameters,
    submit_training,
    wait_step,
)


def alerts(prom: Prometheus, name: str) -> list[dict[str, Any]]:
    status, body = http_get(f"{prom.url}/api/v1/alerts")
    assert status == 200, body
    return [a for a in json.loads(body)["data"]["alerts"]
            if a["labels"].get("alertname") == name and a["state"] == "firing"]


def test_lost_gpu_drains_the_node_and_the_job_resumes_on_the_other_node(
    slurm: SlurmCluster, jobenv: JobEnv, nodes: dict[str, NodeExporter], prom: Prometheus
) -> None:
    """XID 79 + GPU lost under a training job: node drained with the reason, job requeued,
    resumed on the other node from its checkpoint, bit-identical; GpuLost names the
    job's user, project (account) and Slurm job."""
    a = slurm.users[0]
    job = submit_training(slurm, jobenv, "np-failover", script="train_numpy.py", steps=700,
                          step_sleep=0.02, user=a, options=["-p", "low", "--gres=gpu:1"])
    ref = reference_run(jobenv, job, slurm.shared / "np-failover-ref")
    wait_step(job, 150)
    node = slurm.job(job.job_id)["NodeList"]
    other = next(n for n in NODES if n != node)
    doc = json.loads((slurm.jobmap_dir(node) / f"slurm-{job.job_id}.json").read_text())
    (uuid,) = doc["gpus"]
    index = [gpu_uuid(node, i) for i in range(2)].index(uuid)
    owner = "root" if jobenv.as_root else a.name

    # Prometheus has seen the job on its GPU before the GPU goes
    wait_for(lambda: bool(prom.query(f'gpu_allocation_info{{slurm_job="{job.job_id}"}}')), 30,
             "the job's allocation in Prometheus")
    lost_at = time.time()
    nodes[node].inject(gpu=index, kind="xid", xid=79)
    nodes[node].inject(gpu=index, kind="lost")
    try:
        reason = f"gpu-audit: GPU {index} ({uuid}) lost: XID 79"
        wait_for(lambda: slurm.node(node).get("Reason", "").startswith(reason), 60,
                 f"node {node} drained by the health check")
        assert "DRAIN" in slurm.node(node)["State"]
        done = slurm.wait_job(job.job_id, ["COMPLETED", "FAILED", "CANCELLED"], 240,
                              "the job to finish on the other node")
        assert done["JobState"] == "COMPLETED", job.output()
        assert done["NodeList"] == other and int(done["Restarts"]) >= 1
        assert ref.wait(240) == 0
        assert same_parameters(job.out, slurm.shared / "np-failover-ref" / job.out.name)
        (lost,) = lost_work(job)
        assert lost.resumed_step == lost.committed_step and lost.steps_redone == 0
        out = job.output()
        assert f"run 1 on {other}" in out and f"resumed from step {lost.committed_step}" in out

        def fired() -> list[dict[str, Any]]:
            return [x for x in alerts(prom, "GpuLost") if x["labels"].get("uuid") == uuid]

        def ours() -> list[dict[str, Any]]:
            return [x for x in fired() if x["labels"].get("slurm_job") == job.job_id]

        wait_for(lambda: bool(ours()), 60, "GpuLost firing")
        # gpu_owner_info names the owners the GPU had when it was last read: this job only
        (alert,) = ours()
        labels = alert["labels"]
        assert (labels["user"], labels["project"], labels["slurm_job"], labels["job"],
                labels["gpu"], labels["instance"]) == (
            owner, "physics", job.job_id, job.job_id, str(index), nodes[node].target)
        assert f"Owner: {owner} (project physics" in alert["annotations"]["description"]
        print(f"GPU lost at {lost_at:.1f}; drained, requeued and resumed on {other} at step "
              f"{lost.resumed_step}; exit->resumed {lost.exit_to_resume_s:.1f} s")
    finally:
        nodes[node].inject(gpu=index, kind="recovered")
        # resumed only once its exporter reports the GPU up again: the health check that
        # runs in between would otherwise drain the node again and starve the next tests
        wait_for(lambda: _gpu_up(nodes[node], uuid), 60, f"GPU {uuid} reported up again")
        slurm.run(["scontrol", "update", f"NodeName={node}", "State=RESUME"], check=False)
        wait_for(lambda: slurm.node(node).get("State", "").startswith("IDLE"), 60,
                 f"node {node} back in service")


def _gpu_up(exporter: NodeExporter, uuid: str) -> bool:
    status, body = http_get(f"{exporter.url}/metrics")
    for line in body.decode(errors="replace").splitlines():
        if line.startswith("gpu_up{") and f'uuid="{uuid}"' in line:
            return status == 200 and float(line.rsplit(" ", 1)[1]) == 1.0
    return False
