"""Who is on the other end of the launcher's unix socket, from the kernel, not the client.

`peer_of(sock)` reads SO_PEERCRED (struct ucred: pid, uid, gid) and the peer's
supplementary groups as the kernel recorded them at connect (SO_PEERGROUPS, Linux 4.13+).
Where that is missing it reads /proc/<pid>/status (`Groups:`) and trusts it only when
the `Uid:` line there is the socket's uid (the pid may have been reused by another
process since), else the passwd and group databases. A caller is an admin when the
configured admin group's gid is its primary gid or one of its groups.

This module must never take an identity from anything the client sends: the uid in a
request or a job spec is ignored; only the kernel's answer counts.
"""

from __future__ import annotations

import errno
import grp
import os
import pwd
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

_UCRED = struct.Struct("3i")  # pid_t pid; uid_t uid; gid_t gid (Linux)
SO_PEERGROUPS = getattr(socket, "SO_PEERGROUPS", 59)  # Linux 4.13; Python names it in 3.12+
_MAX_GROUPS = 65536  # NGROUPS_MAX


@dataclass(frozen=True, slots=True)
class Caller:
    """A connected client as the kernel reports it."""

    pid: int
    uid: int
    gid: int
    groups: frozenset[int]
    user: str
    admin: bool

    def may_act_on(self, owner_uid: int) -> bool:
        return self.admin or self.uid == owner_uid


def _user_name(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def _socket_groups(sock: socket.socket) -> frozenset[int] | None:
    """The peer's supplementary groups as the kernel recorded them at connect."""
    size = 4 * 64
    while size <= 4 * _MAX_GROUPS:
        try:
            raw = sock.getsockopt(socket.SOL_SOCKET, SO_PEERGROUPS, size)
        except OSError as exc:
            if exc.errno == errno.ERANGE:
                size *= 4
                continue
            return None  # ENOPROTOOPT: an older kernel
        return frozenset(struct.unpack(f"{len(raw) // 4}I", raw[:len(raw) // 4 * 4]))
    return None


def _proc_groups(pid: int, uid: int, proc: Path) -> frozenset[int] | None:
    try:
        text = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    groups: frozenset[int] | None = None
    same_process = False
    for line in text.splitlines():
        if line.startswith("Groups:"):
            groups = frozenset(int(g) for g in line.split()[1:])
        elif line.startswith("Uid:"):
            same_process = line.split()[1:2] == [str(uid)]
    return groups if same_process else None


def _db_groups(uid: int, gid: int) -> frozenset[int]:
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        return frozenset({gid})
    return frozenset(os.getgrouplist(name, gid))


def admin_gid(group: str | int | None) -> int | None:
    """The gid of the configured admin group (a name or a number); None when unset."""
    if group is None or group == "":
        return None
    if isinstance(group, int) or str(group).isdigit():
        return int(group)
    try:
        return grp.getgrnam(str(group)).gr_gid
    except KeyError:
        return None


def peer_of(sock: socket.socket, *, admin: int | None, proc: Path = Path("/proc"),
            kernel_groups: bool = True) -> Caller:
    """The caller on `sock` (an AF_UNIX stream socket), with its admin standing.
    `kernel_groups=False` skips SO_PEERGROUPS (tests of the /proc fallback)."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    groups = _socket_groups(sock) if kernel_groups else None
    if groups is None:
        groups = _proc_groups(pid, uid, proc)
    if groups is None:
        groups = _db_groups(uid, gid)
    groups = groups | {gid}
    is_admin = uid == 0 or (admin is not None and admin in groups)
    return Caller(pid=pid, uid=uid, gid=gid, groups=groups, user=_user_name(uid),
                  admin=is_admin)
