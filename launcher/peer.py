"""Who is on the other end of the launcher's unix socket, from the kernel, not the client.

`peer_of(sock)` reads SO_PEERCRED (struct ucred: pid, uid, gid) and the peer's
supplementary groups from /proc/<pid>/status (`Groups:`), falling back to the passwd
and group databases when the process is gone. A caller is an admin when the configured
admin group's gid is its primary gid or one of its groups.

This module must never take an identity from anything the client sends: the uid in a
request or a job spec is ignored; only the kernel's answer counts.
"""

from __future__ import annotations

import grp
import os
import pwd
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

_UCRED = struct.Struct("3i")  # pid_t pid; uid_t uid; gid_t gid (Linux)


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


def _proc_groups(pid: int, proc: Path) -> frozenset[int] | None:
    try:
        text = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Groups:"):
            return frozenset(int(g) for g in line.split()[1:])
    return None


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


def peer_of(sock: socket.socket, *, admin: int | None, proc: Path = Path("/proc")) -> Caller:
    """The caller on `sock` (an AF_UNIX stream socket), with its admin standing."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    groups = _proc_groups(pid, proc)
    if groups is None:
        groups = _db_groups(uid, gid)
    groups = groups | {gid}
    is_admin = uid == 0 or (admin is not None and admin in groups)
    return Caller(pid=pid, uid=uid, gid=gid, groups=groups, user=_user_name(uid),
                  admin=is_admin)
