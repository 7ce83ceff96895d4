"""Hints name a `gpu-audit` command the user can type from where they stand."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpu_audit import invocation
from gpu_audit.invocation import MAKE_RUN_ENV, command

VENV_SCRIPT = Path(sys.executable).parent / "gpu-audit"


def test_under_make_run_the_hint_is_the_make_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """Started by `make run`, a hint for `run ...` is `make run ARGS="..."`; other
    subcommands are not reachable through make and keep the program's own spelling."""
    monkeypatch.setenv(MAKE_RUN_ENV, "1")
    assert command("run --backend sim --scenario busy") == \
        'make run ARGS="--backend sim --scenario busy"'
    assert command("run") == "make run"
    assert not command("spool stats DIR").startswith("make")


def test_a_script_not_on_path_is_named_by_its_path(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`gpu-audit` run as `.venv/bin/gpu-audit` with no gpu-audit on PATH: the hint says
    `.venv/bin/gpu-audit ...` from the clone, and the absolute path from elsewhere."""
    monkeypatch.delenv(MAKE_RUN_ENV, raising=False)
    bindir = tmp_path / ".venv" / "bin"
    bindir.mkdir(parents=True)
    (bindir / "gpu-audit").write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "argv", [".venv/bin/gpu-audit", "run"])
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    monkeypatch.chdir(tmp_path)
    assert command("run --backend sim") == ".venv/bin/gpu-audit run --backend sim"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.setattr(sys, "argv", [str(bindir / "gpu-audit")])
    monkeypatch.chdir(elsewhere)
    assert command("run") == f"{bindir / 'gpu-audit'} run"


def test_the_script_on_path_is_named_plainly(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """When PATH finds the very `gpu-audit` that runs, the hint is just `gpu-audit ...`."""
    monkeypatch.delenv(MAKE_RUN_ENV, raising=False)
    script = tmp_path / "gpu-audit"
    script.write_text("#!/bin/sh\n")
    monkeypatch.setattr(sys, "argv", [str(script)])
    monkeypatch.setattr(invocation.shutil, "which", lambda _name: str(script))
    assert command("run") == "gpu-audit run"


def test_python_dash_m_is_named_as_such(monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m gpu_audit_app` gets a hint with the same interpreter and module."""
    monkeypatch.delenv(MAKE_RUN_ENV, raising=False)
    monkeypatch.setattr(sys, "argv", [str(Path(invocation.__file__).parent / "cli.py")])
    monkeypatch.setattr(invocation.shutil, "which", lambda _name: None)
    assert command("run") == f"{sys.executable} -m gpu_audit_app run"


@pytest.mark.skipif(not VENV_SCRIPT.exists(), reason="no gpu-audit script beside this python")
def test_the_no_gpu_hint_is_a_command_that_works_from_the_cwd(tmp_path: Path) -> None:
    """The venv's `gpu-audit`, run by path with no gpu-audit on PATH, ends on a machine
    without a GPU with a simulator command whose program exists from the same cwd."""
    pynvml = pytest.importorskip("pynvml")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        pass
    else:  # pragma: no cover - only on a GPU machine
        pynvml.nvmlShutdown()
        pytest.skip("this machine has a working NVIDIA driver")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPU_AUDIT")}
    env["PATH"] = "/usr/bin:/bin"
    res = subprocess.run(
        [str(VENV_SCRIPT), "run", "--listen", "127.0.0.1:0",
         "--spool-dir", str(tmp_path / "spool")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert res.returncode == 1, res.stderr
    hint = next(line.strip() for line in res.stderr.splitlines()
                if line.strip().endswith("run --backend sim --scenario busy"))
    program = hint.split(" run ", 1)[0]
    assert program == str(VENV_SCRIPT)
    assert (tmp_path / program).exists()


def test_an_extra_is_installed_into_the_environment_that_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The pip command for an extra uses this interpreter (so it lands in the venv that
    runs gpu-audit), and under `make run` the clone's `.venv` and project."""
    from gpu_audit.invocation import pip_install

    monkeypatch.delenv(MAKE_RUN_ENV, raising=False)
    assert pip_install("fluentd") == f"{sys.executable} -m pip install 'gpu-audit[fluentd]'"
    monkeypatch.setenv(MAKE_RUN_ENV, "1")
    assert pip_install("fluentd") == ".venv/bin/python -m pip install -e '.[fluentd]'"
