"""Fleet overview: how many GPUs, how busy, how hot, how much power, who holds them."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.common import (
    GPU_SEL,
    NODE,
    SIM,
    Board,
    Q,
    detail_link,
    gpu_variables,
    new_board,
    single,
    ts,
)
from dashboards.common import grid as table

UID = "gpu-audit-fleet"


def build() -> dashboard.Dashboard:
    b = Board(gpu_variables(new_board(
        UID, "GPU fleet overview",
        "Every GPU of every node: how many are up, held and busy, and how hot and hungry "
        "they are. Fleet totals come from the fleet:* recording rules.")))
    b.row("Fleet now")
    b.add(
        single("GPUs up", "short", Q("fleet:gpus:count")),
        single("GPUs down", "short", Q(f"count(gpu_up{{{GPU_SEL}}} == 0)"),
               desc="GPUs the exporter could not read in its latest cycle (lost, timed out)."),
        single("GPUs held", "short", Q("fleet:gpus_held:sum"),
               desc="GPUs on which an identified job holds memory."),
        single("Idle but held", "short", Q("fleet:gpus_idle_held:sum"),
               desc="Held GPUs at near-zero utilisation: the waste to chase."),
        single("Fleet utilisation", "percentunit",
               Q("fleet:gpus_busy:sum / fleet:gpus:count"), decimals=1),
        single("Fleet power", "watt", Q("fleet:gpu_power_watts:sum")),
    )
    b.row("Utilisation and memory")
    by_gpu = "{{instance}} GPU {{gpu}}"
    b.add(
        ts("Utilisation by GPU", "percentunit",
           Q(f"avg by (instance, gpu) (gpu_utilization_ratio{{{GPU_SEL}}})", by_gpu))
        .data_links([detail_link("GPU detail", "gpu-audit-node",
                                 "var-node=${__field.labels.instance}"
                                 "&var-gpu=${__field.labels.gpu}")]),
        ts("Memory used by node", "bytes",
           Q(f"sum by (instance) (gpu_memory_used_bytes{{{GPU_SEL}}})", "{{instance}} used"),
           Q(f"sum by (instance) (gpu_memory_total_bytes{{{GPU_SEL}}})", "{{instance}} total")),
        ts("GPUs held and busy (fleet)", "short",
           Q("fleet:gpus:count", "up"), Q("fleet:gpus_held:sum", "held"),
           Q("fleet:gpus_busy:sum", "busy (utilisation-weighted)"),
           Q("fleet:gpus_idle_held:sum", "idle but held")),
        ts("Power by node", "watt",
           Q(f"sum by (instance) (gpu_power_usage_watts{{{GPU_SEL}}})", "{{instance}}")),
    )
    b.row("Health and inventory")
    b.add(
        ts("Hottest GPU by node", "celsius",
           Q(f"max by (instance) (gpu_temperature_celsius{{{GPU_SEL}}})", "{{instance}}")),
        ts("Unattributed memory by node", "bytes",
           Q(f"sum by (instance) (gpu_unattributed_memory_bytes{{{GPU_SEL}}})", "{{instance}}"),
           desc="GPU memory no identified process explains."),
        table("GPU inventory", "short",
              Q(f'max by (instance, gpu, uuid, name, driver_version, cuda_version, '
                f'mig_mode, backend) (gpu_info{{{NODE}, gpu=~"$gpu", {SIM}}})'),
              hide=["Value"]),
    )
    return b.builder
