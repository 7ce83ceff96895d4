"""The parameters of the shipped rules: thresholds, windows and `for:` durations.

One params file gives one rendered rule set (alerts/params/production.yaml gives the
committed alerts/rules/*.yaml; alerts/params/fast.yaml gives the short windows the
end-to-end test uses with scenarios played at `--time-scale 60`). A site tunes its rules
by copying a params file and rendering it with `gpu-audit rules render`. Every key is
required: a params file says every number its rules use, so none hides in code.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

from pydantic import AfterValidator, Field

from gpu_audit.config_section import Section
from gpu_audit.yamlload import load_file

_DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
_UNITS = {"h": 3600, "m": 60, "s": 1}


def duration_seconds(text: str) -> int:
    """Seconds in a Prometheus duration limited to h, m and s ("1h30m", "45s", "0s")."""
    match = _DURATION.match(text)
    if not text or match is None:
        raise ValueError(f"not a duration like 1h30m, 10m or 45s: {text!r}")
    hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def _check_duration(text: str) -> str:
    duration_seconds(text)
    return text


def human_duration(text: str) -> str:
    """How a duration reads in an alert's description: "1h30m" -> "1h 30m"."""
    return " ".join(re.findall(r"\d+[hms]", text)) or "0s"


Duration = Annotated[str, AfterValidator(_check_duration)]
Ratio = Annotated[float, Field(ge=0.0, le=1.0)]
Positive = Annotated[float, Field(gt=0.0)]


class Waste(Section):
    idle_utilization: Ratio
    """A GPU whose utilisation is below this counts as idle."""
    idle_window: Duration
    idle_fraction: Ratio
    """GpuHeldIdle: held and idle for at least this share of the idle window..."""
    idle_for: Duration
    """...continuously for this long."""
    low_utilization: Ratio
    """GpuJobLowUtilization: a job's GPUs averaged below this over the window."""
    low_utilization_window: Duration
    low_utilization_for: Duration
    unattributed_memory_bytes: Positive
    unattributed_utilization: Ratio
    unattributed_for: Duration


class Leak(Section):
    window: Duration
    """The trend window (deriv and the extrapolation to exhaustion)."""
    recent_window: Duration
    """Still growing over this recent window: a warm-up that has levelled off is no leak."""
    min_age: Duration
    """The identity's series existed this long ago: its warm-up is behind it."""
    min_growth_bytes_per_second: Positive
    horizon: Duration
    """Fire when the GPU is predicted to run out of memory within this."""
    for_: Duration = Field(alias="for")


class Hardware(Section):
    critical_xids: list[Annotated[int, Field(ge=1)]] = Field(min_length=1)
    """XID codes that mean broken hardware or a GPU that needs a reset (critical);
    other codes (usually application faults such as 13 and 31) are warnings."""
    xid_window: Duration
    ecc_for: Duration
    remap_for: Duration
    thermal_reasons: list[str] = Field(min_length=1)
    power_reasons: list[str] = Field(min_length=1)
    throttle_for: Duration
    temperature_celsius: float
    temperature_for: Duration
    lost_for: Duration
    owner_lookback: Duration = "15m"
    """A lost GPU's alert names who held it: the owners its exporter last reported on it
    (`gpu_allocation_info`) within this long before."""
    missing_lookback: Duration
    missing_for: Duration


class Pipeline(Section):
    exporter_down_for: Duration
    exporter_absent_for: Duration
    snapshot_stale_seconds: Positive
    snapshot_stale_for: Duration
    spool_for: Duration
    lag_seconds: Positive
    lag_window: Duration
    lag_for: Duration
    dead_letter_window: Duration
    dropped_window: Duration
    sink_down_for: Duration
    sink_blocked_for: Duration
    conservation_for: Duration


class Params(Section):
    include_simulated: bool
    """Count series with simulated="true" (the scenario simulator's); production: false."""
    scrape_jobs: str = Field(min_length=1)
    """Regex of the Prometheus scrape job(s) that scrape gpu-audit (for `up`)."""
    recording_interval: Duration
    """Evaluation interval of the recording rules: GPU-seconds over a range R are
    sum_over_time(RULE[R]) * this interval, for series that come and go."""
    alerting_interval: Duration
    runbook_base_url: str = Field(min_length=1)
    waste: Waste
    leak: Leak
    hardware: Hardware
    pipeline: Pipeline


def load_params(path: Path) -> Params:
    """A params file, validated; ConfigError naming every problem (with its line)."""
    return load_file(Params, path)
