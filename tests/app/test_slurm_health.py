"""The health check's reading of an exporter and of the job-mapping files
(gpu_audit_app/slurm_health.py); tests/slurm drains a real node with it."""

from __future__ import annotations

import json
from pathlib import Path

from gpu_audit_app.slurm_health import jobs_on, lost_gpus

METRICS = """\
# HELP gpu_up 1 when the GPU was read in the latest cycle.
# TYPE gpu_up gauge
gpu_up{gpu="0",uuid="GPU-a"} 1
gpu_up{gpu="1",uuid="GPU-b"} 0
gpu_up{gpu="2",uuid="GPU-c"} 0
# HELP gpu_xid_errors_total XID errors.
# TYPE gpu_xid_errors_total counter
gpu_xid_errors_total{gpu="1",uuid="GPU-b",xid="79"} 1
gpu_xid_errors_total{gpu="1",uuid="GPU-b",xid="13"} 2
gpu_xid_errors_total{gpu="0",uuid="GPU-a",xid="48"} 1
"""


def test_lost_gpus_are_the_ones_down_with_their_xids() -> None:
    """Only GPUs with gpu_up 0 are lost (an XID on a GPU still up drains nothing); each
    names the XIDs seen on it, which go into the drain reason."""
    lost = lost_gpus(METRICS)
    assert [(g.index, g.uuid, sorted(g.xids)) for g in lost] == [
        ("1", "GPU-b", [13, 79]), ("2", "GPU-c", [])]
    assert lost[0].reason() == "gpu-audit: GPU 1 (GPU-b) lost: XID 13, 79"
    assert lost[1].reason() == "gpu-audit: GPU 2 (GPU-c) lost"


def test_jobs_on_lost_gpus_come_from_live_job_mapping_files(tmp_path: Path) -> None:
    """Jobs whose file lists a lost GPU; a job on healthy GPUs, an ended job, a hidden
    temporary file, a link and a malformed file are not requeued."""
    def write(name: str, doc: object) -> None:
        (tmp_path / name).write_text(json.dumps(doc))

    write("slurm-5.json", {"version": 1, "job_id": "5", "slurm_job_id": "5",
                           "gpus": ["GPU-a", "GPU-b"]})
    write("slurm-6.json", {"version": 1, "job_id": "6", "slurm_job_id": "6", "gpus": ["GPU-a"]})
    write("slurm-7.json", {"version": 1, "slurm_job_id": "7", "gpus": ["GPU-b"],
                           "end_time": 5})
    write(".slurm-8.json.tmp", {"slurm_job_id": "8", "gpus": ["GPU-b"]})
    write("bad.json", "not a job")
    (tmp_path / "evil.json").symlink_to(tmp_path / "slurm-5.json")
    assert jobs_on(tmp_path, {"GPU-b", "GPU-c"}) == {"5": {"GPU-b"}}
    assert jobs_on(tmp_path / "missing", {"GPU-b"}) == {}
