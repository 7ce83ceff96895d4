"""Per-user and per-project limits the admin sets (config `quotas`): what they cost and
when they hold a job back.

- `UsageWindow`: the GPU-seconds each user and project held (allocated, a fraction by its
  share) in hourly buckets, so "GPU-hours in the last 7 days" is a sum of at most 168
  numbers; the engine charges it every tick and keeps the buckets in the store.
- `Budget`: during one scheduling decision, what each user and project may still start
  (running GPUs), and whether their GPU-hours are used up. The scheduler asks it before
  placing a job and tells it about each start, so one decision cannot start more than a
  limit allows.

Every refusal names the configuration key that set the limit. This module must never do
I/O and never read a clock: `now` is given.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence

from launcher import reasons as r
from launcher.config import QuotaConfig
from launcher.store import JobRecord

HOUR = 3600


class UsageWindow:
    """Allocated GPU-seconds per (kind, name) in hourly buckets (kind: user, project)."""

    def __init__(self, window_seconds: float) -> None:
        self.window = window_seconds
        self._buckets: dict[tuple[str, str], dict[int, float]] = defaultdict(dict)
        self._pending: dict[tuple[str, str, int], float] = defaultdict(float)

    def oldest_hour(self, now: float) -> int:
        """The first hour bucket that still overlaps the window ending at `now`."""
        return int((now - self.window) // HOUR)

    def load(self, rows: Iterable[tuple[str, str, int, float]]) -> None:
        for kind, name, hour, seconds in rows:
            self._buckets[(kind, name)][hour] = seconds

    def charge(self, now: float, user: str, project: str, gpu_seconds: float) -> None:
        if gpu_seconds <= 0:
            return
        hour = int(now // HOUR)
        for key in (("user", user), ("project", project)):
            bucket = self._buckets[key]
            bucket[hour] = bucket.get(hour, 0.0) + gpu_seconds
            self._pending[(*key, hour)] += gpu_seconds

    def used(self, kind: str, name: str, now: float) -> float:
        """GPU-seconds held within the window (whole hours: the oldest bucket counts
        whole until it leaves, so a limit is never lifted early)."""
        buckets = self._buckets.get((kind, name))
        if not buckets:
            return 0.0
        first = self.oldest_hour(now)
        for old in [h for h in buckets if h < first]:
            del buckets[old]
        return sum(buckets.values())

    def drain(self) -> list[tuple[str, str, int, float]]:
        """Charges since the last call, for the store."""
        rows = [(k, n, h, s) for (k, n, h), s in self._pending.items()]
        self._pending.clear()
        return rows


def _fmt_gpus(x: float) -> str:
    return f"{x:g}"


class Budget:
    """What users and projects may still start in one decision (see module docstring)."""

    def __init__(self, config: QuotaConfig, usage: UsageWindow,
                 running: Sequence[JobRecord], now: float) -> None:
        self.config = config
        self.usage = usage
        self.now = now
        self.held: dict[tuple[str, str], float] = defaultdict(float)
        self.jobs: dict[tuple[str, str], int] = defaultdict(int)
        for job in running:
            self.take(job)

    def check(self, job: JobRecord) -> tuple[str, str] | None:
        """Why `job` may not start now because of a limit (reason kind, detail), or None."""
        share = job.spec.gpu_share
        for kind, name in (("user", job.user), ("project", job.project)):
            limits = self.config.limits_for(kind, name)
            code = r.USER_LIMIT if kind == "user" else r.PROJECT_LIMIT
            if limits.max_gpu_hours is not None:
                used = self.usage.used(kind, name, self.now) / HOUR
                if used >= limits.max_gpu_hours:
                    key = self.config.key(kind, name, "max_gpu_hours")
                    return code, r.cut(
                        f"{kind} {name} held {used:.1f} of {limits.max_gpu_hours:g} "
                        f"GPU-hours in the last {r.span(self.config.window_seconds)} "
                        f"({key})")
            if limits.max_running_jobs is not None \
                    and self.jobs[(kind, name)] >= limits.max_running_jobs:
                key = self.config.key(kind, name, "max_running_jobs")
                return code, r.cut(
                    f"{kind} {name} has {self.jobs[(kind, name)]} jobs running, at most "
                    f"{limits.max_running_jobs} (CPU-only jobs count too; {key})")
            if limits.max_running_gpus is not None and share > 0:
                holding = self.held[(kind, name)]
                if holding + share > limits.max_running_gpus + 1e-9:
                    key = self.config.key(kind, name, "max_running_gpus")
                    return code, r.cut(
                        f"{kind} {name}'s running jobs hold {_fmt_gpus(holding)} of "
                        f"{limits.max_running_gpus:g} GPUs; this job needs "
                        f"{_fmt_gpus(share)} more ({key})")
        return None

    def take(self, job: JobRecord) -> None:
        """`job` holds (or will hold) its GPUs."""
        self.held[("user", job.user)] += job.spec.gpu_share
        self.held[("project", job.project)] += job.spec.gpu_share
        self.jobs[("user", job.user)] += 1
        self.jobs[("project", job.project)] += 1
