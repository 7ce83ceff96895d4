"""The lab policy end to end, through the real daemon and the real `gpu-audit launcher` command
run as real users: what can never run is refused at submission (exit 2, the numbers
named), a level restricted to a group is refused to others, `queue` says why each job
waits and shows the running job's start, attempt, GPU and starting priority, the reason
kinds are a metric label, and `retry` reruns a failed step and the step its failure
cancelled."""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launcher.runtime.daemon import LauncherDaemon, write_spec
from tests.launcher.runtime.users import ALICE, BOB, job_python, local_user
from tests.polling import wait_for

PY = job_python()
LEVEL_GROUP = f"gpa-deadline-{secrets.token_hex(3)}"


@pytest.fixture
def daemon(home: Path) -> Iterator[LauncherDaemon]:
    local_user(BOB, groups=(LEVEL_GROUP,))
    core = {"policy": {"urgency_levels": {
        "normal": {"points": 1000}, "deadline": {"points": 4000, "groups": [LEVEL_GROUP]}},
        "default_urgency": "normal", "preemption": False}}
    d = LauncherDaemon(home, gpus=1, core=core).start()
    yield d
    d.stop()
    d.kill_jobs()


def _write(home: Path, name: str, text: str) -> str:
    return write_spec(home, name, text).name


def _ids(out: str) -> list[int]:
    return [int(i) for i in re.findall(r"(\d+) \(", out)]


def test_refusals_name_the_numbers_and_the_limit(daemon: LauncherDaemon, home: Path) -> None:
    """500 GiB on an 80 GiB GPU and a level alice may not use: exit 2, each named; bob,
    in the level's group, may use it."""
    spec = _write(home, "big.yaml", f"""
jobs:
  - {{name: huge, command: ["{PY}", "-c", ""], gpu_memory_bytes: 500GiB}}
  - {{name: rush, command: ["{PY}", "-c", ""], urgency: deadline}}
""")
    r = daemon.client(ALICE, "submit", spec, check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "huge: needs 500 GiB on one GPU; the largest GPU here has 80 GiB: it can never " \
           "run" in r.stderr
    assert f"rush: urgency 'deadline' is for members of {LEVEL_GROUP}" in r.stderr
    assert daemon.ask({"op": "queue"})["jobs"] == []
    ok = _write(home, "rush.yaml", f'{{name: rush, command: ["{PY}", "-c", ""], '
                                   "urgency: deadline}\n")
    assert daemon.client(BOB, "submit", ok).stdout.startswith("submitted 1 job(s)")


def test_queue_says_why_jobs_wait_and_what_runs_where(daemon: LauncherDaemon,
                                                      home: Path) -> None:
    """queue shows the running job's start, attempt, GPU and starting priority and each
    waiting job's reason with its numbers; status too; the reason kinds are the metric's
    label."""
    spec = _write(home, "pipe.yaml", f"""
jobs:
  - {{name: long, command: ["{PY}", "-c", "import time; time.sleep(60)"]}}
  - {{name: next, command: ["{PY}", "-c", ""], after: [long]}}
  - {{name: other, command: ["{PY}", "-c", ""]}}
""")
    long_id, next_id, other_id = _ids(daemon.client(ALICE, "submit", spec).stdout)
    daemon.wait_state(long_id, {"running"})
    wait_for(lambda: daemon.job(other_id)["wait_reason"] == "resources", 20, "a reason")
    q = daemon.client(ALICE, "queue").stdout
    running = next(line for line in q.splitlines() if line.lstrip().startswith(str(long_id)))
    assert "sim-0000" in running and " 1 " in running and "1000.0" in running, q
    assert f"dependency: waiting for job {long_id} (long: running)" in q
    assert f"resources: needs 1 whole GPU; 0 of 1 free: GPU 0 held by job {long_id}" in q
    status = daemon.client(ALICE, "status").stdout
    assert "GPUS / WAITING FOR" in status and "dependency: waiting for job" in status
    metrics = daemon.scrape()
    assert 'gpu_audit_launcher_waiting_jobs{reason="dependency"} 1.0' in metrics
    assert 'gpu_audit_launcher_waiting_jobs{reason="resources"} 1.0' in metrics
    daemon.client(ALICE, "cancel", str(long_id))
    daemon.wait_state(other_id, {"succeeded"})
    assert daemon.job(next_id)["state"] == "cancelled"


def test_retry_reruns_the_failed_step_and_the_step_it_cancelled(daemon: LauncherDaemon,
                                                                home: Path) -> None:
    """The first run of `train` fails (exit 3, no retries), which cancels `report`;
    `gpu-audit launcher retry` queues both again; train starts over (no checkpoint:
    `restarted`), succeeds, and report runs."""
    marker = home / "ran-once"
    script = (f"import os,sys; p={str(marker)!r}; first=not os.path.exists(p); "
              "open(p,'a').close(); sys.exit(3 if first else 0)")
    spec = _write(home, "retry.yaml", f"""
jobs:
  - {{name: train, command: ["{PY}", "-c", "{script}"]}}
  - {{name: report, command: ["{PY}", "-c", "print('report')"], after: [train]}}
""")
    train, report = _ids(daemon.client(ALICE, "submit", spec).stdout)
    daemon.wait_state(train, {"failed"})
    daemon.wait_state(report, {"cancelled"})
    assert daemon.client(BOB, "retry", str(train), check=False).returncode == 1
    r = daemon.client(ALICE, "retry", str(train))
    assert r.stdout.strip() == (f"queued again: {train} (train), {report} (report); job "
                                f"{train} starts over (no checkpoint)")
    daemon.wait_state(report, {"succeeded"})
    kinds = [e["kind"] for e in daemon.job(train)["events"]]
    assert kinds[-3:] == ["retried", "restarted", "succeeded"], kinds
    again = daemon.client(ALICE, "retry", str(train), check=False)
    assert again.returncode == 2 and "only a failed, timed out or cancelled job" in again.stderr
