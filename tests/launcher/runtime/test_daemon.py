"""The launcher daemon end to end: real daemon, real socket, real jobs as real users."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.launcher.runtime.daemon import LauncherDaemon, write_spec
from tests.launcher.runtime.users import (
    ADMINS,
    ALICE,
    BOB,
    CAROL,
    job_python,
    local_user,
)
from tests.polling import wait_for

PY = job_python()


@pytest.fixture
def daemon(home: Path) -> Iterator[LauncherDaemon]:
    local_user(CAROL, groups=(ADMINS,))
    d = LauncherDaemon(home, gpus=2, admin_group=ADMINS).start()
    yield d
    d.stop()
    d.kill_jobs()


TRAIN = ("import os,time; time.sleep(0.5); e=os.environ; print('train', os.getuid(), "
         "os.getgid(), e['CUDA_VISIBLE_DEVICES'], e['JOB_ID'], e['PROJECT_NAME'])")


def test_pipeline_runs_as_submitter_with_logs_status_and_queue(
        daemon: LauncherDaemon, home: Path) -> None:
    """A two-step pipeline submitted by alice runs in order, as alice (not root), on a
    simulated GPU named by UUID; status, queue and logs answer over the socket."""
    write_spec(home, "pipe.yaml", f"""
project: vision
jobs:
  - name: prep
    gpus: 0
    command: ["{PY}", "-c", "import os; print('prep uid', os.getuid())"]
  - name: train
    after: [prep]
    command: ["{PY}", "-c", "{TRAIN}"]
""")
    r = daemon.client(ALICE, "submit", "pipe.yaml")
    assert r.stdout.startswith("submitted 2 job(s)")
    q = daemon.client(ALICE, "queue")
    assert "RUNNING" in q.stdout and "WAITING" in q.stdout and "REASON" in q.stdout
    assert "PRIORITY" in q.stdout and "URGENCY" in q.stdout and "FAIRSHR" in q.stdout
    prep = int(r.stdout.split(": ", 1)[1].split()[0])
    train = prep + 1
    daemon.wait_state(train, {"succeeded"}, timeout=60)
    alice = local_user(ALICE)
    out = daemon.client(ALICE, "logs", str(train)).stdout.split()
    assert out[:3] == ["train", str(alice.pw_uid), str(alice.pw_gid)]
    assert out[3].startswith("GPU-sim-") and out[4:] == [str(train), "vision"]
    assert daemon.job(prep)["state"] == "succeeded"
    mine = json.loads(daemon.client(ALICE, "status", "--json").stdout)["jobs"]
    assert {j["id"] for j in mine} == {prep, train}
    assert json.loads(daemon.client(BOB, "status", "--json").stdout)["jobs"] == []


def test_invalid_spec_lists_every_problem_exit_2(daemon: LauncherDaemon, home: Path) -> None:
    """Every problem of a bad submission is listed at once, and nothing is queued."""
    write_spec(home, "bad.yaml", """
jobs:
  - name: a
    command: ["true"]
    gpus: -1
    urgency: sometime
  - name: b
    after: [nope]
  - name: c
    command: ["true"]
    user: somebody-else
""")
    r = daemon.client(ALICE, "submit", "bad.yaml", check=False)
    assert r.returncode == 2, r.stdout + r.stderr
    err = r.stderr
    for needle in ("gpus", "urgency", "nope", "command"):
        assert needle in err, (needle, err)
    assert daemon.ask({"op": "queue"})["jobs"] == []


def test_other_user_cannot_cancel_hold_or_read_logs(daemon: LauncherDaemon, home: Path) -> None:
    """bob is refused on alice's job (the daemon knows him from the socket, whatever he
    claims); alice and a member of the admin group are not."""
    write_spec(home, "long.yaml", f"""
name: long
command: ["{PY}", "-c", "import time; print('secret', flush=True); time.sleep(60)"]
""")
    job = int(daemon.client(ALICE, "submit", "long.yaml").stdout.split(": ", 1)[1].split()[0])
    daemon.wait_state(job, {"running"})
    for action in ("cancel", "hold", "logs"):
        r = daemon.client(BOB, action, str(job), check=False)
        assert r.returncode == 1, (action, r.stdout, r.stderr)
        assert "belongs to" in r.stderr or "own jobs" in r.stderr, r.stderr
    assert daemon.job(job)["state"] == "running"
    seen_by_bob = json.loads(daemon.client(BOB, "status", "--json", str(job)).stdout)["job"]
    assert seen_by_bob["state"] == "running" and "spec" not in seen_by_bob
    assert "events" not in seen_by_bob, "bob sees alice's job events (and its env)"
    # a second job: alice holds/releases it, an admin cancels it
    job2 = int(daemon.client(ALICE, "submit", "long.yaml").stdout.split(": ", 1)[1].split()[0])
    third = int(daemon.client(ALICE, "submit", "long.yaml").stdout.split(": ", 1)[1].split()[0])
    assert daemon.client(ALICE, "hold", str(third), check=False).returncode in (0, 2)
    daemon.client(CAROL, "cancel", str(job2))
    daemon.client(ALICE, "cancel", str(job))
    assert daemon.wait_state(job, {"cancelled"})["state"] == "cancelled"
    assert daemon.wait_state(job2, {"cancelled"})["state"] == "cancelled"
    daemon.client(ALICE, "cancel", str(third))


@pytest.mark.slow  # ~10 s: two daemon starts, six real jobs
def test_kill9_mid_queue_restart_loses_and_duplicates_nothing(home: Path) -> None:
    """kill -9 of the daemon with jobs running and queued: after a restart every job runs
    exactly once to success. A job whose process survived is adopted (not started again);
    one that finished while no daemon ran keeps its real outcome (from its exit-status
    file); one whose process died while no daemon ran is requeued and runs as attempt 2."""
    runs = home / "runs"
    runs.mkdir(mode=0o777)
    runs.chmod(0o777)
    script = (f"import os,sys,time; open('{runs}/'+os.environ['JOB_ID'],'a').write("
              "os.environ['RUN_ATTEMPT']+'\\n'); time.sleep(float(sys.argv[1]))")
    d = LauncherDaemon(home, gpus=3).start()
    try:
        jobs = [{"name": f"j{i}", "command": [PY, "-c", script, secs]}
                for i, secs in enumerate(("6", "60", "1", "0.2", "0.2", "0.2"))]
        write_spec(home, "five.yaml", yaml.safe_dump({"jobs": jobs}))
        out = d.client(ALICE, "submit", "five.yaml").stdout
        ids = [int(x.split()[0]) for x in out.split(": ", 1)[1].split(", ")]
        assert len(ids) == 6
        survivor, victim, finisher = ids[0], ids[1], ids[2]
        for job in (survivor, victim, finisher):
            d.wait_state(job, {"running"}, timeout=20)
        wait_for(lambda: all((runs / str(j)).exists() for j in (survivor, victim, finisher)),
                 30, "three jobs to start")
        d.kill9()
        # while no daemon runs: the victim's whole process group dies (no exit status)
        pid = int((d.state / "logs" / str(victim) / "1.pid").read_text().split()[0])
        import os
        import signal

        os.killpg(pid, signal.SIGKILL)
        wait_for(lambda: not Path(f"/proc/{pid}").exists() or
                 Path(f"/proc/{pid}/stat").read_text().split(")")[1].split()[0] == "Z",
                 10, "the victim to die")
        exit_file = d.state / "logs" / str(finisher) / "1.exit"
        wait_for(exit_file.exists, 20, "the finisher to end while no daemon runs")
        d.start()
        assert d.wait_state(finisher, {"succeeded"}, timeout=20)["attempt"] == 1
        for job in ids:
            d.wait_state(job, {"succeeded"}, timeout=90) if job != victim else None
        # the victim runs again (attempt 2) and is cancelled here to keep the test short
        d.wait_state(victim, {"running"}, timeout=30)
        assert d.job(victim)["attempt"] == 2
        d.ask({"op": "cancel", "id": victim})
        all_jobs = d.ask({"op": "status"})["jobs"]
        assert sorted(j["id"] for j in all_jobs) == sorted(ids), "a job was lost or added"
        for job in ids:
            attempts = (runs / str(job)).read_text().split()
            expected = ["1", "2"] if job == victim else ["1"]
            assert attempts == expected, (job, attempts)
        events = [e["kind"] for e in d.job(victim)["events"]]
        assert "requeued" in events
    except AssertionError:
        print(d.log.read_text()[-3000:])
        print(json.dumps(d.ask({"op": "status"}), indent=1)[:3000])
        raise
    finally:
        d.stop()
        d.kill_jobs()


def test_second_daemon_on_same_state_is_refused(daemon: LauncherDaemon) -> None:
    """One daemon per state directory: a second exits 1 and names the holder's pid."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "gpu_audit_app", "launcher", "serve",
                        "--config", str(daemon.config), "--socket", str(daemon.dir / "s2")],
                       capture_output=True, text=True, timeout=60, check=False)
    assert r.returncode == 1, r.stdout + r.stderr
    assert daemon.proc is not None and f"pid {daemon.proc.pid}" in r.stderr
    assert daemon.ask({"op": "ping"})["ok"]


def test_logs_follow_streams_until_the_job_ends(daemon: LauncherDaemon, home: Path) -> None:
    """`logs --follow` prints output as it comes and returns when the job has ended."""
    write_spec(home, "ticker.yaml", f"""
name: ticker
command: ["{PY}", "-u", "-c", "import time\\nfor i in range(4): print('tick', i); time.sleep(0.3)"]
""")
    job = int(daemon.client(ALICE, "submit", "ticker.yaml").stdout.split(": ", 1)[1].split()[0])
    daemon.wait_state(job, {"running"})
    r = daemon.client(ALICE, "logs", "--follow", str(job), timeout=60)
    assert r.stdout.split("\n")[:4] == [f"tick {i}" for i in range(4)]
    assert daemon.job(job)["state"] == "succeeded"
