"""Why a waiting job waits: one current reason per job, a KIND from the fixed set below
and a sentence with the numbers (Slurm's squeue REASON vocabulary is the model: Priority,
Resources, Dependency, BeginTime, JobHeld*, QOSMaxGRESPerUser...).

The kind is what the job's row stores next to its detail and what the launcher's metric
carries as a label (`gpu_audit_launcher_waiting_jobs{reason}`): a handful of values, so
the numbers stay in the text, never in a label. The engine decides which applies
(held, dependency, backoff, limits) and the scheduler the rest (resources, memory,
priority, preemption); this module only names and formats. It must never do I/O, and
a detail never carries more than MAX_DETAIL characters nor anything a user typed except
validated job names.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

NEW = "new"  # submitted, not through a scheduling round yet
HELD = "held"  # held by `hold` until `release`
DEPENDENCY = "dependency"  # an `after` job has not succeeded yet
BACKOFF = "backoff"  # a failed attempt's retry waits out its backoff
USER_LIMIT = "user_limit"  # a per-user quota (running GPUs, GPU-hours per window)
PROJECT_LIMIT = "project_limit"  # a per-project quota
PRIORITY = "priority"  # it would fit, but jobs ahead of it took what was free
RESOURCES = "resources"  # not enough free GPUs (or free share of one)
GPU_MEMORY = "gpu_memory"  # GPUs have room for its share, not for its memory
PREEMPTING = "preempting"  # the jobs it preempted are checkpointing and leaving
YIELDED = "yielded"  # it was preempted for a job that has not started yet
OWNER_AWAY = "owner_away"  # replay's hand-launched baseline: nobody there to start it

KINDS: tuple[str, ...] = (NEW, HELD, DEPENDENCY, BACKOFF, USER_LIMIT, PROJECT_LIMIT,
                          PRIORITY, RESOURCES, GPU_MEMORY, PREEMPTING, YIELDED, OWNER_AWAY)

MAX_DETAIL = 240
MAX_LISTED = 5  # job ids or GPUs named in one detail; the rest are counted


def cut(text: str) -> str:
    """`text` within MAX_DETAIL characters."""
    return text if len(text) <= MAX_DETAIL else text[:MAX_DETAIL - 3] + "..."


def gib(n: float) -> str:
    """Bytes as GiB for a sentence: 80 GiB, 12.5 GiB."""
    v = n / 2**30
    return f"{v:.0f} GiB" if abs(v - round(v)) < 0.05 else f"{v:.1f} GiB"


def clock(t: float) -> str:
    """A time of day (the daemon's local time) for a sentence."""
    return time.strftime("%H:%M:%S", time.localtime(t))


def span(seconds: float) -> str:
    """A duration for a sentence: 7 d, 2 h, 30 min, 45 s."""
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds:.3g} s"


def listed(items: Sequence[object], noun: str = "") -> str:
    """"4, 7 and 9" / "4, 7, 9, 10, 11 and 3 more"."""
    shown = [str(i) for i in items[:MAX_LISTED]]
    rest = len(items) - len(shown)
    if rest > 0:
        return ", ".join(shown) + f" and {rest} more{noun}"
    if len(shown) <= 1:
        return "".join(shown)
    return ", ".join(shown[:-1]) + " and " + shown[-1]


def plural(n: int, word: str, words: str | None = None) -> str:
    return f"{n} {word if n == 1 else (words or word + 's')}"
