"""The README's quick start, run as a new user would: on a fresh clone, the commands
exactly as the README writes them.

The clone is `git clone` of this repository's HEAD (so it holds what is committed, as CI
and a new user see it). Its `scripts/setup` really creates `.venv` and pip-installs the
project; the only things the test sets are environment overrides the README documents
(`GPU_AUDIT__EXPORTER__LISTEN`, `GPU_AUDIT__SPOOL__DIRECTORY`), so the run listens on a
free loopback port and keeps its spool in the test's temp dir. Not marked slow: CI runs
every test, and this one is the proof that the first command of the README works.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.netutil import free_port, http_get
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
SIM_COMMAND = 'make run ARGS="--backend sim --scenario busy"'
# A fresh venv plus an install of the project: minutes on a loaded 2-core machine.
SETUP_DEADLINE_S = 600


def readme_quick_start_commands() -> list[str]:
    """Every command line of the README's Quick start `sh` blocks, comments removed."""
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        for line in block.splitlines():
            command = line.split(" #", 1)[0].strip()
            if command:
                commands.append(command)
    return commands


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("make") is None:  # pragma: no cover - .ci/run installs make
        pytest.skip("make is not installed")
    if not (ROOT / ".git").exists():  # pragma: no cover - a tarball, not a clone
        pytest.skip(f"{ROOT} is not a git checkout; nothing to clone")
    dest = tmp_path_factory.mktemp("fresh") / "gpu-audit"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True, timeout=120)
    return dest


def _env(tmp: Path, port: int) -> dict[str, str]:
    # The user's environment, less anything that would make the clone use this checkout's
    # venv or configuration instead of its own.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("GPU_AUDIT__") and k not in ("VIRTUAL_ENV", "PYTHON")}
    venv_bin = str(ROOT / ".venv" / "bin")
    env["PATH"] = os.pathsep.join(
        p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["GPU_AUDIT__EXPORTER__LISTEN"] = f"127.0.0.1:{port}"
    env["GPU_AUDIT__SPOOL__DIRECTORY"] = str(tmp / "spool")
    return env


@pytest.fixture
def started(clone: Path, tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    """The simulator variant of `make run`, in its own process group."""
    port = free_port()
    proc = subprocess.Popen(
        ["bash", "-c", SIM_COMMAND], cwd=clone, env=_env(tmp_path, port),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    try:
        yield proc, port
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


def test_the_readme_quick_start_is_what_this_test_runs() -> None:
    """The quick start still lists `make run`, `make test` and the simulator variant, so
    the tests below run the README's own commands."""
    assert readme_quick_start_commands() == ["make run", "make test", SIM_COMMAND]


@pytest.mark.timeout(SETUP_DEADLINE_S + 120)
def test_make_run_with_the_simulator_serves_metrics_on_a_fresh_clone(
    clone: Path, started: tuple[subprocess.Popen[str], int]
) -> None:
    """On a fresh clone, `make run ARGS="--backend sim --scenario busy"` sets up the venv,
    starts gpu-audit and serves simulated GPU metrics; SIGINT to its process group (what
    Ctrl-C sends) stops it cleanly, and setup leaves its stamp so the next run does not
    reinstall."""
    proc, port = started
    url = f"http://127.0.0.1:{port}/metrics"

    def serving() -> bool:
        if proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"`{SIM_COMMAND}` ended with {proc.returncode}:\n{out}")
        status, body = http_get(url, timeout=2)
        return status == 200 and b'gpu_info{' in body and b'simulated="true"' in body

    wait_for(serving, SETUP_DEADLINE_S, f"{url} to serve simulated GPU metrics", step=0.5)
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=60)
    assert "Traceback" not in out, out
    assert "received SIGINT, shutting down" in out, out
    assert (clone / ".venv" / ".gpu-audit-installed").is_file(), "setup wrote no stamp"


@pytest.mark.timeout(SETUP_DEADLINE_S + 120)
def test_plain_make_run_without_a_gpu_reaches_gpu_audits_nvml_message(
    clone: Path, tmp_path: Path
) -> None:
    """`make run` on a machine without an NVIDIA GPU gets past setup (a second run does not
    reinstall) and ends with gpu-audit's own message: exit 1 from gpu-audit, which make
    reports as `Error 1` and exit 2, with the simulator command that works from the clone."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a GPU machine
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    stamp = clone / ".venv" / ".gpu-audit-installed"
    before = stamp.stat().st_mtime_ns if stamp.exists() else None
    res = subprocess.run(["bash", "-c", "make run"], cwd=clone, env=_env(tmp_path, free_port()),
                         capture_output=True, text=True, timeout=SETUP_DEADLINE_S, check=False)
    assert res.returncode == 2, res.stderr
    assert "gpu-audit: cannot start the nvml backend:" in res.stderr, res.stderr
    assert "libnvidia-ml.so.1" in res.stderr
    assert SIM_COMMAND in res.stderr  # the hint names what works from the clone
    assert "[Makefile" in res.stderr and "run] Error 1" in res.stderr
    assert "Traceback" not in res.stderr
    if before is not None:
        assert stamp.stat().st_mtime_ns == before, "the second `make run` reinstalled"
