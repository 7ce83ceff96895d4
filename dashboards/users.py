"""Users and projects: GPU-hours, utilisation-weighted GPU-hours, energy, efficiency and
the top consumers, from the user_project_job:* recording rules (cheap over 30 days).

`RULE_QUERIES` lists the panels' queries so bench/bench_dashboard_rules.py can time each
against its raw expansion (the rule expressions inlined as subqueries).
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.common import (
    OWNER,
    Board,
    Q,
    datasource_variable,
    hours_over_range,
    new_board,
    query_variable,
    single,
    ts,
)
from dashboards.common import grid as table

UID = "gpu-audit-users"
HELD = f"user_project_job:gpus_held:sum{{{OWNER}}}"
BUSY = f"user_project_job:gpus_busy:sum{{{OWNER}}}"
POWER = f"user_project_job:gpu_power_watts:sum{{{OWNER}}}"
MEMORY = f"user_project_job:gpu_memory_used_bytes:sum{{{OWNER}}}"
IDLE = f"user_project_job:gpus_idle_held:sum{{{OWNER}}}"
_WHO = "user, project"


def _gpu_hours(rule: str, by: str = _WHO) -> str:
    return hours_over_range(rule, by)


def _kwh(by: str = _WHO) -> str:
    return f"{hours_over_range(POWER, by)} / 1000"


def _efficiency(by: str = _WHO) -> str:
    return f"{_gpu_hours(BUSY, by)} / {_gpu_hours(HELD, by)}"


def _variables(b: dashboard.Dashboard) -> dashboard.Dashboard:
    owners = "user_project_job:gpus_held:sum"
    return (b.with_variable(datasource_variable())
            .with_variable(query_variable("user", "User", f"label_values({owners}, user)"))
            .with_variable(query_variable(
                "project", "Project", f'label_values({owners}{{user=~"$user"}}, project)'))
            .with_variable(query_variable(
                "job", "Job",
                f'label_values({owners}{{user=~"$user", project=~"$project"}}, job)')))


def build() -> dashboard.Dashboard:
    b = Board(_variables(new_board(
        UID, "GPU usage by user and project",
        "GPU-hours held, utilisation-weighted (busy) GPU-hours, energy and efficiency per "
        "user, project and job over the dashboard's time range, from the recording rules. "
        "Simulated data is excluded by the production rules.", time_from="now-30d")))
    b.row("Totals over the time range")
    b.add(
        single("GPU-hours held", "h", Q(f"sum({_gpu_hours(HELD, 'user')})"), w=6),
        single("Busy GPU-hours", "h", Q(f"sum({_gpu_hours(BUSY, 'user')})"), w=6,
               desc="Utilisation-weighted: GPU-hours x SM utilisation."),
        single("Energy", "kwatth", Q(f"sum({_kwh('user')})"), w=6),
        single("Efficiency", "percentunit",
               Q(f"sum({_gpu_hours(BUSY, 'user')}) / sum({_gpu_hours(HELD, 'user')})"), w=6,
               desc="Busy GPU-hours / GPU-hours held.", decimals=1),
    )
    b.row("Top consumers")
    b.add(table(
        "Top consumers (user, project)", "h",
        Q(f"sort_desc({_gpu_hours(HELD)})"),
        Q(_gpu_hours(BUSY)),
        Q(_kwh()),
        Q(_efficiency()),
        Q(_gpu_hours(IDLE)),
        names={"Value #A": "GPU-hours", "Value #B": "busy GPU-hours", "Value #C": "energy",
               "Value #D": "efficiency", "Value #E": "idle-held GPU-hours"},
        units={"energy": "kwatth", "efficiency": "percentunit"}))
    b.add(table(
        "By job", "h",
        Q(f"sort_desc({_gpu_hours(HELD, 'user, project, job')})"),
        Q(_gpu_hours(BUSY, "user, project, job")),
        Q(_kwh("user, project, job")),
        Q(_efficiency("user, project, job")),
        names={"Value #A": "GPU-hours", "Value #B": "busy GPU-hours", "Value #C": "energy",
               "Value #D": "efficiency"},
        units={"energy": "kwatth", "efficiency": "percentunit"}))
    b.row("Over time")
    b.add(
        ts("GPUs held by user", "short", Q(f"sum by (user) ({HELD})", "{{user}}"), stack=True),
        ts("Busy GPUs by project", "short", Q(f"sum by (project) ({BUSY})", "{{project}}"),
           stack=True, desc="Utilisation-weighted GPUs (sum of SM utilisation ratios)."),
        ts("Power by project", "watt", Q(f"sum by (project) ({POWER})", "{{project}}"),
           stack=True, desc="Each GPU's power split over its holders by SM utilisation."),
        ts("GPU memory by user", "bytes", Q(f"sum by (user) ({MEMORY})", "{{user}}"),
           stack=True),
        ts("Efficiency by project", "percentunit",
           Q(f"sum by (project) ({BUSY}) / sum by (project) ({HELD})", "{{project}}")),
        ts("Idle-held GPUs by project", "short",
           Q(f"sum by (project) ({IDLE})", "{{project}}"), stack=True),
    )
    return b.builder
