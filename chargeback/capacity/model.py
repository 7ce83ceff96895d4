"""The values of a capacity report: what goes in (bins of fleet figures, waits) and
what comes out (per month and model figures, waits summary, forecast, what-if).

Seconds in the inputs (what sources add up), hours and GPUs in the outputs. A GPU count
"per bin" is the bin's GPU-seconds divided by its length: the mean number of GPUs in
that state during the bin.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

ALL = "all models"


@dataclass(slots=True)
class Figures:
    """One GPU model over one bin (or summed over several), in GPU-seconds.

    installed: up + down (every GPU the records name, for the time they cover);
    down: lost or drained (not up); allocated: held by a job (see the bin's basis);
    busy: utilisation-weighted time; held_idle: allocated while under 5 % utilisation;
    free: up and not allocated.
    """

    installed: float = 0.0
    down: float = 0.0
    allocated: float = 0.0
    busy: float = 0.0
    held_idle: float = 0.0

    @property
    def free(self) -> float:
        return max(0.0, self.installed - self.down - self.allocated)

    def add(self, other: Figures) -> None:
        self.installed += other.installed
        self.down += other.down
        self.allocated += other.allocated
        self.busy += other.busy
        self.held_idle += other.held_idle


@dataclass(slots=True)
class Bin:
    """[start, start + seconds): each GPU model's figures, or None when the source had
    nothing for the bin (not known: left out of means and percentiles, never 0)."""

    start: datetime
    seconds: float
    models: dict[str, Figures] | None


@dataclass(frozen=True, slots=True)
class Wait:
    """One stretch a job waited for GPUs: from `queued` (Unix s) to `started` (None:
    still waiting at the end of what was read). `gpus`: GPUs it asked for (a fraction
    for a shared GPU). `deadline`: when it had to have ended, if it had one."""

    source: str  # "launcher" | "slurm"
    job: str
    gpus: float
    queued: float
    started: float | None


@dataclass(slots=True)
class ModelMonth:
    """One GPU model (or ALL) over one month (or the whole period: month "period")."""

    month: str
    model: str
    hours: float  # bin hours with data
    installed_gpu_hours: float
    down_gpu_hours: float
    allocated_gpu_hours: float
    busy_gpu_hours: float
    held_idle_gpu_hours: float
    free_gpu_hours: float
    installed_gpus: float  # mean
    allocated_gpus_mean: float
    allocated_gpus_p95: float
    allocated_gpus_p99: float
    hours_at_90pct: float  # bin hours with allocated >= 90 % of installed
    allocated_pct: float  # of installed GPU-hours
    allocated_pct_p95: float  # p95 over bins of allocated / installed
    busy_pct: float
    held_idle_pct: float
    down_pct: float


@dataclass(slots=True)
class WaitSummary:
    known: bool
    sources: list[str]
    jobs: int = 0
    never_started: int = 0
    queued_gpu_hours: float = 0.0
    p50_wait_h: float = 0.0
    p95_wait_h: float = 0.0
    while_idle_gpu_hours: float = 0.0  # the part of queued demand GPUs held idle could serve
    while_idle_share: float = 0.0
    note: str = ""


@dataclass(slots=True)
class Forecast:
    """A linear fit of daily mean allocated GPUs (site total), optionally with a
    weekday term, and when it reaches installed capacity."""

    ok: bool
    message: str
    days: int = 0
    horizon_days: int = 0
    slope_gpus_per_day: float = 0.0
    slope_low: float = 0.0  # 90 % interval of the slope
    slope_high: float = 0.0
    intercept: float = 0.0
    seasonal: bool = False
    weekday_effect: list[float] = field(default_factory=list)  # Mon..Sun, GPUs
    # with hourly bins: mean allocated GPUs per UTC hour of day minus the overall mean
    # (described, not fitted: the trend is of daily means)
    hour_effect: list[float] = field(default_factory=list)
    capacity_gpus: float = 0.0
    reach_date: str | None = None  # expected date the fit reaches capacity
    reach_earliest: str | None = None  # upper 90 % prediction bound reaches it
    reach_latest: str | None = None  # lower bound reaches it (None: not in the horizon)
    residual_sd: float = 0.0
    # (date, fitted, low, high) for the chart, over the data and the horizon
    line: list[tuple[str, float, float, float]] = field(default_factory=list)


@dataclass(slots=True)
class WhatIf:
    """One replay of the period's queue with changed capacity or policy."""

    name: str  # "baseline", "+8 GPUs", "idle reclaim"
    gpus: int
    p95_wait_h: float
    deadline_jobs: int
    deadline_met: int


@dataclass(slots=True)
class Capacity:
    start: datetime
    end: datetime
    source: str
    bin_seconds: float
    basis: str  # what "allocated" means for this source
    rows: list[ModelMonth]
    waits: WaitSummary
    forecast: Forecast
    whatif: list[WhatIf] = field(default_factory=list)
    whatif_note: str = ""
    sentence: str = ""
    notes: list[str] = field(default_factory=list)
    bins_missing: int = 0
    # per bin, site total: (start ISO, installed, down, allocated, busy, held idle) GPUs
    series: list[tuple[str, float, float, float, float, float]] = field(default_factory=list)
    daily: list[tuple[str, float, float]] = field(default_factory=list)  # (day, alloc, inst)
    # figures the source cannot give ("busy", "held_idle", "down"): written empty in the
    # CSV, "not known" in the tables and the sentence, never a 0 that is not zero
    not_known: list[str] = field(default_factory=list)
