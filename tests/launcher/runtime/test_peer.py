"""The caller's identity comes from the kernel (SO_PEERCRED) and /proc, never the client."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess

import pytest

from launcher.peer import admin_gid, peer_of
from tests.launcher.runtime.users import job_python, shared_dir


def test_peer_is_this_process_with_its_groups() -> None:
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with a, b:
        caller = peer_of(a, admin=None)
    assert (caller.pid, caller.uid, caller.gid) == (os.getpid(), os.getuid(), os.getgid())
    assert set(os.getgroups()) <= caller.groups


def test_admin_by_supplementary_group_from_proc() -> None:
    """A non-root caller is an admin exactly when the admin gid is among its groups: the
    kernel's (SO_PEERGROUPS) or, where that is missing, those /proc/<pid>/status lists
    (a fake procfs root here) only while its Uid is the socket's: a pid reused by
    another user's process lends the caller nothing."""
    if os.geteuid() != 0:
        pytest.skip("needs root: connects as another uid (nobody)")
    d = shared_dir()
    try:
        path = d / "s.sock"
        srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        srv.bind(str(path))
        path.chmod(0o666)
        srv.listen(1)
        srv.settimeout(30)
        child = subprocess.Popen(
            [job_python(), "-c", "import socket,sys,time; s=socket.socket(socket.AF_UNIX); "
             "s.connect(sys.argv[1]); time.sleep(30)", str(path)], user=65534, group=65534)
        try:
            conn, _ = srv.accept()
            proc = d / "proc"
            (proc / str(child.pid)).mkdir(parents=True)
            (proc / str(child.pid) / "status").write_text(
                "Name:\tx\nUid:\t65534\t65534\t65534\t65534\nGroups:\t100 4242 \n")
            with conn:
                yes = peer_of(conn, admin=4242, proc=proc, kernel_groups=False)
                no = peer_of(conn, admin=4243, proc=proc, kernel_groups=False)
                # the pid now belongs to another user's process: its groups are not his
                (proc / str(child.pid) / "status").write_text(
                    "Name:\tx\nUid:\t0\t0\t0\t0\nGroups:\t100 4242 \n")
                reused = peer_of(conn, admin=4242, proc=proc, kernel_groups=False)
                kernel = peer_of(conn, admin=4242)
        finally:
            child.kill()
            child.wait(timeout=30)
            srv.close()
    finally:
        shutil.rmtree(d, ignore_errors=True)
    assert (yes.uid, yes.pid) == (65534, child.pid)
    assert yes.admin and not no.admin
    assert yes.groups == {100, 4242, 65534}
    assert not reused.admin and 4242 not in reused.groups
    assert not kernel.admin and kernel.groups == {65534}, "SO_PEERGROUPS: the real groups"
    assert no.may_act_on(65534) and not no.may_act_on(1000)


def test_admin_group_by_name_or_number() -> None:
    assert admin_gid(None) is None and admin_gid("") is None
    assert admin_gid("4242") == 4242 and admin_gid(7) == 7
    assert admin_gid("root") == 0
    assert admin_gid("no-such-group-gpu-audit") is None
