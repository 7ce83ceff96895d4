"""Recording rules: what dashboards and chargeback need cheaply.

Names, labels and meanings follow the recording-rule contract shared with the
dashboards (docs/ALERTS.md lists them). Per-GPU and per-identity series exist only while
the identity holds the GPU, so usage over a range R is
`sum_over_time(RULE[R]) * recording_interval` (GPU-seconds); the fleet series are always
present (0 when nothing matches), so for them `avg_over_time(RULE[R]) * R` works too.
"""

from __future__ import annotations

from typing import Any

from alerts.params import Params, duration_seconds, format_duration
from alerts.promql import num, sel
from gpu_audit.rules import GPU, GPU_IDENTITY, IDENTITY, bill_rules, power_split


def _rule(record: str, expr: str) -> dict[str, Any]:
    return {"record": record, "expr": expr}


def recording_rules(p: Params) -> list[dict[str, Any]]:
    """The recording rules in evaluation order (later rules read earlier ones). The rules
    a bill reads are gpu_audit.rules' (chargeback evaluates the same expressions in raw
    mode); the owners' sums and the fleet's are built here."""
    proc_mem = f"gpu_process_memory_used_bytes{sel(p)}"
    proc_sm = f"gpu_process_sm_utilization_ratio{sel(p)}"
    util = f"gpu_utilization_ratio{sel(p)}"
    power = f"gpu_power_usage_watts{sel(p)}"
    bill = bill_rules(sel(p), p.waste.idle_utilization)

    def from_bill(*records: str) -> list[dict[str, Any]]:
        return [_rule(r, bill[r]) for r in records]

    return [
        *from_bill("gpu:gpu_held:bool", "gpu:gpu_idle_held:bool"),
        _rule("user_project_job:gpus_held:sum",
              f"sum by ({IDENTITY}) (gpu:gpu_held:bool)"),
        _rule("user_project_job:gpus_busy:sum",
              f"sum by ({IDENTITY}) ({proc_sm})"),
        _rule("user_project_job:gpu_memory_used_bytes:sum",
              f"sum by ({IDENTITY}) ({proc_mem})"),
        # each GPU's power split over the identities holding it (the one energy rule,
        # gpu_audit.rules.power_split)
        _rule("user_project_job:gpu_power_watts:sum",
              f"sum by ({IDENTITY}) (\n"
              f"  (\n"
              f"{power_split(sel(p))}"
              f"    (gpu:gpu_held:bool / on (instance, uuid) group_left ()\n"
              f"      count by (instance, uuid) (gpu:gpu_held:bool))\n"
              f"  )\n"
              f"  * on (instance, uuid) group_left () max by (instance, uuid) ({power})\n"
              f")"),
        _rule("user_project_job:gpus_idle_held:sum",
              f"sum by ({IDENTITY}) (gpu:gpu_idle_held:bool)"),
        _rule("gpu:allocation_utilization_ratio",
              f"max by ({GPU_IDENTITY}) (gpu_allocation_info{sel(p)})\n"
              f"  * on (instance, uuid) group_left () max by (instance, uuid) ({util})"),
        # per GPU and identity, and per GPU: what chargeback reads
        *from_bill("gpu:gpu_held:weight", "gpu:gpu_allocated:weight", "gpu:gpu_held:share",
                   "gpu:gpu_busy:sum", "gpu:gpu_power_watts:share", "gpu:gpu_up:max",
                   "gpu:gpu_utilization_ratio:max", "gpu:gpu_power_watts:max"),
        _rule("fleet:gpus:count",
              f"count(gpu_up{sel(p)} == 1) or vector(0)"),
        _rule("fleet:gpus_held:sum",
              f"count(max by ({GPU}) (gpu:gpu_held:bool)) or vector(0)"),
        _rule("fleet:gpus_busy:sum",
              f"sum({util}) or vector(0)"),
        _rule("fleet:gpus_idle_held:sum",
              f"sum(max by ({GPU}) (gpu:gpu_idle_held:bool)) or vector(0)"),
        _rule("fleet:gpu_power_watts:sum",
              f"sum({power}) or vector(0)"),
        _rule("fleet:gpu_unattributed_memory_bytes:sum",
              f"sum(gpu_unattributed_memory_bytes{sel(p)}) or vector(0)"),
        *leak_rules(p),
    ]


LEAK_GROWTH = "gpu:process_memory_growth_bytes_per_second:leak"
LEAK_EXHAUSTION = "gpu:memory_exhaustion_seconds:leak"


def leak_rules(p: Params) -> list[dict[str, Any]]:
    """The leak suspects the waste dashboard reads: `LEAK_GROWTH` from
    `leak_growth(p)` and `LEAK_EXHAUSTION`, the seconds until the GPU's free memory is
    gone at that rate. GpuMemoryLeak evaluates the same expressions itself (a rule of
    another group would be read one evaluation late, or early)."""
    return [_rule(LEAK_GROWTH, leak_growth(p)),
            _rule(LEAK_EXHAUSTION, f"{gpu_free_memory(p)}\n"
                                   f"  / on (instance, uuid) group_right () {LEAK_GROWTH}")]


def gpu_free_memory(p: Params) -> str:
    """Each GPU's free memory (total - used), one series per (instance, uuid)."""
    return (f"(max by (instance, uuid) (gpu_memory_total_bytes{sel(p)})"
            f" - max by (instance, uuid) (gpu_memory_used_bytes{sel(p)}))")


def leak_growth(p: Params) -> str:
    """Leak suspects with their growth rate (bytes per second).

    A suspect is a process identity on a GPU (the per-process series, one per identity
    and process name) whose memory
    - grew over `leak.window` (linear fit) by at least `min_growth_ratio_per_hour` of
      its GPU's memory an hour: the threshold follows the GPU's size;
    - keeps growing: it is now above its own peak from before `recent_window` by at
      least that rate's worth over `recent_window` (a job that ramped up and levelled
      off sets no new peak, and noise around a plateau does not clear the margin);
    - existed `warmup` + `window` ago, so the trend window starts after the process's
      first minutes (loading a model, allocator warm-up).
    """
    lk = p.leak
    proc = f"gpu_process_memory_used_bytes{sel(p)}"
    total = f"max by (instance, uuid) (gpu_memory_total_bytes{sel(p)})"
    per_second = f"{num(lk.min_growth_ratio_per_hour)} / 3600"
    recent = duration_seconds(lk.recent_window)
    age = format_duration(duration_seconds(lk.warmup) + duration_seconds(lk.window))
    return (f"deriv({proc}[{lk.window}])\n"
            f"  > on (instance, uuid) group_left () ({total} * {per_second})\n"
            f"and\n"
            f"  {proc} - max_over_time({proc}[{lk.window}] offset {lk.recent_window})\n"
            f"  > on (instance, uuid) group_left () ({total} * {per_second} * {recent})\n"
            f"and\n"
            f"  {proc} offset {age}")
