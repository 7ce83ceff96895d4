"""ProcessExecutor: real child processes in their own process group, as the submitter."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from launcher.executor import ExecutorError, ProcessExecutor
from launcher.spec import JobSpec
from tests.launcher.runtime.users import ALICE, job_python, local_user, shared_dir

PY = job_python()


def ALICE_UID() -> int:
    return local_user(ALICE).pw_uid


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    d = shared_dir()
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _wait_exit(ex: ProcessExecutor, job: int, timeout: float = 20.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        exits = ex.poll()
        if exits:
            return exits
        time.sleep(0.02)
    raise AssertionError(f"job {job} did not exit within {timeout} s")


def _spec(command: list[str], cwd: Path, **more: object) -> JobSpec:
    return JobSpec(name="t", command=command, cwd=str(cwd), **more)


def test_job_runs_as_submitter_with_its_groups_and_env(tmp_path: Path) -> None:
    """A root daemon drops to the submitting user's uid, gid and groups before exec; the
    job sees the engine's env, its events file, and writes its own log."""
    pw = local_user(ALICE)
    ex = ProcessExecutor(tmp_path / "state")
    script = ("import os,json;print(json.dumps([os.getuid(),os.geteuid(),os.getgid(),"
              "os.getgroups(),os.environ['JOB_ID'],os.environ['USER'],"
              "os.environ['GPU_AUDIT_EVENTS_FILE'],"
              f"os.getpgid(0)==os.getsid(0)!={os.getsid(0)}]))")
    ex.start(7, 1, _spec([PY, "-c", script], tmp_path), [], {"JOB_ID": "7", "USER": "x"},
             pw.pw_uid)
    (exit_,) = _wait_exit(ex, 7)
    assert exit_.code == 0 and exit_.job_id == 7
    out, _ = ex.log_paths(7, 1)
    import json

    uid, euid, gid, groups, job_env, user_env, events, leader = json.loads(out.read_text())
    assert (uid, euid, gid) == (pw.pw_uid, pw.pw_uid, pw.pw_gid)
    assert 0 not in groups, "root's supplementary groups leaked into the job"
    assert set(groups) == set(os.getgrouplist(ALICE, pw.pw_gid))
    assert (job_env, user_env) == ("7", ALICE)
    assert events == str(ex.events_path(7, 1))
    assert leader, "the job is not in its own session and process group"
    assert ex._ended_pids[7], "the job's pids are remembered for the release barrier"
    assert ex.pids(7) == set(), "...but only the live ones count: it has exited"
    assert out.stat().st_uid == pw.pw_uid


def test_root_jobs_are_refused_unless_configured(tmp_path: Path) -> None:
    """A job whose user is root never starts (unless allow_root_jobs)."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a non-root daemon cannot be asked to run root jobs")
    ex = ProcessExecutor(tmp_path / "state")
    with pytest.raises(ExecutorError, match="refusing to run a job as root"):
        ex.start(1, 1, _spec(["true"], tmp_path), [], {}, 0)
    assert ex.running() == []


def test_kill_group_reaches_grandchildren_and_poll_reaps(tmp_path: Path) -> None:
    """kill_group kills every process the job forked (its whole process group)."""
    local_user(ALICE)
    ex = ProcessExecutor(tmp_path / "state")
    pidfile = tmp_path / "child.pid"
    script = (f"import subprocess,time;p=subprocess.Popen(['sleep','60']);"
              f"open({str(pidfile)!r},'w').write(str(p.pid));time.sleep(60)")
    ex.start(3, 1, _spec([PY, "-c", script], tmp_path), [], {}, ALICE_UID())
    deadline = time.monotonic() + 20
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline, "the job never forked its child"
        time.sleep(0.02)
    child = int(pidfile.read_text())
    ex.kill_group(3)
    (exit_,) = _wait_exit(ex, 3)
    assert exit_.code == 128 + signal.SIGKILL
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child}").exists():
        stat = Path(f"/proc/{child}/stat").read_text(errors="replace")
        if stat.split(")")[1].split()[0] == "Z":
            break  # a zombie: dead, waiting for its (init) parent
        assert time.monotonic() < deadline, "the grandchild survived kill_group"
        time.sleep(0.02)


def test_preemption_signal_checkpoint_and_exit_75(tmp_path: Path) -> None:
    """The signal only reaches the job's group; the job's checkpoint_committed event is
    read back from its events file and reported with its exit code 75."""
    local_user(ALICE)
    ex = ProcessExecutor(tmp_path / "state")
    script = (
        "import json,os,signal,time\n"
        "flag=[False]\n"
        "signal.signal(signal.SIGUSR1, lambda *a: flag.__setitem__(0, True))\n"
        "ev=open(os.environ['GPU_AUDIT_EVENTS_FILE'],'a')\n"
        "step=0\n"
        "while not flag[0]:\n"
        "    step+=1; time.sleep(0.01)\n"
        "    if step % 5 == 0: ev.write(json.dumps({'event':'metrics','step':step,"
        "'loss':1.0/step})+'\\n'); ev.flush()\n"
        "ev.write(json.dumps({'event':'checkpoint_committed','step':step,'time':time.time(),"
        "'path':'/x'})+'\\n'); ev.flush()\n"
        "raise SystemExit(75)\n")
    ex.start(5, 2, _spec([PY, "-c", script], tmp_path), [], {}, ALICE_UID())
    deadline = time.monotonic() + 20
    seen = []
    while not any(e.doc.get("event") == "metrics" for e in seen):
        assert time.monotonic() < deadline
        seen += ex.drain_events()
        ex.reports()
        time.sleep(0.02)
    sent = time.time()
    ex.signal(5, signal.SIGUSR1)
    (exit_,) = _wait_exit(ex, 5)
    assert exit_.code == 75
    assert exit_.last_checkpoint_step is not None and exit_.last_checkpoint_step > 0
    assert exit_.last_checkpoint_time is not None and exit_.last_checkpoint_time >= sent
    events = [e.doc["event"] for e in seen + ex.drain_events()]
    assert {r.kind for r in ex.reports()} >= {"checkpoint"}
    assert "checkpoint_committed" in events and all(e.attempt == 2 for e in seen)


def test_oom_hint_from_stderr(tmp_path: Path) -> None:
    """A job that dies with CUDA's out-of-memory message is reported as an OOM."""
    local_user(ALICE)
    ex = ProcessExecutor(tmp_path / "state")
    script = "import sys;sys.stderr.write('RuntimeError: CUDA out of memory.\\n');sys.exit(1)"
    ex.start(9, 1, _spec([PY, "-c", script], tmp_path), [], {}, ALICE_UID())
    (exit_,) = _wait_exit(ex, 9)
    assert (exit_.code, exit_.oom) == (1, True)
    ex.start(10, 1, _spec([PY, "-c", "raise SystemExit(1)"], tmp_path), [], {}, ALICE_UID())
    (exit_,) = _wait_exit(ex, 10)
    assert (exit_.code, exit_.oom) == (1, False)


def test_any_preemption_signal_reaches_the_job_and_not_its_shell(tmp_path: Path) -> None:
    """With preempt_signal SIGXCPU (default action: die) the job still checkpoints and its
    exit 75 is what poll reports: the wrapper shell survives the group signal."""
    ex = ProcessExecutor(tmp_path / "state")
    ready = tmp_path / "ready"
    script = (
        "import signal,sys,time\n"
        "flag=[False]\n"
        "signal.signal(signal.SIGXCPU, lambda *a: flag.__setitem__(0, True))\n"
        f"open({str(ready)!r},'w').close()\n"
        "while not flag[0]: time.sleep(0.01)\n"
        "time.sleep(0.3)\n"  # a commit that takes a while
        "sys.exit(75)\n")
    spec = _spec([PY, "-c", script], tmp_path, preempt_signal="SIGXCPU")
    ex.start(11, 1, spec, [], {}, ALICE_UID())
    deadline = time.monotonic() + 20
    while not ready.exists():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    ex.signal(11, signal.SIGXCPU)
    (exit_,) = _wait_exit(ex, 11)
    assert exit_.code == 75


def test_an_ended_jobs_pids_are_only_those_still_alive(tmp_path: Path) -> None:
    """The release barrier asks pids() after the exit: a GPU state read before the job's
    processes were gone (an exporter samples every few seconds) shows their pids, and a
    dead pid must not be taken for a leak; a process of the job still alive must be."""
    local_user(ALICE)
    ex = ProcessExecutor(tmp_path / "state")
    ex.start(4, 1, _spec([PY, "-c", "import time; time.sleep(0.5)"], tmp_path), [], {},
             ALICE_UID())
    deadline = time.monotonic() + 20
    while not ex.pids(4):
        assert time.monotonic() < deadline, "the job's pids were never seen"
        ex.poll()
        time.sleep(0.02)
    seen = ex.pids(4)
    (exit_,) = _wait_exit(ex, 4)
    assert exit_.code == 0
    assert seen and ex.pids(4) == set()
    # a pid of the job that is still alive (here: pretend this test process was one)
    ex._ended_pids[4] = seen | {os.getpid()}
    assert ex.pids(4) == {os.getpid()}


def test_the_jobs_directory_is_entered_as_its_user(tmp_path: Path) -> None:
    """A job whose cwd is a directory only root may enter does not start there: the
    wrapper enters it as the job's user (Popen's cwd= would chdir as root, before the
    identity changes) and the job fails with 126 and the shell's message."""
    private = tmp_path / "root-only"
    private.mkdir(mode=0o700)
    ex = ProcessExecutor(tmp_path / "state")
    ex.start(12, 1, _spec([PY, "-c", "import os; print(os.getcwd())"], private), [], {},
             ALICE_UID())
    (exit_,) = _wait_exit(ex, 12)
    out, err = ex.log_paths(12, 1)
    assert exit_.code == 126, (exit_, out.read_text(), err.read_text())
    assert out.read_text() == "" and "can't cd" in err.read_text()


def test_a_hostile_interpreter_never_stalls_the_start(tmp_path: Path) -> None:
    """The job's 'python' is the user's own program that hangs (and floods) when asked
    for its versions: start() returns at once, the probe is killed at its deadline and
    the fingerprint is simply unknown (the old synchronous probe waited 10 s)."""
    fake = tmp_path / "bin" / "python3"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nif [ \"$1\" = -I ]; then yes; sleep 60; fi\nexec sleep 60\n")
    fake.chmod(0o755)
    ex = ProcessExecutor(tmp_path / "state")
    ex._probes._timeout = 1.0
    started = time.monotonic()
    ex.start(13, 1, _spec([str(fake)], tmp_path), [], {}, ALICE_UID())
    assert time.monotonic() - started < 5, "start waited for the job's interpreter"
    deadline = time.monotonic() + 20
    while ex.fingerprint_pending(13):
        assert time.monotonic() < deadline, "the probe was never ended"
        time.sleep(0.05)
    assert "python" not in ex.fingerprint(13)
    ex.kill_group(13)
    _wait_exit(ex, 13)


def test_a_rounds_reports_are_coalesced_per_job() -> None:
    """Many checkpoint lines of one job in a round become its newest, with the count;
    anomalies merge by reason (past eight reasons into one `other`)."""
    from launcher.engine import Report
    from launcher.executor import coalesce

    reps = [Report(1, float(t), "checkpoint", {"step": t}) for t in range(100)]
    reps += [Report(2, 5.0, "checkpoint", {"step": 7})]
    reps += [Report(1, 50.0 + i, "anomaly", {"reason": f"r{i % 12}"}) for i in range(24)]
    out = coalesce(reps)
    ckpt = [r for r in out if r.kind == "checkpoint"]
    assert [(r.job_id, r.data["step"], r.data.get("count")) for r in ckpt] == [
        (2, 7, None), (1, 99, 100)]
    anomalies = [r for r in out if r.kind == "anomaly"]
    assert len(anomalies) == 9
    other = [r for r in anomalies if r.data["reason"] == "other"]
    assert other and other[0].data["count"] == 8
