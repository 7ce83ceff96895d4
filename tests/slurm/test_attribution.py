"""A real Slurm job's processes, attributed by the exporter on the node that runs them.

Two jobs of two users and accounts, in two partitions, on the two nodes; each job opens
the simulated GPUs Slurm gave it (tests/slurm/usegpu.py), so its process is reported on
those GPUs. The exporter of each node must attribute it to the job's user, account
(project), partition and job id, on /metrics and in the audit records, from the
prolog's job-mapping file; and the job's own environment (Slurm's SLURM_JOB_* keys) must
give the same answer on its own.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson
from prometheus_client.parser import text_string_to_metric_families

from exporter.attribution.config import AttributionConfig
from exporter.attribution.resolver import Resolver
from gpu_audit.model.samples import GpuInfo, GpuSample, ProcessSample
from gpu_audit.spool import SpoolReader
from tests.polling import wait_for
from tests.slurm.cluster import SlurmCluster, gpu_uuid
from tests.slurm.conftest import JobEnv, NodeExporter


def series(text: str, family: str) -> list[dict[str, str]]:
    """The label sets of `family`'s samples in an exposition."""
    return [dict(s.labels) for f in text_string_to_metric_families(text) if f.name == family
            for s in f.samples]


def spool_records(spool: Any) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with SpoolReader(spool) as reader:
        offset = 0
        while True:
            got = reader.read(offset, 4096)
            out.extend(orjson.loads(raw) for _, raw in got.entries)
            if got.next_offset == offset:
                return out
            offset = got.next_offset


def held_by(node: NodeExporter, job: str) -> list[dict[str, str]]:
    return [s for s in series(node.metrics(), "gpu_process_memory_used_bytes")
            if s.get("slurm_job") == job]


def _pids(cluster: SlurmCluster, node: NodeExporter, job: str) -> Iterable[int]:
    for rec in spool_records(node.spool):
        if (rec.get("kind") == "event" and rec.get("event") == "process_start"
                and rec.get("attribution", {}).get("job") == job):
            yield rec["process"]["pid"]


def test_slurm_jobs_are_attributed_to_user_account_partition_and_job(
    slurm: SlurmCluster, jobenv: JobEnv, nodes: dict[str, NodeExporter]
) -> None:
    """Job A (user a, account physics, partition low, 1 GPU on n1) and job B (user b,
    account vision, partition high, 2 GPUs on n2): each node's /metrics shows the job's
    process on exactly its GPUs with user, project (the account), job and slurm_job; the
    audit records carry slurm_partition and slurm_account too, each from the job-mapping
    file; the other node shows neither job."""
    a, b = slurm.users
    script = jobenv.script(slurm, "hold.sh", f"""\
        exec {jobenv.python} {jobenv.code}/usegpu.py --sleep 25
        """)
    env = {**jobenv.env, "GPU_AUDIT_SIM_UTIL": "0.7"}
    job_a = slurm.sbatch(script, "-p", "low", "-w", "n1", "--gres=gpu:1", "--account=physics",
                         "-o", "/dev/null", user=jobenv.user(a), env=env)
    job_b = slurm.sbatch(script, "-p", "high", "-w", "n2", "--gres=gpu:2", "--account=vision",
                         "-o", "/dev/null", user=jobenv.user(b), env=env)
    try:
        wait_for(lambda: len(held_by(nodes["n1"], job_a)) == 1
                 and len(held_by(nodes["n2"], job_b)) == 2, 60, "both jobs on /metrics")
        owner_a = "root" if jobenv.as_root else a.name
        owner_b = "root" if jobenv.as_root else b.name
        (sa,) = held_by(nodes["n1"], job_a)
        assert (sa["user"], sa["project"], sa["job"]) == (owner_a, "physics", job_a)
        assert sa["uuid"] in {gpu_uuid("n1", 0), gpu_uuid("n1", 1)}
        sb = held_by(nodes["n2"], job_b)
        assert {s["uuid"] for s in sb} == {gpu_uuid("n2", 0), gpu_uuid("n2", 1)}
        assert {(s["user"], s["project"], s["job"]) for s in sb} == {(owner_b, "vision", job_b)}
        assert held_by(nodes["n1"], job_b) == [] and held_by(nodes["n2"], job_a) == []
        alloc = [s for s in series(nodes["n1"].metrics(), "gpu_allocation_info")
                 if s.get("slurm_job") == job_a]
        assert alloc and alloc[0]["source"] == "jobmap"

        def recorded() -> list[dict[str, Any]]:
            return [r["attribution"] for r in spool_records(nodes["n1"].spool)
                    if r.get("kind") == "event" and r.get("event") == "process_start"
                    and r.get("attribution", {}).get("slurm_job_id") == job_a]

        wait_for(lambda: bool(recorded()), 30, "job A's process records in n1's spool")
        rec = recorded()[-1]
        assert {k: rec[k] for k in ("user", "project", "job", "slurm_job_id", "slurm_user",
                                    "slurm_account", "slurm_partition")} == {
            "user": owner_a, "project": "physics", "job": job_a, "slurm_job_id": job_a,
            "slurm_user": owner_a, "slurm_account": "physics", "slurm_partition": "low"}
        assert {rec["sources"][k] for k in ("job", "slurm_partition", "slurm_account")} == {
            "jobmap"}

        # The job's own environment answers the same without the job-mapping file.
        pid = next(iter(_pids(slurm, nodes["n2"], job_b)))
        resolver = Resolver(AttributionConfig(sources=("environ",)))
        try:
            info = GpuInfo(uuid=gpu_uuid("n2", 0), index=0, name="sim")
            by_env = resolver.attribute([GpuSample(info=info, processes=(
                ProcessSample(pid),))])[gpu_uuid("n2", 0)][0].attribution
        finally:
            resolver.close()
        assert (by_env.job, by_env.slurm_job_id, by_env.user, by_env.project,
                by_env.slurm_partition) == (job_b, job_b, owner_b, "vision", "high")
        assert by_env.sources["slurm_partition"] == "environ"
    finally:
        slurm.run(["scancel", job_a, job_b], check=False)
