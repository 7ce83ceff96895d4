"""Priority and fair share.

priority = points of the job's urgency level + w_tier*tier + w_age*hours waited
           - w_fairshare_user*decayed measured GPU-hours of the user
           - w_fairshare_project*decayed measured GPU-hours of the project

The fair-share terms charge what the GPUs measured the job's processes using (the
engine feeds `FairShareLedger.charge` from GpuInfo), never what was allocated: a job
that holds a GPU idle is not charged as if it computed, and a share of a GPU costs its
measured share. Usage decays with a configurable half-life.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import asdict, dataclass

from launcher.config import PolicyConfig
from launcher.store import JobRecord


class FairShareLedger:
    """Decayed measured GPU-seconds per user and per project.

    Each principal keeps (value, as_of); reading at `now` decays it by
    2^(-(now-as_of)/half_life). O(1) per charge and per read, so a week of replay or a
    long-running daemon never re-sums history. `dirty()` hands the changed rows to the
    store; `load()` restores them after a restart.
    """

    def __init__(self, half_life_seconds: float) -> None:
        self.half_life = half_life_seconds
        self._values: dict[tuple[str, str], tuple[float, float]] = {}
        self._dirty: set[tuple[str, str]] = set()
        self.total_charged = 0.0
        self._memo: dict[tuple[str, str], float] = {}
        self._memo_at: float | None = None

    def _decay(self, value: float, since: float, now: float) -> float:
        if now <= since:
            return value
        return value * math.pow(2.0, -(now - since) / self.half_life)

    def charge(self, now: float, user: str, project: str, gpu_seconds: float) -> None:
        """Add measured busy GPU-seconds for a user and a project."""
        if gpu_seconds <= 0:
            return
        self.total_charged += gpu_seconds
        self._memo_at = None
        for key in (("user", user), ("project", project)):
            value, at = self._values.get(key, (0.0, now))
            self._values[key] = (self._decay(value, at, now) + gpu_seconds, max(at, now))
            self._dirty.add(key)

    def usage(self, kind: str, name: str, now: float) -> float:
        """Decayed GPU-seconds of a principal ("user" or "project") at `now`."""
        if now != self._memo_at:  # one decision asks for the same few names many times
            self._memo.clear()
            self._memo_at = now
        key = (kind, name)
        hit = self._memo.get(key)
        if hit is None:
            value, at = self._values.get(key, (0.0, now))
            hit = self._memo[key] = self._decay(value, at, now)
        return hit

    def dirty(self) -> list[tuple[str, str, float, float]]:
        rows = [(k, n, *self._values[(k, n)]) for k, n in sorted(self._dirty)]
        self._dirty.clear()
        return rows

    def load(self, rows: Iterable[tuple[str, str, float, float]]) -> None:
        for kind, name, value, at in rows:
            self._values[(kind, name)] = (value, at)
        self._memo_at = None


@dataclass(frozen=True)
class PriorityBreakdown:
    """One job's priority and its terms (each already weighted), like Slurm's sprio."""

    job_id: int
    total: float
    urgency: float
    tier: float
    age: float
    fairshare_user: float
    fairshare_project: float
    # the raw inputs, for the `queue` display
    urgency_level: str = ""
    tier_level: int = 0
    age_seconds: float = 0.0
    user_gpu_hours: float = 0.0
    project_gpu_hours: float = 0.0

    def as_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def user_tier(config: PolicyConfig, user: str) -> int:
    return config.user_tiers.get(user, config.default_tier)


def priority(config: PolicyConfig, job: JobRecord, now: float,
             ledger: FairShareLedger) -> PriorityBreakdown:
    """The priority of `job` at `now`, with its terms. Age counts from submission, so a
    requeued job keeps its place rather than starting over."""
    tier = user_tier(config, job.user)
    age = max(0.0, now - job.submitted_at)
    user_h = ledger.usage("user", job.user, now) / 3600.0
    project_h = ledger.usage("project", job.project, now) / 3600.0
    level = job.spec.urgency or config.default_urgency
    terms = (config.urgency_points(level), config.w_tier * tier,
             config.w_age * age / 3600.0, -config.w_fairshare_user * user_h,
             -config.w_fairshare_project * project_h)
    return PriorityBreakdown(job.id, sum(terms), *terms, urgency_level=level,
                             tier_level=tier, age_seconds=age, user_gpu_hours=user_h,
                             project_gpu_hours=project_h)
