"""Node and GPU detail: one node's GPUs, and the processes on them with their owners
and where the owner came from (the attribution source)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.common import (
    GPU_SEL,
    NODE,
    OWNER,
    PROC_SEL,
    SIM,
    Board,
    Q,
    gpu_variables,
    new_board,
    single,
    ts,
)
from dashboards.common import grid as table

UID = "gpu-audit-node"
_BY_GPU = "{{instance}} GPU {{gpu}}"
_IDENTITY = "instance, gpu, uuid, user, project, job, namespace, pod, container, slurm_job"
# the attribution source of each identity's allocation row, joined onto its processes
_ALLOC = f'gpu_allocation_info{{{NODE}, gpu=~"$gpu", {SIM}, {OWNER}}}'


def _with_source(metric: str) -> str:
    sel = f"{metric}{{{PROC_SEL}}}"
    joined = f"{sel} * on ({_IDENTITY}) group_left (source) {_ALLOC}"
    # processes with no allocation row (nobody identified) are kept, without a source
    return (f"sum by ({_IDENTITY}, process_name, source) ({joined})"
            f" or sum by ({_IDENTITY}, process_name) ({sel} unless on ({_IDENTITY}) {_ALLOC})")


def build() -> dashboard.Dashboard:
    b = Board(gpu_variables(new_board(
        UID, "GPU node and device detail",
        "One node's GPUs in detail, and every process on them with its user, project, job "
        "and the attribution source that named them.")))
    b.row("Processes")
    b.add(table(
        "Processes by identity", "bytes",
        Q(_with_source("gpu_process_memory_used_bytes")),
        Q(_with_source("gpu_process_sm_utilization_ratio")),
        Q(_with_source("gpu_processes")),
        desc="One row per identity on a GPU (processes of one identity are summed). "
             "source: which attribution source named the job (jobmap, environ, cgroup, "
             "owner, kubelet).",
        hide=["uuid"],
        names={"Value #A": "memory", "Value #B": "SM utilisation", "Value #C": "processes"},
        units={"SM utilisation": "percentunit", "processes": "short"}))
    b.row("Per GPU")
    b.add(
        ts("Utilisation", "percentunit",
           Q(f"gpu_utilization_ratio{{{GPU_SEL}}}", _BY_GPU)),
        ts("Memory used and total", "bytes",
           Q(f"gpu_memory_used_bytes{{{GPU_SEL}}}", _BY_GPU + " used"),
           Q(f"gpu_memory_total_bytes{{{GPU_SEL}}}", _BY_GPU + " total")),
        ts("Memory by identity", "bytes",
           Q(f"sum by (instance, gpu, user, project, job) "
             f"(gpu_process_memory_used_bytes{{{PROC_SEL}}})",
             "GPU {{gpu}} {{user}}/{{project}}/{{job}}"), stack=True),
        ts("Unattributed usage", "percentunit",
           Q(f"gpu_unattributed_utilization_ratio{{{GPU_SEL}}}", _BY_GPU),
           desc="Utilisation no identified process explains."),
        ts("Power and limit", "watt",
           Q(f"gpu_power_usage_watts{{{GPU_SEL}}}", _BY_GPU),
           Q(f"gpu_power_limit_watts{{{GPU_SEL}}}", _BY_GPU + " limit")),
        ts("Temperature", "celsius",
           Q(f"gpu_temperature_celsius{{{GPU_SEL}}}", _BY_GPU),
           Q(f"gpu_memory_temperature_celsius{{{GPU_SEL}}}", _BY_GPU + " memory")),
        ts("SM clock", "hertz", Q(f"gpu_sm_clock_hertz{{{GPU_SEL}}}", _BY_GPU)),
        ts("NVLink traffic", "Bps",
           Q(f"sum by (instance, gpu, direction) "
             f"(rate(gpu_nvlink_data_bytes_total{{{GPU_SEL}}}[$__rate_interval]))",
             _BY_GPU + " {{direction}}")),
    )
    b.add(single("Energy in range", "joule",
                 Q(f"sum(increase(gpu_energy_joules_total{{{GPU_SEL}}}[$__range]))"), w=6),
          single("Processes now", "short", Q(f"sum(gpu_processes{{{PROC_SEL}}})"), w=6))
    return b.builder
