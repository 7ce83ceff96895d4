"""A running job's progress, loss and ETA through the real daemon: the job reports through
gpu_audit_ckpt, `queue` and `status` (text and --json) show them, the metrics endpoint
exports them while the job runs and drops them when it ends, and `status` says what the
job runs (its `environment` event)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.launcher.runtime.daemon import REPO, LauncherDaemon, wait_for
from tests.launcher.runtime.users import ALICE, BOB, job_python

PY = job_python()

# reports steps at ~20 steps/s towards 100000 total steps until the test drops a stop
# file: an ETA of over an hour while it runs, whatever the machine's speed
TRAIN = """
import os, sys, time
from gpu_audit_ckpt import Checkpointer
ck = Checkpointer(sys.argv[1])
step = 0
while not os.path.exists(sys.argv[2]):
    step += 1
    ck.report(step, loss=1.0 / step, total_steps=100000, acc=0.5)
    time.sleep(0.05)
"""


@pytest.fixture
def daemon(home: Path) -> Iterator[LauncherDaemon]:
    d = LauncherDaemon(home, gpus=1).start()
    yield d
    d.stop()
    d.kill_jobs()


def _series(text: str, family: str, job: int) -> list[float]:
    return [s.value for f in text_string_to_metric_families(text) if f.name == family
            for s in f.samples if s.labels.get("job") == str(job)]


def test_progress_loss_and_eta_in_queue_status_and_metrics(
        daemon: LauncherDaemon, home: Path) -> None:
    (home / "train.py").write_text(TRAIN)
    stop = home / "stop"
    (home / "job.yaml").write_text(yaml.safe_dump({
        "name": "progress", "project": "vision", "env": {"PYTHONPATH": str(REPO)},
        "command": [PY, str(home / "train.py"), str(home / "ck"), str(stop)]}))
    r = daemon.client(ALICE, "submit", "job.yaml")
    job = int(r.stdout.split(": ", 1)[1].split()[0])

    def eta_known() -> object:
        p = daemon.job(job).get("progress")
        return p if p and p.get("eta_seconds") is not None and p["step"] >= 3 else None

    p = wait_for(eta_known, 60, "the job's ETA in status")
    assert p["total_steps"] == 100000 and 0 < p["fraction"] < 0.01
    assert 0 < p["steps_per_second"] < 1000 and 0 < p["loss"] <= 1.0
    # 100000 steps at no more than a few hundred per second: minutes at the very least
    assert p["eta_seconds"] > 60

    mine = json.loads(daemon.client(ALICE, "status", "--json", str(job)).stdout)["job"]
    assert mine["progress"]["eta_seconds"] > 60
    assert mine["environment"]["python"].count(".") == 2
    detail = daemon.client(ALICE, "status", str(job)).stdout
    assert "progress: step " in detail and "/100000" in detail and "ETA " in detail
    assert "runs: python 3." in detail
    # the queue is public (like squeue): progress yes, what the job runs no
    queue = daemon.client(BOB, "queue").stdout
    assert "PROGRESS" in queue and "ETA" in queue and "/100000 0%" in queue
    q = json.loads(daemon.client(BOB, "queue", "--json").stdout)
    (row,) = [j for j in q["jobs"] if j["id"] == job]
    assert row["progress"]["eta_seconds"] > 60 and "environment" not in row
    table = daemon.client(ALICE, "status").stdout
    assert "/100000" in table

    def scraped_eta() -> str | None:
        text = daemon.scrape()
        return text if _series(text, "gpu_audit_launcher_job_eta_seconds", job) else None

    scraped = wait_for(scraped_eta, 30, "the job's ETA on the metrics endpoint")
    (eta,) = _series(scraped, "gpu_audit_launcher_job_eta_seconds", job)
    assert eta > 60
    assert _series(scraped, "gpu_audit_launcher_job_total_steps", job) == [100000]
    (ratio,) = _series(scraped, "gpu_audit_launcher_job_progress_ratio", job)
    assert 0 < ratio < 0.01
    assert len(_series(scraped, "gpu_audit_launcher_job_steps_per_second", job)) == 1
    # the progress fields have their own families: not user metrics any more
    metrics = {s.labels["metric"] for f in text_string_to_metric_families(scraped)
               if f.name == "gpu_audit_launcher_job_metric" for s in f.samples
               if s.labels.get("job") == str(job)}
    assert metrics == {"acc"}

    stop.write_text("")
    stop.chmod(0o644)
    daemon.wait_state(job, {"succeeded"}, timeout=60)
    families = ("gpu_audit_launcher_job_eta_seconds", "gpu_audit_launcher_job_step",
                "gpu_audit_launcher_job_progress_ratio", "gpu_audit_launcher_job_total_steps",
                "gpu_audit_launcher_job_steps_per_second", "gpu_audit_launcher_job_loss")
    # the state is committed by the tick, the series dropped right after it (the same
    # loop): a scrape in between may still see them, a later one never
    wait_for(lambda: all(not _series(t, f, job) for t in [daemon.scrape()] for f in families),
             10, "the job's series to go when it ended")
    done = daemon.job(job)["progress"]
    assert done["step"] >= p["step"] and done["eta_seconds"] is None
