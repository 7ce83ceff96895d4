"""The launcher core's settings: the scheduling policy and the engine's protocol timings.

The daemon's own settings (socket, admin group, paths) belong to the app layer and wrap
`LauncherCoreConfig`; replay builds the same model for every policy it compares, so the
baselines run the same code with a different `policy.name`.
"""

from __future__ import annotations

import re
from typing import Literal, Self

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpu_audit.rules import IDLE_UTILIZATION
from launcher.limits import KIB, SPEC

# `hand-launched` is a replay baseline (people starting jobs by hand while at their
# desk); the daemon refuses it (gpu_audit_app.launcher.main).
PolicyName = Literal["priority", "fifo-exclusive", "first-fit", "hand-launched"]
LEVEL_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")
MAX_LEVELS = 32
MAX_LEVEL_GROUPS = 64
_GROUP_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\$?$")


class UrgencyLevel(BaseModel):
    """One urgency level a job spec may name: its priority points and who may use it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    points: float = Field(
        ge=0, le=1_000_000, allow_inf_nan=False,
        description="Priority points a job at this level gets (the urgency term).")
    groups: list[str] | None = Field(
        default=None, max_length=MAX_LEVEL_GROUPS,
        description="Unix groups whose members may submit at this level (root and "
        "members of admin_group always may); null: everyone.")

    @field_validator("groups")
    @classmethod
    def _groups(cls, v: list[str] | None) -> list[str] | None:
        bad = [g for g in v or [] if not _GROUP_NAME.match(g)]
        if bad:
            raise ValueError(f"not group names: {', '.join(repr(g[:40]) for g in bad[:5])}")
        return v


def default_levels() -> dict[str, UrgencyLevel]:
    """Four levels 1,000 points apart, open to everyone: a small lab's default. Restrict
    one with `groups:` (e.g. urgent: {points: 3000, groups: [gpu-admins]})."""
    return {"low": UrgencyLevel(points=0.0), "normal": UrgencyLevel(points=1000.0),
            "high": UrgencyLevel(points=2000.0), "urgent": UrgencyLevel(points=3000.0)}


class PolicyConfig(BaseModel):
    """How waiting jobs are ordered, placed and allowed to preempt (launcher/scheduler.py).
    Policy `priority` ranks by the points of the job's urgency level + w_tier*tier +
    w_age*hours waited - w_fairshare_user*decayed measured GPU-hours of the user
    - w_fairshare_project*decayed measured GPU-hours of the project."""

    model_config = ConfigDict(extra="forbid")

    name: PolicyName = Field(
        default="priority",
        description="Scheduling policy. `priority`: highest priority first, backfilling, "
        "preemption and idle reclaim; `fifo-exclusive`: submission order, whole GPUs only, "
        "the first job that does not fit blocks the rest, no preemption; `first-fit`: "
        "submission order, every job that fits starts, no preemption. The weights and "
        "preemption keys below apply to `priority` only. (`hand-launched` is a replay "
        "baseline only.)")
    urgency_levels: dict[str, UrgencyLevel] = Field(
        default_factory=default_levels,
        description="The urgency levels a job spec may name (`urgency: high`), each with "
        "its priority points and the groups allowed to use it. A spec naming another "
        "level, or one its user may not use, is refused at submission.")
    default_urgency: str = Field(
        default="normal",
        description="The level of a job spec without `urgency` (one of urgency_levels, "
        "open to everyone).")
    w_tier: float = Field(
        default=500.0, ge=0,
        description="Priority points per tier level of the submitting user "
        "(`user_tiers`, else `default_tier`).")
    w_age: float = Field(
        default=20.0, ge=0,
        description="Priority points per hour since submission (a requeued job keeps its "
        "age).")
    w_fairshare_user: float = Field(
        default=10.0, ge=0,
        description="Priority points subtracted per decayed GPU-hour the user's jobs were "
        "measured using (memory share x utilisation, not allocation).")
    w_fairshare_project: float = Field(
        default=2.0, ge=0,
        description="Priority points subtracted per decayed GPU-hour the project's jobs "
        "were measured using.")
    half_life_seconds: float = Field(
        default=7 * 86400.0, gt=0,
        description="Seconds in which measured fair-share usage decays to half (default "
        "7 days).")
    user_tiers: dict[str, int] = Field(
        default_factory=dict,
        description="Tier level per user name, multiplied by `w_tier`.")
    default_tier: int = Field(
        default=0, description="Tier level of a user not listed in `user_tiers`.")
    # preemption (policy "priority" only)
    preemption: bool = Field(
        default=True,
        description="Let a waiting job that does not fit preempt lower-priority running "
        "jobs (policy `priority` only).")
    preempt_wait_seconds: float = Field(
        default=300.0, ge=0,
        description="Seconds a job must have been queued before it may preempt. Also how "
        "long (at least 60) a job whose victims left keeps their GPUs reserved instead of "
        "preempting again.")
    preempt_min_runtime_seconds: float = Field(
        default=120.0, ge=0,
        description="A job that started less than this many seconds ago is never "
        "preempted.")
    preempt_min_priority_gap: float = Field(
        default=500.0, ge=0,
        description="Points a victim must be below the waiting job (not required of an "
        "idle-reclaim victim): in urgency points with `preempt_by: urgency`, in total "
        "priority with `preempt_by: priority`.")
    preempt_by: Literal["urgency", "priority"] = Field(
        default="priority",
        description="What entitles a waiting job to preempt a busy one: `urgency` (its "
        "urgency level's points are at least preempt_min_priority_gap above the victim's, "
        "and its priority is higher; fair share and age only order the queue, as Slurm "
        "preempts by QOS) or `priority` (the total priority, fair share and age "
        "included, is at least the gap above).")
    # idle reclaim (policy "priority" only): a running job whose MEASURED utilisation stays
    # under `idle_util_threshold` for `idle_reclaim_seconds` while work waits gives way
    idle_reclaim: bool = Field(
        default=True,
        description="Make running jobs measured idle for `idle_reclaim_seconds` give way "
        "while work waits: one that checkpoints becomes the preferred victim of a waiter "
        "of higher or equal priority; a one-GPU job that cannot is re-admitted as a share "
        "of its GPU (policy `priority` only).")
    idle_util_threshold: float = Field(
        default=IDLE_UTILIZATION, ge=0, le=1,
        description="A job whose measured utilisation (the GPU's utilisation x the job's "
        "share of the memory in use there, 0-1) is under this on every GPU it holds is "
        "idle.")
    idle_reclaim_seconds: float = Field(
        default=900.0, ge=0,
        description="Seconds a job must have been continuously idle before idle reclaim "
        "acts on it.")
    idle_share_max_fraction: float = Field(
        default=0.5, gt=0, lt=1,
        description="An idle one-GPU job that cannot checkpoint is re-admitted as a share "
        "of its GPU (its measured memory, at least its gpu_memory_bytes) only when that "
        "share is at most this fraction of the GPU.")
    # placement
    idle_memory_bytes: int = Field(
        default=1 << 30, ge=0,
        description="A GPU no job of ours holds is free for a whole-GPU job only when its "
        "measured used memory is at most this many bytes.")
    max_temperature_c: float = Field(
        default=85.0,
        description="Degrees Celsius: a hotter GPU gets no new jobs.")
    skip_throttling: bool = Field(
        default=True,
        description="A GPU reporting thermal or power throttling gets no new jobs.")
    skip_recent_xid: bool = Field(
        default=True,
        description="A GPU with an XID error within the GPU source's window gets no new "
        "jobs.")
    # time
    evening_deadline: str | None = Field(
        default=None, pattern=r"^([01]\d|2[0-3]):[0-5]\d$",
        description="Off by default. A local time (`09:00`): a job submitted between "
        "`evening_starts` and this time (through midnight) without a deadline of its own "
        "gets the next one as its deadline (the night's work is due in the morning).")
    evening_starts: str = Field(
        default="17:00", pattern=r"^([01]\d|2[0-3]):[0-5]\d$",
        description="Local time from which a submission counts as an evening one for "
        "`evening_deadline`.")
    deadline_order: bool = Field(
        default=True,
        description="Policy `priority`: among waiting jobs of the same urgency level and "
        "tier, jobs with a deadline go first, least slack (deadline - now - estimated "
        "runtime) first; the other jobs keep their places in the priority order. A running "
        "job with a deadline is preempted only for a more urgent level.")
    deadline_reservations: bool = Field(
        default=True,
        description="Policy `priority` with `deadline_order`: a deadline job that can "
        "still make it but does not fit now gets a reservation (the GPUs it is to start "
        "on and when, from the running jobs' estimated ends); later jobs start now only "
        "when they would end before it (their estimate, else max_runtime) or on other "
        "GPUs.")
    deadline_preempt_slack_seconds: float = Field(
        default=7200.0, ge=0,
        description="Policy `priority` with `deadline_order`: a waiting job whose slack "
        "has fallen under this may preempt checkpointing jobs without a deadline of the "
        "same or a lower urgency level, whatever their priorities.")

    @model_validator(mode="after")
    def _levels(self) -> Self:
        problems = [f"urgency_levels: {name[:40]!r} is not a level name (lower-case letters, "
                    "digits, '_' or '-', at most 32)"
                    for name in self.urgency_levels if not LEVEL_NAME.match(name)]
        if not self.urgency_levels or len(self.urgency_levels) > MAX_LEVELS:
            problems.append(f"urgency_levels: 1 to {MAX_LEVELS} levels")
        level = self.urgency_levels.get(self.default_urgency)
        if level is None:
            problems.append(f"default_urgency: {self.default_urgency[:40]!r} is not one of "
                            f"urgency_levels ({', '.join(sorted(self.urgency_levels))})")
        elif level.groups is not None:
            problems.append(f"default_urgency: level {self.default_urgency!r} is restricted "
                            "to groups; the default level must be open to everyone")
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def urgency_points(self, level: str) -> float:
        """Points of a level; 0 for a level the configuration no longer has (a job queued
        before the admin removed it keeps waiting, at the bottom)."""
        found = self.urgency_levels.get(level)
        return found.points if found is not None else 0.0


class EngineConfig(BaseModel):
    """Protocol timings and limits of the state machine (launcher/engine.py)."""

    model_config = ConfigDict(extra="forbid")

    preempt_grace_seconds: float = Field(
        default=120.0, gt=0,
        description="Seconds from a preemption signal (also a timeout or GPU fault) until "
        "the job's process group is killed, again every this many seconds while it "
        "lingers; the job reads it as GPU_AUDIT_PREEMPT_GRACE_SECONDS.")
    telemetry_event_interval_seconds: float = Field(
        default=60.0, ge=0,
        description="A job's step/loss reports are kept as job events at most once per "
        "this many seconds (every report still reaches the launcher's metrics endpoint); "
        "0 keeps every one.")
    max_report_events: int = Field(
        default=10_000, ge=100, le=10_000_000,
        description="Events a job's own reports (checkpoints, telemetry, anomalies, "
        "over-budget notes) may store, over all its attempts; past it one "
        "`reports_capped` event is stored and nothing more (its newest checkpoint is still "
        "kept in its record). Bounds the state a chatty job can make the daemon keep.")
    backoff_base_seconds: float = Field(
        default=30.0, ge=0,
        description="Seconds before the first retry of a failed or OOM-killed job (while "
        "retries remain); doubled for each further failure.")
    backoff_max_seconds: float = Field(
        default=3600.0, ge=0, description="Upper bound of the retry delay, in seconds.")
    checkpoint_retries: int = Field(
        default=3, ge=0, le=SPEC.max_retries,
        description="Retries of a job that declares a checkpoint_dir and no max_retries "
        "when it is killed by a signal (exit code above 128: SIGKILL, SIGSEGV...) or runs "
        "out of memory: it resumes from its newest checkpoint after the backoff. Other "
        "failures (a plain non-zero exit) are not retried unless the spec says "
        "max_retries.")
    release_timeout_seconds: float = Field(
        default=60.0, ge=0,
        description="A GPU a job left stays out of placement while that job's processes "
        "still hold memory on it (recorded as a leak); their process group is killed at "
        "once and again every this many seconds.")
    mps: bool = Field(
        default=False,
        description="An MPS daemon runs on the node: fractional jobs also get "
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.")


class QuotaLimits(BaseModel):
    """Limits on one user's (or project's) jobs; null: no limit."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_running_gpus: float | None = Field(
        default=None, ge=0, le=SPEC.max_gpus * 64, allow_inf_nan=False,
        description="GPUs its running jobs may hold together (a fraction counts as its "
        "share); a job that would exceed it waits (reason user_limit / project_limit), "
        "one that alone asks for more is refused at submission.")
    max_queued_jobs: int | None = Field(
        default=None, ge=0, le=1_000_000,
        description="Jobs it may have waiting (queued, requeued or held); a submission "
        "past it is refused.")
    max_running_jobs: int | None = Field(
        default=None, ge=0, le=1_000_000,
        description="Jobs it may have running at once, CPU-only (gpus: 0) jobs included; "
        "the next waits (reason user_limit / project_limit).")
    max_gpu_hours: float | None = Field(
        default=None, ge=0, le=1e9, allow_inf_nan=False,
        description="GPU-hours its jobs may hold (allocated, fractions by their share) "
        "within the last quotas.window_seconds; once used up its jobs wait until usage "
        "slides out of the window.")


class UserQuotaLimits(QuotaLimits):
    """Every user's limits; null: no limit. The waiting- and running-job caps are on by
    default: one user cannot flood the queue (3,000 jobs made `queue` take 4 s) nor the
    node's CPUs."""

    max_queued_jobs: int | None = Field(
        default=200, ge=0, le=1_000_000,
        description="Jobs a user may have waiting (queued, requeued or held); a "
        "submission past it is refused.")
    max_running_jobs: int | None = Field(
        default=32, ge=0, le=1_000_000,
        description="Jobs a user may have running at once, CPU-only (gpus: 0) jobs "
        "included (600 of them from one user made the node answer everyone else late); "
        "the next waits (reason user_limit).")


class QuotaConfig(BaseModel):
    """What one user and one project may ask of the node, and what one submission may
    be. The defaults suit a small lab: no limit on GPUs (priority, fair share and
    preemption share them), 200 waiting jobs per user, 100 jobs and 256 KiB per
    submission."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    window_seconds: float = Field(
        default=7 * 86400.0, gt=0, le=366 * 86400.0, allow_inf_nan=False,
        description="The sliding window max_gpu_hours counts in (default 7 days).")
    user: UserQuotaLimits = Field(
        default_factory=UserQuotaLimits,
        description="Every user's limits (users: overrides them per user).")
    project: QuotaLimits = Field(
        default_factory=QuotaLimits,
        description="Every project's limits (projects: overrides them per project).")
    users: dict[str, QuotaLimits] = Field(
        default_factory=dict, max_length=10_000,
        description="Per-user limits; a key given here replaces the same key of `user` "
        "(null: no limit), the others are inherited.")
    projects: dict[str, QuotaLimits] = Field(
        default_factory=dict, max_length=10_000,
        description="Per-project limits, as `users`.")
    max_jobs_per_submission: int = Field(
        default=100, ge=1, le=SPEC.max_jobs,
        description="Jobs one submission may hold; a larger one is refused whole.")
    max_expanded_bytes: int = Field(
        default=2 * 1024 * KIB, ge=KIB, le=256 * 1024 * KIB,
        description="Bytes of one submission once expanded: every job with the "
        "pipeline's defaults (env, command, ...) copied in, as stored. A small YAML whose "
        "shared env is copied into 100 jobs used to add 24 MB of state per submission; "
        "past this it is refused, checked in the reader process before the daemon holds "
        "it.")
    max_finished_jobs_per_user: int = Field(
        default=1000, ge=10, le=10_000_000,
        description="Finished (succeeded, failed, cancelled, timed out) jobs kept per "
        "user; the oldest beyond it are deleted with their events and decisions (not one "
        "a waiting or running job still depends on). Bounds the state one user can make "
        "the daemon keep.")
    finished_retention_seconds: float = Field(
        default=30 * 86400.0, gt=0, le=3660 * 86400.0, allow_inf_nan=False,
        description="Finished jobs older than this (since they finished) are deleted the "
        "same way.")
    max_spec_bytes: int = Field(
        default=256 * KIB, ge=KIB, le=64 * 1024 * KIB,
        description="Bytes of one submission's YAML; a larger one is refused before it "
        "is read.")

    def limits_for(self, kind: str, name: str) -> QuotaLimits:
        """The limits of user or project `name`: the defaults, overridden key by key."""
        base, overrides = (self.user, self.users) if kind == "user" else \
            (self.project, self.projects)
        own = overrides.get(name)
        if own is None:
            return base
        return base.model_copy(update={k: getattr(own, k) for k in own.model_fields_set})

    def key(self, kind: str, name: str, field: str) -> str:
        """The configuration key that sets `field` for user or project `name` (what a
        refusal names)."""
        own = (self.users if kind == "user" else self.projects).get(name)
        if own is not None and field in own.model_fields_set:
            return f"quotas.{kind}s.{name}.{field}"
        return f"quotas.{kind}.{field}"


_USER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}\$?$")


class ProjectMembers(BaseModel):
    """Who may queue jobs against one project (a job's `project:`): members of any of
    `groups` and the users in `users`. Root and admin_group members may use every
    project."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    groups: list[str] = Field(
        default_factory=list, max_length=MAX_LEVEL_GROUPS,
        description="Unix groups whose members may use the project (the caller's groups "
        "as the kernel reports them at connect).")
    users: list[str] = Field(
        default_factory=list, max_length=10_000,
        description="User names that may use the project besides the groups' members.")

    @field_validator("groups")
    @classmethod
    def _groups(cls, v: list[str]) -> list[str]:
        bad = [g for g in v if not _GROUP_NAME.match(g)]
        if bad:
            raise ValueError(f"not group names: {', '.join(repr(g[:40]) for g in bad[:5])}")
        return v

    @field_validator("users")
    @classmethod
    def _users(cls, v: list[str]) -> list[str]:
        bad = [u for u in v if not _USER_NAME.match(u)]
        if bad:
            raise ValueError(f"not user names: {', '.join(repr(u[:40]) for u in bad[:5])}")
        return v

    def describe(self) -> str:
        """Who the members are, in words (for a refusal)."""
        parts = []
        if self.groups:
            parts.append(f"members of group {', '.join(self.groups)}")
        if self.users:
            parts.append(f"user {', '.join(self.users[:10])}"
                         + (f" and {len(self.users) - 10} more" if len(self.users) > 10
                            else ""))
        return " or ".join(parts) or "nobody (no groups, no users)"


class LauncherCoreConfig(BaseModel):
    """The scheduling policy and the engine's protocol timings, shared with replay."""

    model_config = ConfigDict(extra="forbid")

    policy: PolicyConfig = Field(
        default_factory=PolicyConfig,
        description="Ordering, placement, preemption and idle reclaim.")
    engine: EngineConfig = Field(
        default_factory=EngineConfig,
        description="Preemption grace, retry backoff, release barrier, MPS.")
    quotas: QuotaConfig = Field(
        default_factory=QuotaConfig,
        description="Per-user and per-project limits (running GPUs, waiting jobs, "
        "GPU-hours per window) and the size of one submission.")
    projects: dict[str, ProjectMembers] = Field(
        default_factory=dict, max_length=10_000,
        description="Who may use each project (unix groups and/or users). Empty: no "
        "membership is enforced and `project:` is a free label any user may write (its "
        "per-project quotas then bound only what users choose to write). Once any "
        "project is listed, a job may name only a listed project its user is a member "
        "of, or none (the project `default`, open to all unless listed here); anything "
        "else is refused at submission.")
