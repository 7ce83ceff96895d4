"""What the daemon may do as which user, and the process-wide settings it makes at start.

The daemon runs either as root or, in the least-privilege mode, as a dedicated account
given only CAP_SETUID, CAP_SETGID, CAP_KILL and CAP_CHOWN (systemd
`AmbientCapabilities=`, deploy/systemd). `can_switch_users()` says whether it may start a
job as another user (root, or both CAP_SETUID and CAP_SETGID in its effective set).

`drop_ambient()` empties the ambient capability set at start. A job's process inherits
it: with it, a job started by a non-root daemon would keep CAP_SETUID through execve and
could make itself root. Without it, execve of a program without file capabilities
clears every capability, so jobs (and fingerprint probes) hold none whatever the daemon
holds. `raise_nofile()` lifts RLIMIT_NOFILE to its hard limit (connections are files).

This module must never add a capability, and never lower the file limit.
"""

from __future__ import annotations

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


def drop_ambient() -> bool:
    """Empty the ambient capability set (see the module docstring); True when it is
    empty afterwards (also where the kernel has no ambient set)."""
    if not capability_sets().get("CapAmb"):
        return True
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    if libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0:
        log.error("cannot clear the ambient capabilities (errno %d): jobs would inherit "
                  "them", ctypes.get_errno())
        return False
    return not capability_sets().get("CapAmb")


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
