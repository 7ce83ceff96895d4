"""Waste and leaks: GPUs held at near-zero utilisation, jobs with low utilisation, GPU
memory growing towards exhaustion, usage nobody is attributed to, and the GPU-hours
wasted over the range."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.common import (
    EVALS,
    GPU_SEL,
    NODE,
    OWNER,
    PROC_SEL,
    RANGE_HOURS,
    SIM,
    Board,
    Q,
    gpu_variables,
    hours_over_range,
    new_board,
    single,
    ts,
)
from dashboards.common import grid as table

UID = "gpu-audit-waste"
_RULE_SEL = f'{NODE}, gpu=~"$gpu", {OWNER}'
IDLE_HELD = f"gpu:gpu_idle_held:bool{{{_RULE_SEL}}}"
HELD = f"gpu:gpu_held:bool{{{_RULE_SEL}}}"
LOW_UTILISATION = 0.2
# Leak suspects are the alert rules' (alerts/recording.py leak_rules): memory growing over
# an hour by at least 1% of the GPU's memory an hour, still setting new peaks, past the
# process's warm-up. The panels read those recording rules, so what the dashboard lists
# is what GpuMemoryLeak judges (a fixed bytes-per-second threshold here flagged jobs
# ramping up after start and noisy plateaus).
_LEAK_SEL = f"{_RULE_SEL}, {SIM}"
LEAK_GROWTH = f"gpu:process_memory_growth_bytes_per_second:leak{{{_LEAK_SEL}}}"
LEAK_EXHAUSTION = f"gpu:memory_exhaustion_seconds:leak{{{_LEAK_SEL}}}"


def build() -> dashboard.Dashboard:
    b = Board(gpu_variables(new_board(
        UID, "GPU waste and leaks",
        "Where GPU time and memory go to waste: idle-held GPUs, low-utilisation jobs, "
        "memory leaks with the predicted time until the GPU is full, and usage nobody is "
        "attributed to.", time_from="now-24h")))
    b.row("Wasted GPU-hours over the time range")
    b.add(
        single("Idle-held GPU-hours", "h",
               Q(f"sum(sum_over_time(fleet:gpus_idle_held:sum[$__range])) / {EVALS}"
                 f" * {RANGE_HOURS}"), w=8,
               desc="GPU-hours held by an identified job at near-zero utilisation."),
        single("Held but unused GPU-hours", "h",
               Q(f"(sum(sum_over_time(fleet:gpus_held:sum[$__range]))"
                 f" - sum(sum_over_time(fleet:gpus_busy:sum[$__range]))) / {EVALS}"
                 f" * {RANGE_HOURS}"), w=8,
               desc="GPU-hours held minus utilisation-weighted GPU-hours (fleet)."),
        single("Unattributed memory now", "bytes",
               Q("fleet:gpu_unattributed_memory_bytes:sum"), w=8),
    )
    b.row("Idle-held GPUs")
    b.add(
        table("Idle-held GPUs (hours over the range)", "h",
              Q(f"{hours_over_range(IDLE_HELD, 'instance, gpu, user, project, job')} > 0"),
              desc="GPUs an identified job held at near-zero utilisation, with the hours.",
              empty="No GPU held idle in the time range"),
        ts("Idle-held GPUs now", "short",
           Q(f"sum by (instance, gpu, user, project, job) ({IDLE_HELD}) > 0",
             "{{instance}} GPU {{gpu}} {{user}}/{{job}}"), empty="No GPU held idle"),
        ts("Idle-held GPUs by project", "short",
           Q(f"sum by (project) (user_project_job:gpus_idle_held:sum{{{OWNER}}})",
             "{{project}}"), stack=True),
        table("Low-utilisation jobs", "percentunit",
              Q(f"(sum by (user, project, job) "
                f"(avg_over_time(user_project_job:gpus_busy:sum{{{OWNER}}}[$__range]))"
                f" / sum by (user, project, job) "
                f"(avg_over_time(user_project_job:gpus_held:sum{{{OWNER}}}[$__range])))"
                f" < {LOW_UTILISATION}"),
              desc=f"Jobs whose average utilisation over the range is below "
                   f"{LOW_UTILISATION:.0%} of the GPUs they hold.",
              names={"Value": "utilisation"}),
    )
    b.row("Leak suspects")
    b.add(
        table("Leak suspects: predicted time until the GPU is full", "s",
              Q(LEAK_EXHAUSTION),
              Q(LEAK_GROWTH),
              desc="Processes whose GPU memory has grown over the last hour by at least 1% "
                   "of the GPU's memory an hour and keeps reaching new peaks, ignoring their "
                   "first minutes (the leak recording rules GpuMemoryLeak also uses), with "
                   "the GPU's free memory divided by that growth.",
              hide=["uuid"],
              names={"Value #A": "time to full", "Value #B": "growth"},
              units={"growth": "Bps"}, empty="No leak suspect"),
        ts("Memory of leak suspects", "bytes",
           Q(f"gpu_process_memory_used_bytes{{{PROC_SEL}}} and {LEAK_GROWTH}",
             "{{instance}} GPU {{gpu}} {{user}}/{{job}} {{process_name}}"),
           empty="No leak suspect"),
    )
    b.row("Unattributed usage")
    b.add(
        ts("Unattributed memory", "bytes",
           Q(f"gpu_unattributed_memory_bytes{{{GPU_SEL}}}", "{{instance}} GPU {{gpu}}")),
        ts("Unattributed utilisation", "percentunit",
           Q(f"gpu_unattributed_utilization_ratio{{{GPU_SEL}}}", "{{instance}} GPU {{gpu}}")),
        ts("GPUs held and held-idle (by GPU)", "short",
           Q(f"sum by (instance, gpu) ({HELD})", "{{instance}} GPU {{gpu}} held"),
           w=24),
    )
    return b.builder
