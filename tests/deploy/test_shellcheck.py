"""Every shell script in the repository passes shellcheck."""

from __future__ import annotations

import subprocess

from tests.deploy.conftest import REPO, need_tool

SKIP_DIRS = {".git", ".venv", "node_modules", "build", "dist"}
SHEBANGS = (b"#!/bin/sh", b"#!/usr/bin/env bash", b"#!/usr/bin/env sh", b"#!/bin/bash")


def shell_scripts() -> list[str]:
    found = []
    for path in sorted(REPO.rglob("*")):
        if not path.is_file() or SKIP_DIRS & set(path.relative_to(REPO).parts):
            continue
        shebang = path.suffix == "" and path.read_bytes()[:64].startswith(SHEBANGS)
        if path.suffix == ".sh" or shebang:
            found.append(str(path.relative_to(REPO)))
    return found


def test_the_deploy_scripts_are_found() -> None:
    scripts = shell_scripts()
    for name in ("deploy/slurm/prolog.sh", "deploy/slurm/epilog.sh",
                 "deploy/slurm/sbatch-checkpoint.sh", "scripts/setup"):
        assert name in scripts


def test_shellcheck_passes() -> None:
    shellcheck = need_tool("shellcheck")
    done = subprocess.run([shellcheck, "--severity=style", *shell_scripts()], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
