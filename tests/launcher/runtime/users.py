"""Local users for the launcher's identity tests: created with useradd when running as root.

Tests that need a second (non-root) user call `local_user(name)`; where the test process
is not root the test is skipped with the reason (it cannot create users nor run a job as
another uid)."""

from __future__ import annotations

import grp
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

ALICE = "gpuaudit-alice"
BOB = "gpuaudit-bob"
ADMINS = "gpuaudit-admins"


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: creates local users with useradd and runs jobs as them")


def local_group(name: str) -> int:
    _need_root()
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "-f", name], check=True, timeout=30)
        return grp.getgrnam(name).gr_gid


def local_user(name: str, *, groups: tuple[str, ...] = ()) -> pwd.struct_passwd:
    """The user `name`, created (no home directory, no login) if missing."""
    _need_root()
    try:
        pw = pwd.getpwnam(name)
    except KeyError:
        subprocess.run(["useradd", "-M", "-s", "/usr/sbin/nologin", name], check=False,
                       timeout=30, capture_output=True)
        pw = pwd.getpwnam(name)
    for g in groups:
        local_group(g)
        subprocess.run(["usermod", "-a", "-G", g, name], check=True, timeout=30)
    return pw


def job_python() -> str:
    """An interpreter every local user can run (the test venv's may sit under /root)."""
    for cand in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if Path(cand).exists():
            return cand
    found = shutil.which("python3")
    if found is None:
        pytest.skip("no python3 that other users can execute")
    return found


def shared_dir() -> Path:
    """A fresh directory other users can enter and write (pytest's tmp is root-only)."""
    d = Path(tempfile.mkdtemp(prefix="gpu-audit-launcher-", dir="/tmp"))
    d.chmod(0o777)
    return d
