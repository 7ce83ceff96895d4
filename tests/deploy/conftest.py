"""Shared paths and tool lookups for the deployment tests."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"


def need_tool(name: str, hint: str = "scripts/setup --test installs it") -> str:
    """The tool's path, or skip saying where it comes from."""
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"{name} is not installed ({hint})")
    return path


def exit_preempted() -> int:
    """gpu_audit_ckpt's "checkpointed after a preemption request" exit code, which the
    deploy files (Slurm requeue, systemd) rely on: missing is a failure, never a skip."""
    import gpu_audit_ckpt

    code = getattr(gpu_audit_ckpt, "EXIT_PREEMPTED", None)
    assert isinstance(code, int), "gpu_audit_ckpt.EXIT_PREEMPTED is gone: the deploy files use it"
    return code
