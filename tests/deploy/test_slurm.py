"""The Slurm prolog/epilog write and remove exactly the job-mapping file the exporter reads,
and the sbatch wrapper switches the checkpoint protocol on. Run with a fake Slurm
environment and a fake nvidia-smi on PATH; the file is read back by the exporter's own
job map (exporter/attribution/jobmap.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from exporter.attribution.jobmap import JobMap
from tests.deploy.conftest import DEPLOY, exit_preempted

SLURM = DEPLOY / "slurm"
GPU0 = "GPU-5c2a1f0e-0000-4000-8000-000000000000"
GPU1 = "GPU-5c2a1f0e-1111-4000-8000-000000000001"


@pytest.fixture
def fake_bin(tmp_path: Path) -> Path:
    """A fake nvidia-smi answering --query-gpu=index,uuid like the real one (csv,noheader)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(
        "#!/bin/sh\n"
        '[ "$1" = "--query-gpu=index,uuid" ] && [ "$2" = "--format=csv,noheader" ] || exit 9\n'
        f'echo "0, {GPU0}"\necho "1, {GPU1}"\n'
    )
    smi.chmod(0o755)
    return bin_dir


def _run(script: str, env: dict[str, str], fake_bin: Path) -> subprocess.CompletedProcess[str]:
    # GPU_AUDIT_BIN=true: the epilog's `gpu-audit slurm epilog` step does nothing here
    # (tests/slurm runs it for real)
    full = {"PATH": f"{fake_bin}:{os.environ['PATH']}", "GPU_AUDIT_BIN": "true", **env}
    return subprocess.run([str(SLURM / script)], env=full, capture_output=True, text=True,
                          timeout=30, check=False)


def _jobmap(directory: Path) -> JobMap:
    jm = JobMap(directory, wall_clock=lambda: 2e9)
    jm.refresh()
    return jm


def test_prolog_writes_a_file_the_exporter_attributes_and_epilog_removes_it(
    tmp_path: Path, fake_bin: Path
) -> None:
    jobs = tmp_path / "jobs"
    env = {"GPU_AUDIT_JOBMAP_DIR": str(jobs), "SLURM_JOB_ID": "918273",
           "SLURM_JOB_USER": "alice", "SLURM_JOB_ACCOUNT": 'phys"ics\\x', "SLURM_JOB_GPUS": "1",
           "SLURM_JOB_UID": str(os.getuid()),
           "GPU_AUDIT_SLURM_EVENTS_DIR": str(tmp_path / "events")}
    done = _run("prolog.sh", env, fake_bin)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    assert [p.name for p in jobs.iterdir()] == ["slurm-918273.json"]

    jm = _jobmap(jobs)
    assert jm.errors == 0
    record, ambiguous = jm.lookup(4242, (GPU1,))
    assert not ambiguous
    assert record is not None
    assert dict(record.fields) == {
        "job": "918273", "user": "alice", "slurm_job_id": "918273", "slurm_user": "alice",
        "slurm_account": 'phys"ics\\x', "project": 'phys"ics\\x'}  # account stands in
    assert record.gpus == frozenset({GPU1})
    assert record.end_time is None
    assert jm.lookup(4242, (GPU0,))[0] is None  # the other GPU is not the job's

    done = _run("epilog.sh", {"GPU_AUDIT_JOBMAP_DIR": str(jobs), "SLURM_JOB_ID": "918273"},
                fake_bin)
    assert done.returncode == 0, done.stderr
    assert list(jobs.iterdir()) == []
    assert _jobmap(jobs).lookup(4242, (GPU1,))[0] is None


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        ({"SLURM_JOB_GPUS": "0,1"}, {GPU0, GPU1}),
        ({"CUDA_VISIBLE_DEVICES": "1"}, {GPU1}),
        ({"CUDA_VISIBLE_DEVICES": f"{GPU0},MIG-0d6a-1"}, {GPU0, "MIG-0d6a-1"}),
    ],
)
def test_prolog_maps_indices_and_keeps_uuids(
    tmp_path: Path, fake_bin: Path, devices: dict[str, str], expected: set[str]
) -> None:
    jobs = tmp_path / "jobs"
    done = _run("prolog.sh", {"GPU_AUDIT_JOBMAP_DIR": str(jobs), "SLURM_JOB_ID": "5",
                              **devices}, fake_bin)
    assert done.returncode == 0, done.stderr
    jm = _jobmap(jobs)
    assert jm.errors == 0
    for uuid in expected:
        record = jm.lookup(1, (uuid,))[0]
        assert record is not None
        assert record.gpus == frozenset(expected)
        assert record.fields["job"] == "5"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"SLURM_JOB_GPUS": "7"}, "GPU index 7 not reported"),
        ({"SLURM_JOB_GPUS": "gpu:a100"}, "neither an index nor a UUID"),
        ({"SLURM_JOB_ID": "", "SLURM_JOB_GPUS": "0"}, "SLURM_JOB_ID is missing"),
    ],
)
def test_prolog_never_fails_the_job_and_says_why(
    tmp_path: Path, fake_bin: Path, env: dict[str, str], message: str
) -> None:
    jobs = tmp_path / "jobs"
    done = _run("prolog.sh", {"GPU_AUDIT_JOBMAP_DIR": str(jobs), "SLURM_JOB_ID": "6", **env},
                fake_bin)
    assert done.returncode == 0  # a failing prolog would drain the node
    assert message in done.stderr
    assert not jobs.exists() or list(jobs.iterdir()) == []


def test_prolog_without_gpus_writes_nothing(tmp_path: Path, fake_bin: Path) -> None:
    jobs = tmp_path / "jobs"
    done = _run("prolog.sh", {"GPU_AUDIT_JOBMAP_DIR": str(jobs), "SLURM_JOB_ID": "8"},
                fake_bin)
    assert done.returncode == 0
    assert done.stderr == ""
    assert not jobs.exists()


def test_prolog_reports_a_failing_nvidia_smi(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    jobs = tmp_path / "jobs"
    done = _run("prolog.sh", {"GPU_AUDIT_JOBMAP_DIR": str(jobs), "SLURM_JOB_ID": "9",
                              "SLURM_JOB_GPUS": "0"}, bin_dir)
    assert done.returncode == 0
    assert "NVIDIA-SMI has failed" in done.stderr
    assert not jobs.exists() or list(jobs.iterdir()) == []


def test_sbatch_wrapper_sets_signal_and_requeue(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(
        '#!/bin/sh\nprintf "%s\\n" "$@"\n'
        'echo "env $GPU_AUDIT_PREEMPT_SIGNAL $GPU_AUDIT_PREEMPT_GRACE_SECONDS" >&2\n')
    (bin_dir / "sbatch").chmod(0o755)
    done = _run("sbatch-checkpoint.sh", {}, bin_dir)
    assert done.returncode == 2
    assert "usage" in done.stderr
    full = [str(SLURM / "sbatch-checkpoint.sh"), "--gres=gpu:2", "train.sh", "--lr", "3e-4"]
    done = subprocess.run(full, env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
                          capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.splitlines() == [
        "--signal=USR1@120", "--requeue", "--open-mode=append", "--gres=gpu:2", "train.sh",
        "--lr", "3e-4"]
    # What gpu_audit_ckpt reads in the job (sbatch exports the environment).
    assert done.stderr.strip() == "env SIGUSR1,SIGTERM 120"
    done = subprocess.run(full, env={"PATH": f"{bin_dir}:{os.environ['PATH']}",
                                     "GPU_AUDIT_CKPT_LEAD_SECONDS": "300"},
                          capture_output=True, text=True, timeout=30, check=True)
    assert done.stdout.splitlines()[0] == "--signal=USR1@300"
    assert done.stderr.strip() == "env SIGUSR1,SIGTERM 300"


CHILD = """
import signal, sys, time
got = []
signal.signal(signal.SIGUSR1, lambda s, f: got.append(s))
print("ready", flush=True)
deadline = time.monotonic() + 20
while time.monotonic() < deadline:
    if got:
        sys.exit(75)  # checkpoint committed after the request: EXIT_PREEMPTED
    time.sleep(0.02)
sys.exit(3)
"""


@pytest.fixture
def scontrol(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "sbin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "calls"}\n')
    (bin_dir / "scontrol").chmod(0o755)
    return bin_dir


def test_step_wrapper_forwards_the_signal_and_requeues_a_preempted_job(
    tmp_path: Path, scontrol: Path
) -> None:
    env = {**os.environ, "PATH": f"{scontrol}:{os.environ['PATH']}", "SLURM_JOB_ID": "918273"}
    proc = subprocess.Popen([str(SLURM / "requeue-on-preempt.sh"), sys.executable, "-c", CHILD],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGUSR1)  # to the wrapper only: it must pass it on
        assert proc.wait(timeout=30) == 75
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert (tmp_path / "calls").read_text() == "requeue 918273\n"


@pytest.mark.parametrize(("code", "job", "calls"), [
    ("0", "918273", None), ("3", "918273", None), ("75", "", None),
    ("75", "7", "requeue 7\n")])
def test_step_wrapper_requeues_only_a_preempted_exit_in_a_job(
    tmp_path: Path, scontrol: Path, code: str, job: str, calls: str | None
) -> None:
    env = {"PATH": f"{scontrol}:{os.environ['PATH']}", "SLURM_JOB_ID": job}
    done = subprocess.run([str(SLURM / "requeue-on-preempt.sh"), "sh", "-c", f"exit {code}"],
                          env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == int(code)
    calls_file = tmp_path / "calls"
    assert (calls_file.read_text() if calls_file.exists() else None) == calls


def test_step_wrapper_default_is_the_helpers_preempted_exit_code() -> None:
    text = (SLURM / "requeue-on-preempt.sh").read_text()
    assert f"preempted=${{GPU_AUDIT_EXIT_PREEMPTED:-{exit_preempted()}}}" in text


def test_prolog_makes_the_jobs_events_file_and_the_step_wrapper_points_the_helper_at_it(
    tmp_path: Path, fake_bin: Path
) -> None:
    """The events file the epilog reads: made empty by the prolog, owned by the job's
    user, mode 0600, never written through a link left at its path; the job step wrapper
    hands its path to the helper (GPU_AUDIT_EVENTS_FILE) unless the job set its own."""
    events = tmp_path / "events"
    events.mkdir()
    target = tmp_path / "target"
    target.write_text("keep")
    (events / "918274.jsonl").symlink_to(target)  # planted: must not be followed
    env = {"GPU_AUDIT_JOBMAP_DIR": str(tmp_path / "jobs"), "SLURM_JOB_ID": "918274",
           "SLURM_JOB_USER": "nobody", "SLURM_JOB_UID": "65534", "SLURM_JOB_GPUS": "0",
           "GPU_AUDIT_SLURM_EVENTS_DIR": str(events)}
    done = _run("prolog.sh", env, fake_bin)
    assert done.returncode == 0, done.stderr
    made = events / "918274.jsonl"
    st = made.lstat()
    assert not made.is_symlink() and st.st_size == 0
    assert (st.st_uid, st.st_mode & 0o777) == (65534, 0o600)
    assert target.read_text() == "keep"
    show = [sys.executable, "-c", "import os; print(os.environ.get('GPU_AUDIT_EVENTS_FILE'))"]
    base = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": "918274",
            "GPU_AUDIT_SLURM_EVENTS_DIR": str(events)}
    out = subprocess.run([str(SLURM / "requeue-on-preempt.sh"), *show], env=base,
                         capture_output=True, text=True, timeout=30, check=True).stdout
    assert out.strip() == str(made)
    own = subprocess.run([str(SLURM / "requeue-on-preempt.sh"), *show],
                         env={**base, "GPU_AUDIT_EVENTS_FILE": "/tmp/mine"},
                         capture_output=True, text=True, timeout=30, check=True).stdout
    assert own.strip() == "/tmp/mine"
    other = subprocess.run([str(SLURM / "requeue-on-preempt.sh"), *show],
                           env={**base, "SLURM_JOB_ID": "5"},
                           capture_output=True, text=True, timeout=30, check=True).stdout
    assert other.strip() == "None"  # no file made for that job here: the helper is told nothing
