"""The launcher core's settings: the scheduling policy and the engine's protocol timings.

The daemon's own settings (socket, admin group, paths) belong to the app layer and wrap
`LauncherCoreConfig`; replay builds the same model for every policy it compares, so the
baselines run the same code with a different `policy.name`.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PolicyName = Literal["priority", "fifo-exclusive", "first-fit"]


class PolicyConfig(BaseModel):
    """How waiting jobs are ordered, placed and allowed to preempt (launcher/scheduler.py).
    Policy `priority` ranks by w_urgency*urgency + w_tier*tier + w_age*hours waited
    - w_fairshare_user*decayed measured GPU-hours of the user
    - w_fairshare_project*decayed measured GPU-hours of the project."""

    model_config = ConfigDict(extra="forbid")

    name: PolicyName = Field(
        default="priority",
        description="Scheduling policy. `priority`: highest priority first, backfilling, "
        "preemption and idle reclaim; `fifo-exclusive`: submission order, whole GPUs only, "
        "the first job that does not fit blocks the rest, no preemption; `first-fit`: "
        "submission order, every job that fits starts, no preemption. The weights and "
        "preemption keys below apply to `priority` only.")
    w_urgency: float = Field(
        default=1000.0, ge=0,
        description="Priority points per urgency level of the job spec (low 0, normal 1, "
        "high 2, urgent 3).")
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
        description="Priority points a victim must be below the waiting job (not required "
        "of an idle-reclaim victim).")
    # idle reclaim (policy "priority" only): a running job whose MEASURED utilisation stays
    # under `idle_util_threshold` for `idle_reclaim_seconds` while work waits gives way
    idle_reclaim: bool = Field(
        default=True,
        description="Make running jobs measured idle for `idle_reclaim_seconds` give way "
        "while work waits: one that checkpoints becomes the preferred victim of a waiter "
        "of higher or equal priority; a one-GPU job that cannot is re-admitted as a share "
        "of its GPU (policy `priority` only).")
    idle_util_threshold: float = Field(
        default=0.05, ge=0, le=1,
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
    backoff_base_seconds: float = Field(
        default=30.0, ge=0,
        description="Seconds before the first retry of a failed or OOM-killed job (while "
        "retries remain); doubled for each further failure.")
    backoff_max_seconds: float = Field(
        default=3600.0, ge=0, description="Upper bound of the retry delay, in seconds.")
    release_timeout_seconds: float = Field(
        default=60.0, ge=0,
        description="A GPU a job left stays out of placement while that job's processes "
        "still hold memory on it (recorded as a leak); their process group is killed at "
        "once and again every this many seconds.")
    mps: bool = Field(
        default=False,
        description="An MPS daemon runs on the node: fractional jobs also get "
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE and CUDA_MPS_PINNED_DEVICE_MEM_LIMIT.")


class LauncherCoreConfig(BaseModel):
    """The scheduling policy and the engine's protocol timings, shared with replay."""

    model_config = ConfigDict(extra="forbid")

    policy: PolicyConfig = Field(
        default_factory=PolicyConfig,
        description="Ordering, placement, preemption and idle reclaim.")
    engine: EngineConfig = Field(
        default_factory=EngineConfig,
        description="Preemption grace, retry backoff, release barrier, MPS.")
