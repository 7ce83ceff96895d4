"""`gpu-audit slurm epilog` where Slurm cannot answer (no scontrol, no sacct): the run is
still recorded, from the prolog's file and the node's clock, and says so; a broken
configuration writes no record that would break the stream's chain. tests/slurm runs the
epilog under a real slurmd."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import orjson
import pytest

from gpu_audit.audit.verify import verify_spool_dir
from gpu_audit.spool import SpoolReader
from gpu_audit_app.cli import main

START = math.floor(time.time()) - 100  # the prolog's stamp: whole seconds


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "slurm-42.json").write_text(json.dumps({
        "version": 1, "job_id": "42", "slurm_job_id": "42", "gpus": ["GPU-a", "GPU-b"],
        "start_time": START, "restart_count": 1}))
    (tmp_path / "no-slurm").mkdir()
    (tmp_path / "config.yaml").write_text(
        f"host: n7\nspool:\n  directory: {tmp_path / 'spool'}\n")
    for key, value in {"SLURM_JOB_ID": "42", "SLURM_JOB_USER": "alice",
                       "SLURM_JOB_ACCOUNT": "physics", "SLURM_JOB_PARTITION": "gpu",
                       "SLURMD_NODENAME": "n7", "SLURM_JOB_EXIT_CODE": "0",
                       "GPU_AUDIT_SLURM_BIN_DIR": str(tmp_path / "no-slurm")}.items():
        monkeypatch.setenv(key, value)
    return tmp_path


def _epilog(node: Path, config: str = "config.yaml") -> int:
    return main(["slurm", "epilog", "--config", str(node / config), "--jobmap-dir",
                 str(node / "jobs"), "--slurm-dir", str(node / "slurm"), "--trail-wait", "0"])


def test_without_slurm_the_run_is_recorded_from_the_node(
    node: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The prolog's start and run number, the epilog's clock in whole seconds, and
    time_source "node"; one job_finished record in a chain that verifies, and the
    report file."""
    before = math.floor(time.time())
    assert _epilog(node) == 0
    report = json.loads((node / "slurm" / "reports" / "42.1.json").read_text())
    assert (report["time_source"], report["start_time"], report["attempt"]) == (
        "node", START, 1)
    assert before <= report["end_time"] <= time.time()
    assert report["allocated_gpu_seconds"] == 2 * (report["end_time"] - START)
    with SpoolReader(node / "slurm" / "spool") as reader:
        (rec,) = [orjson.loads(raw) for _, raw in reader.read(0, 10).entries]
    assert (rec["stream"], rec["event"], rec["host"]) == ("slurm", "job_finished", "n7")
    assert rec["job"]["account"] == "physics" and rec["job"]["time_source"] == "node"
    assert verify_spool_dir(node / "slurm" / "spool", None).ok
    assert "no process of the job was seen on its GPUs" in capsys.readouterr().out


def test_a_broken_configuration_writes_no_record(node: Path) -> None:
    """The report is still kept on the node, but no unkeyed record joins the stream."""
    (node / "bad.yaml").write_text("spool: [not, a, mapping]\n")
    assert _epilog(node, "bad.yaml") == 1
    assert (node / "slurm" / "reports" / "42.1.json").exists()
    assert not (node / "slurm" / "spool").exists()


def test_nothing_to_record(node: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No job-mapping file (no GPU on this node): nothing, exit 0; no job id: exit 1."""
    (node / "jobs" / "slurm-42.json").unlink()
    assert _epilog(node) == 0
    assert not (node / "slurm").exists()
    monkeypatch.delenv("SLURM_JOB_ID")
    assert _epilog(node) == 1


def _events_node(node: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    events = node / "events"
    events.mkdir()
    monkeypatch.setenv("SLURM_JOB_UID", "0")
    monkeypatch.setenv("GPU_AUDIT_SLURM_EVENTS_DIR", str(events))
    return events / "42.jsonl"


def test_the_runs_progress_and_environment_come_from_its_events_file(
    node: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The job reported through gpu_audit_ckpt into the file the prolog made: the report
    (JSON file, job_finished record, text) has its newest step of the total, loss,
    throughput, the time it still needed at the run's end, and what it ran; the file is
    removed (the next run's prolog makes a fresh one)."""
    from gpu_audit_ckpt import Checkpointer

    path = _events_node(node, monkeypatch)
    clock = [time.time() - 50]
    ck = Checkpointer(node / "ck", events_file=path, clock=lambda: clock[0])
    for step in range(1, 11):
        ck.report(step, loss=1.0 / step, total_steps=1000)
        clock[0] += 0.5  # 2 steps/s
    ck.events.close()
    with path.open("ab") as fh:  # a hostile tail: garbage, then nonsense numbers
        fh.write(b"not json\n{\"event\":\"metrics\"\n")
    assert _epilog(node) == 0
    report = json.loads((node / "slurm" / "reports" / "42.1.json").read_text())
    p = report["progress"]
    assert (p["step"], p["total_steps"], p["fraction"]) == (10, 1000, 0.01)
    assert p["steps_per_second"] == pytest.approx(2.0) and p["loss"] == pytest.approx(0.1)
    # 990 steps at 2 steps/s from the last report, less the time since it
    assert 0 < p["remaining_seconds"] <= 495
    assert report["environment"]["python"].count(".") == 2
    with SpoolReader(node / "slurm" / "spool") as reader:
        (rec,) = [orjson.loads(raw) for _, raw in reader.read(0, 10).entries]
    assert rec["job"]["progress"]["step"] == 10 and "python" in rec["job"]["environment"]
    out = capsys.readouterr().out
    assert "Progress: step 10 of 1000 (1.0%)" in out and "Ran (as the job reported): python" in out
    assert not path.exists()


def test_hostile_progress_is_dropped_and_a_link_is_not_followed(
    node: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _events_node(node, monkeypatch)
    # as the helper writes non-finite numbers ("nan"), and absurd finite ones
    path.write_text(json.dumps({"event": "metrics", "time": 1e300, "step": 5,
                                "total_steps": 1e40, "steps_per_second": "nan",
                                "loss": -1e300, "epoch": -1}) + "\n")
    assert _epilog(node) == 0
    p = json.loads((node / "slurm" / "reports" / "42.1.json").read_text())["progress"]
    assert p["step"] == 5 and "total_steps" not in p and "remaining_seconds" not in p
    assert "loss" not in p and "steps_per_second" not in p and "epoch" not in p
    assert p["reported_at"] <= time.time()  # a report from the future is dated at the end
    secret = node / "secret"
    secret.write_text(json.dumps({"event": "metrics", "step": 99}) + "\n")
    path.symlink_to(secret)
    (node / "slurm" / "reports" / "42.1.json").unlink()
    assert _epilog(node) == 0
    assert "progress" not in json.loads((node / "slurm" / "reports" / "42.1.json").read_text()) \
        or json.loads((node / "slurm" / "reports" / "42.1.json").read_text())["progress"] == {}
    assert "events file" in capsys.readouterr().err
