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
    """Priority = w_urgency*urgency + w_tier*tier + w_age*age_hours
    - w_fairshare_user*decayed measured GPU-hours of the user
    - w_fairshare_project*decayed measured GPU-hours of the project."""

    model_config = ConfigDict(extra="forbid")

    name: PolicyName = "priority"
    w_urgency: float = Field(default=1000.0, ge=0)
    w_tier: float = Field(default=500.0, ge=0)
    w_age: float = Field(default=20.0, ge=0, description="per hour waited")
    w_fairshare_user: float = Field(default=10.0, ge=0, description="per decayed GPU-hour")
    w_fairshare_project: float = Field(default=2.0, ge=0, description="per decayed GPU-hour")
    half_life_seconds: float = Field(default=7 * 86400.0, gt=0)
    user_tiers: dict[str, int] = Field(default_factory=dict)
    default_tier: int = 0
    # preemption (policy "priority" only)
    preemption: bool = True
    preempt_wait_seconds: float = Field(default=300.0, ge=0)
    preempt_min_runtime_seconds: float = Field(default=120.0, ge=0)
    preempt_min_priority_gap: float = Field(default=500.0, ge=0)
    # idle reclaim (policy "priority" only): a running job whose MEASURED utilisation stays
    # under `idle_util_threshold` for `idle_reclaim_seconds` while work waits gives way
    idle_reclaim: bool = True
    idle_util_threshold: float = Field(default=0.05, ge=0, le=1)
    idle_reclaim_seconds: float = Field(default=900.0, ge=0)
    idle_share_max_fraction: float = Field(
        default=0.5, gt=0, lt=1,
        description="an idle one-GPU job that cannot checkpoint is re-admitted as a share "
                    "of its GPU (its measured memory) when that share is at most this")
    # placement
    idle_memory_bytes: int = Field(default=1 << 30, ge=0,
                                   description="a GPU using at most this much is free")
    max_temperature_c: float = 85.0
    skip_throttling: bool = True
    skip_recent_xid: bool = True


class EngineConfig(BaseModel):
    """Protocol timings and limits of the state machine."""

    model_config = ConfigDict(extra="forbid")

    preempt_grace_seconds: float = Field(default=120.0, gt=0)
    telemetry_event_interval_seconds: float = Field(
        default=60.0, ge=0,
        description="a job's step/loss reports are kept as job events at most this often "
        "(every report still reaches the launcher's metrics endpoint); 0 keeps every one")
    backoff_base_seconds: float = Field(default=30.0, ge=0)
    backoff_max_seconds: float = Field(default=3600.0, ge=0)
    release_timeout_seconds: float = Field(
        default=60.0, ge=0,
        description="how long a GPU may still show the previous job's memory before it is a leak")
    mps: bool = False
    default_gpu_memory_bytes: int | None = Field(
        default=None, description="memory assumed for a whole-GPU job that names none "
                                  "(None: the whole GPU)")


class LauncherCoreConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    policy: PolicyConfig = Field(default_factory=PolicyConfig)
    engine: EngineConfig = Field(default_factory=EngineConfig)
