"""Preemption end to end: a low-priority training job that follows the checkpoint protocol
(gpu_audit_ckpt) is signalled for an urgent job, commits, exits 75, is requeued and resumes
from its checkpoint to the same weights as an uninterrupted run. The lifecycle lands in the
audit spool, the latencies on the telemetry endpoint, and the exporter attributes the
job's processes through the launcher's job-mapping file."""

from __future__ import annotations

import json
import subprocess
import urllib.request
from pathlib import Path

import orjson
import pytest
import yaml
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from gpu_audit.audit.schema import record_schema
from gpu_audit.audit.verify import verify_spool_dir
from gpu_audit.spool.reader import SpoolReader
from tests.launcher.runtime.daemon import REPO, LauncherDaemon
from tests.launcher.runtime.users import ALICE, BOB, job_python, local_user
from tests.polling import wait_for

PY = job_python()
STEPS = 300


def _spool_records(spool: Path) -> list[dict[str, object]]:
    out: list[dict[str, object]] = []
    reader = SpoolReader(spool)
    offset = 0
    try:
        while True:
            got = reader.read(offset, 1000)
            if not got.entries:
                return out
            out += [orjson.loads(payload) for _, payload in got.entries]
            offset = got.next_offset
    finally:
        reader.close()


@pytest.mark.slow  # ~13 s: a 300-step trainer preempted and resumed
def test_preempted_job_checkpoints_requeues_and_resumes_exactly(home: Path) -> None:
    ref = home / "ref"
    ref.mkdir()
    subprocess.run([PY, str(REPO / "examples/train_toy.py"), "--steps", str(STEPS), "--out",
                    str(ref / "w.json"), "--checkpoint-dir", str(ref / "ck")],
                   env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}, check=True,
                   timeout=60, capture_output=True)
    d = LauncherDaemon(home, gpus=1, core={
        "policy": {"preempt_wait_seconds": 0, "preempt_min_runtime_seconds": 0,
                   "preempt_min_priority_gap": 100},
        "engine": {"preempt_grace_seconds": 30},
    }).start()
    try:
        (home / "low.yaml").write_text(yaml.safe_dump({
            "name": "train-low", "urgency": "low", "project": "vision",
            "checkpoint_dir": str(home / "ck"), "env": {"PYTHONPATH": str(REPO)},
            "command": [PY, str(REPO / "examples/train_toy.py"), "--steps", str(STEPS),
                        "--every-steps", "1000", "--step-sleep", "0.02",
                        "--out", str(home / "w.json")]}))
        (home / "high.yaml").write_text(yaml.safe_dump({
            "name": "urgent-eval", "urgency": "urgent", "project": "nlp",
            "command": [PY, "-c", "import time; time.sleep(0.3); print('urgent done')"]}))
        low = int(d.client(ALICE, "submit", "low.yaml").stdout.split(": ", 1)[1].split()[0])
        d.wait_state(low, {"running"})
        # the exporter attributes the running job's processes through the mapping file
        mapping = wait_for(lambda: _mapped_pids(d.jobmap, low), 20, "the job's pids mapped")
        _assert_exporter_attributes(d.jobmap, low, mapping)
        # telemetry: step and loss with the job's identity, before the preemption
        wait_for(lambda: f'job="{low}"' in _scrape(d) and "gpu_audit_launcher_job_loss{"
                 in _scrape(d), 20, "the job's loss on the launcher endpoint")
        high = int(d.client(BOB, "submit", "high.yaml").stdout.split(": ", 1)[1].split()[0])
        d.wait_state(high, {"succeeded"}, timeout=60)
        done = d.wait_state(low, {"succeeded", "failed"}, timeout=90)
        assert done["state"] == "succeeded" and done["attempt"] == 2
        kinds = [e["kind"] for e in done["events"]]
        assert kinds.index("preempt_signal") < kinds.index("preempted") < kinds.index("resumed")
        (pre,) = [e for e in done["events"] if e["kind"] == "preempted"]
        assert pre["code"] == 75 and pre["clean"] is True
        assert pre["signal_to_commit_seconds"] is not None and pre["signal_to_commit_seconds"] < 30
        assert pre["checkpoint_step"] and 0 < pre["checkpoint_step"] < STEPS
        logs = d.client(ALICE, "logs", str(low)).stdout
        assert logs.startswith(f"resumed from step {pre['checkpoint_step']}"), logs
        # exact resume: the same weights as the run that was never interrupted
        assert json.loads((home / "w.json").read_text()) == \
            json.loads((ref / "w.json").read_text())
        metrics = _scrape(d)
        assert 'gpu_audit_launcher_preemptions_total{outcome="checkpointed"} 1.0' in metrics
        assert "gpu_audit_launcher_preempt_signal_to_commit_seconds_count 1.0" in metrics
    finally:
        d.stop()
        d.kill_jobs()
    _assert_audit_trail(d.state / "spool", low, high)


def _mapped_pids(jobmap: Path, job: int) -> list[int]:
    try:
        doc = json.loads((jobmap / f"job-{job}.json").read_text())
    except (OSError, ValueError):
        return []
    return doc["pids"] if len(doc["pids"]) >= 2 else []  # the shell and the trainer


def _assert_exporter_attributes(jobmap: Path, job: int, pids: list[int]) -> None:
    from exporter.attribution.config import AttributionConfig
    from exporter.attribution.resolver import Resolver
    from tests.exporter.attribution.helpers import gpu, proc

    r = Resolver(AttributionConfig(procfs_root=Path("/proc"), jobmap_dir=jobmap,
                                   sources=("jobmap",)))
    uuid = json.loads((jobmap / f"job-{job}.json").read_text())["gpus"][0]
    result = r.attribute([gpu(uuid, *(proc(p) for p in pids))])
    for ap in result[uuid]:
        a = ap.attribution
        assert (a.job, a.user, a.project) == (str(job), ALICE, "vision"), a


def _scrape(d: LauncherDaemon) -> str:
    url = f"http://127.0.0.1:{d.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as resp:
        return str(resp.read().decode())


def _assert_audit_trail(spool: Path, low: int, high: int) -> None:
    report = verify_spool_dir(spool, None)
    assert report.problems == [], report.problems
    records = _spool_records(spool)
    validator = Draft202012Validator(record_schema())
    for rec in records:
        errors = [e.message for e in validator.iter_errors(rec)]
        assert errors == [], (rec.get("event"), errors)
    low_events = [r["event"] for r in records if r.get("job", {}).get("id") == str(low)]
    assert low_events[:2] == ["job_queued", "job_started"]
    for e in ("job_preempted", "job_checkpoint_committed", "job_resumed", "job_finished"):
        assert e in low_events, (e, low_events)
    (pre,) = [r for r in records if r["event"] == "job_preempted"]
    assert pre["job"]["signal_to_commit_seconds"] >= 0 and pre["job"]["exit_code"] == 75
    (started,) = [r for r in records if r["event"] == "job_started"
                  and r["job"]["id"] == str(low)]
    job_python_version = subprocess.run(
        [PY, "-c", "import platform; print(platform.python_version())"], capture_output=True,
        text=True, timeout=30, check=True).stdout.strip()
    # the job's own interpreter, asked as the job's user (not the daemon's Python)
    assert started["job"]["fingerprint"]["python"] == job_python_version
    assert started["job"]["uid"] == local_user(ALICE).pw_uid
    fin = [r for r in records if r["event"] == "job_finished" and r["job"]["id"] == str(high)]
    assert fin and fin[0]["job"]["allocated_gpu_seconds"] > 0
    assert records[0]["event"] == "launcher_start" and records[-1]["event"] == "launcher_stop"
