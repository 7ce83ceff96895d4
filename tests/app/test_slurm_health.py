"""The health check's reading of an exporter and of the job-mapping files
(gpu_audit_app/slurm/health.py); tests/slurm drains a real node with it."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gpu_audit_app.cli import main
from gpu_audit_app.slurm.health import jobs_on, lost_gpus

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


def _served(body: str) -> ThreadingHTTPServer:
    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def _health(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str
            ) -> tuple[int, list[str]]:
    """`gpu-audit slurm health` against an exporter reporting GPU-b lost, a job holding
    it, and a stand-in scontrol (the Slurm boundary) that records each call."""
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(
        f"#!/bin/sh\necho \"$@\" >> {calls}\necho 'NodeName=n1 State=IDLE Reason=none'\n")
    (bin_dir / "scontrol").chmod(0o755)
    monkeypatch.setenv("GPU_AUDIT_SLURM_BIN_DIR", str(bin_dir))
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "42.json").write_text(json.dumps({"slurm_job_id": "42", "gpus": ["GPU-b"]}))
    server = _served(METRICS)
    try:
        code = main(["slurm", "health", "--exporter",
                     f"http://127.0.0.1:{server.server_address[1]}", "--node", "n1",
                     "--jobmap-dir", str(jobs), *flags])
    finally:
        server.shutdown()
    return code, calls.read_text().splitlines() if calls.exists() else []


def test_health_is_a_dry_run_unless_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Like every command that changes a system (`slurm idle` too): without --apply it
    only says what it would do: scontrol is asked about the node and told nothing."""
    code, calls = _health(tmp_path, monkeypatch)
    assert code == 0
    assert calls == ["-o show node n1"]
    out, err = capsys.readouterr()
    assert "n1: would drain" in out
    assert "job 42 holds GPU-b: would requeue" in out
    assert "dry run: nothing changed (--apply acts)" in err


def test_health_with_apply_drains_and_requeues(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """--apply acts: the node is drained with the lost GPUs in the reason, the job on
    the lost GPU requeued."""
    code, calls = _health(tmp_path, monkeypatch, "--apply")
    assert code == 0
    assert calls[0] == "-o show node n1"
    assert calls[1].startswith("update NodeName=n1 State=DRAIN Reason=gpu-audit: GPU 1")
    assert calls[2] == "requeue 42"
