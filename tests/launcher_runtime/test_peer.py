"""The caller's identity comes from the kernel (SO_PEERCRED) and /proc, never the client."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from launcher.peer import admin_gid, peer_of


def test_peer_is_this_process_with_its_groups() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        caller = peer_of(a, admin=None)
    assert (caller.pid, caller.uid, caller.gid) == (os.getpid(), os.getuid(), os.getgid())
    assert set(os.getgroups()) <= caller.groups


def test_admin_by_supplementary_group_from_proc(tmp_path: Path) -> None:
    """A non-root caller is an admin exactly when the admin gid is among the groups its
    /proc/<pid>/status lists (here a fake procfs root)."""
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.getpid()
    (tmp_path / str(pid)).mkdir()
    (tmp_path / str(pid) / "status").write_text("Name:\tx\nGroups:\t100 4242 \n")
    with a, b:
        yes = peer_of(a, admin=4242, proc=tmp_path)
        no = peer_of(a, admin=4243, proc=tmp_path)
    assert 4242 in yes.groups and 4242 not in no.groups
    if os.getuid() != 0:  # root is always an admin
        assert yes.admin and not no.admin
    assert yes.may_act_on(os.getuid())


def test_admin_group_by_name_or_number() -> None:
    assert admin_gid(None) is None and admin_gid("") is None
    assert admin_gid("4242") == 4242 and admin_gid(7) == 7
    assert admin_gid("root") == 0
    assert admin_gid("no-such-group-gpu-audit") is None
