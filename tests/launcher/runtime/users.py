"""Local users for the launcher's identity and attack tests: created with useradd as root.

Tests that need a second (non-root) user call `local_user(name)`; where the test process
is not root the test is skipped with the reason (it cannot create users nor run a job as
another uid). The names carry a random suffix per test run, so two checkouts testing at
the same time never share (or delete) each other's users; every user and group created
here is removed by `remove_created()` (the runtime conftest calls it at session end).
"""

from __future__ import annotations

import grp
import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

_SUFFIX = secrets.token_hex(3)
ALICE = f"gpa-alice-{_SUFFIX}"
BOB = f"gpa-bob-{_SUFFIX}"
CAROL = f"gpa-carol-{_SUFFIX}"
MALLORY = f"gpa-mallory-{_SUFFIX}"
ADMINS = f"gpa-admins-{_SUFFIX}"
LAUNCHER = f"gpa-launcher-{_SUFFIX}"  # the dedicated daemon account (least-privilege mode)

_created_users: list[str] = []
_created_groups: list[str] = []


def _need_root() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: creates local users with useradd and runs jobs as them")


def local_group(name: str) -> int:
    _need_root()
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        subprocess.run(["groupadd", "-f", name], check=True, timeout=30)
        _created_groups.append(name)
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
        _created_users.append(name)
    for g in groups:
        local_group(g)
        subprocess.run(["usermod", "-a", "-G", g, name], check=True, timeout=30)
    return pw


def remove_created() -> None:
    """Remove every user and group this test run created (best effort)."""
    while _created_users:
        subprocess.run(["userdel", _created_users.pop()], check=False, timeout=30,
                       capture_output=True)
    while _created_groups:
        subprocess.run(["groupdel", _created_groups.pop()], check=False, timeout=30,
                       capture_output=True)


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
    """A fresh directory other users can enter and write (pytest's tmp is root-only).

    Sticky, like /tmp: a user may add files but not rename or remove anyone else's, so
    the root-owned daemon directories made inside it cannot be swapped by a test user
    (the daemon refuses a state or socket directory whose parent lets them)."""
    d = Path(tempfile.mkdtemp(prefix="gpu-audit-launcher-", dir="/tmp"))
    d.chmod(0o1777)
    return d
