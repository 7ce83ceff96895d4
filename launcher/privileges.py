"""What the daemon may do as which user, and the process-wide settings it makes at start.

The daemon runs either as root or, in the least-privilege mode, as a dedicated account
given only CAP_SETUID, CAP_SETGID, CAP_KILL and CAP_CHOWN (systemd
`AmbientCapabilities=`, deploy/systemd). `can_switch_users()` says whether it may start a
job as another user (root, or both CAP_SETUID and CAP_SETGID in its effective set).

`drop_ambient()` empties the ambient and inheritable capability sets at start. A job's
process inherits both: with the ambient set, a job started by a non-root daemon would
keep CAP_SETUID through execve and could make itself root; with the inheritable set, a
program carrying that capability as an inheritable file capability would get it.
Without them, execve clears every capability, so jobs (and fingerprint probes) hold none
whatever the daemon holds. `raise_nofile()` lifts RLIMIT_NOFILE to its hard limit
(connections are files). `raise_priority(nice)` gives the daemon a CPU priority above
its users' processes (a user's busy loops must not starve the loop that answers
everyone); `lowered(argv)` puts what it starts for users (jobs, probes, the submission
reader) back at the priority the daemon was started with.

This module must never add a capability, and never lower the file limit.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import resource
from pathlib import Path

log = logging.getLogger(__name__)

CAP_CHOWN = 0
CAP_KILL = 5
CAP_SETGID = 6
CAP_SETUID = 7
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4


_BASE_NICE: int | None = None  # the nice value the daemon was started with, once raised


def raise_priority(nice: int) -> bool:
    """Set the daemon's nice value to `nice` (lower is more CPU) when that is above
    its priority now; False (logged) where it may not (no CAP_SYS_NICE)."""
    global _BASE_NICE  # noqa: PLW0603 - one process-wide setting, made once at start
    current = os.getpriority(os.PRIO_PROCESS, 0)
    if nice >= current:
        return True
    try:
        os.setpriority(os.PRIO_PROCESS, 0, nice)
    except OSError as exc:
        log.warning("cannot raise the launcher's CPU priority to nice %d (%s): a user "
                    "running busy loops may slow its answers; grant CAP_SYS_NICE or set "
                    "Nice= in its unit", nice, exc.strerror)
        return False
    _BASE_NICE = current
    return True


def lowered(argv: list[str]) -> list[str]:
    """`argv` run at the priority the daemon was started with (through nice(1), which
    execs it: same process, same group), or unchanged when the daemon kept it."""
    if _BASE_NICE is None:
        return argv
    delta = _BASE_NICE - os.getpriority(os.PRIO_PROCESS, 0)
    if delta <= 0:
        return argv
    return [_NICE, "-n", str(delta), "--", *argv]


def lower_child(pid: int) -> None:
    """Put a child the daemon started (as its own uid) back at the priority the daemon
    was started with: for a child whose interpreter nice(1) could not exec by path."""
    if _BASE_NICE is not None:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, pid, _BASE_NICE)


_NICE = next((p for p in ("/usr/bin/nice", "/bin/nice") if os.path.exists(p)), "nice")


def capability_sets(status: Path = Path("/proc/self/status")) -> dict[str, int]:
    """The process's capability sets (CapInh, CapPrm, CapEff, CapBnd, CapAmb) as bit
    masks, from /proc/<pid>/status; {} where not readable."""
    out: dict[str, int] = {}
    try:
        lines = status.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        name, _, value = line.partition(":")
        if name.startswith("Cap"):
            try:
                out[name] = int(value.strip(), 16)
            except ValueError:
                continue
    return out


def has_capability(cap: int, sets: dict[str, int] | None = None) -> bool:
    """Is `cap` in the effective set (always true for root without a bounding set)."""
    sets = capability_sets() if sets is None else sets
    return bool(sets.get("CapEff", 0) >> cap & 1)


def can_switch_users() -> bool:
    """May this process start a job as another user (setuid, setgid, setgroups)?"""
    if os.geteuid() == 0:
        return True
    sets = capability_sets()
    return has_capability(CAP_SETUID, sets) and has_capability(CAP_SETGID, sets)


class _CapHeader(ctypes.Structure):
    _fields_ = (("version", ctypes.c_uint32), ("pid", ctypes.c_int))


class _CapData(ctypes.Structure):
    _fields_ = (("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                ("inheritable", ctypes.c_uint32))


_CAP_VERSION_3 = 0x20080522


def drop_ambient() -> bool:
    """Empty the ambient and the inheritable capability sets (see the module docstring;
    an inheritable capability would still pass to a job that runs a program carrying it
    as a file capability); True when both are empty afterwards."""
    sets = capability_sets()
    if not sets.get("CapAmb") and not sets.get("CapInh"):
        return True
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if sets.get("CapAmb") and libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0,
                                         0) != 0:
        log.error("cannot clear the ambient capabilities (errno %d): jobs would inherit "
                  "them", ctypes.get_errno())
        return False
    header = _CapHeader(_CAP_VERSION_3, 0)
    data = (_CapData * 2)()
    if libc.capget(ctypes.byref(header), data) != 0:
        log.error("capget failed (errno %d)", ctypes.get_errno())
        return False
    for half in data:
        half.inheritable = 0
    if libc.capset(ctypes.byref(header), data) != 0:
        log.error("cannot clear the inheritable capabilities (errno %d)", ctypes.get_errno())
        return False
    after = capability_sets()
    return not after.get("CapAmb") and not after.get("CapInh")


def raise_nofile() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the (soft, hard) now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (OSError, ValueError) as exc:
            log.warning("cannot raise the file limit from %d to %d: %s", soft, hard, exc)
    return soft, hard
