"""Hardware health: the hardware alerts firing, lost and missing GPUs with their owners,
temperatures, throttling, XID errors, ECC and remapped rows (whose work each failing GPU
hit: the owner columns come from gpu_owner_info, kept while a GPU is down)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.common import (
    GPU_SEL,
    NODE,
    SIM,
    Board,
    Q,
    firing_alerts,
    gpu_variables,
    new_board,
    ts,
    with_owner,
)
from dashboards.common import grid as table

UID = "gpu-audit-hardware"
_BY_GPU = "{{instance}} GPU {{gpu}}"
THROTTLE_REASONS = ("sw_thermal_slowdown", "hw_thermal_slowdown", "hw_slowdown",
                    "hw_power_brake_slowdown", "sw_power_cap")


def build() -> dashboard.Dashboard:
    b = Board(gpu_variables(new_board(
        UID, "GPU hardware health",
        "Temperatures and throttling, XID errors, ECC errors, remapped rows, and GPUs that "
        "are lost or missing compared with the last day, each with the user, project and "
        "job whose work it hit.", time_from="now-24h")))
    b.row("Hardware alerts")
    b.add(table("Firing hardware alerts", "short", firing_alerts("hardware"),
                hide=["Value", "category"], h=6, empty="No hardware alert firing",
                desc="Hardware alerts firing now, with the GPU and its owner "
                     "(docs/runbooks.md says what to do and what to tell the owner)."))
    b.row("Lost and missing GPUs")
    b.add(
        table("Lost GPUs (gpu_up == 0) and their owners", "short",
              Q(with_owner(f"max by (instance, gpu, uuid) (gpu_up{{{GPU_SEL}}}) == 0")),
              names={"Value": "up"}, w=12, h=7, empty="No GPU lost",
              desc="GPUs that cannot be read, or that are no longer enumerated but are in "
                   "the exporter's GPU inventory, with who held them when last read."),
        ts("GPUs missing compared with the last day", "short",
           Q(f"count by (instance) (max_over_time(gpu_up{{{GPU_SEL}}}[1d]))"
             f" - (count by (instance) (gpu_up{{{GPU_SEL}}} == 1) or count by (instance) "
             f"(max_over_time(gpu_up{{{GPU_SEL}}}[1d])) * 0)", "{{instance}}"),
           desc="GPUs seen in the last day that are not up now.", h=7),
    )
    b.row("Temperature and throttling")
    reasons = "|".join(THROTTLE_REASONS)
    b.add(
        ts("GPU temperature", "celsius", Q(f"gpu_temperature_celsius{{{GPU_SEL}}}", _BY_GPU)),
        ts("Memory (HBM) temperature", "celsius",
           Q(f"gpu_memory_temperature_celsius{{{GPU_SEL}}}", _BY_GPU)),
        ts("Throttle reasons active", "short",
           Q(f'max by (instance, gpu, reason) (gpu_clock_event_reason_active{{{GPU_SEL}, '
             f'reason=~"{reasons}"}}) > 0', _BY_GPU + " {{reason}}"),
           desc="Clock event reasons that hold the clocks down (1 while active).",
           empty="No clock held down"),
        ts("SM clock", "hertz", Q(f"gpu_sm_clock_hertz{{{GPU_SEL}}}", _BY_GPU)),
    )
    b.row("Errors")
    b.add(
        table("XID errors by code, with the GPU's owner", "short",
              Q(with_owner(f"max by (instance, gpu, uuid, xid) "
                           f"(gpu_xid_errors_total{{{GPU_SEL}}})")),
              Q(with_owner(f"max by (instance, gpu, uuid) (time() - "
                           f"gpu_xid_last_timestamp_seconds{{{GPU_SEL}}})")),
              names={"Value #A": "count", "Value #B": "seconds since last"},
              units={"seconds since last": "s"}, w=12, empty="No XID reported",
              desc="XIDs reported on each GPU, by code (counted across exporter restarts "
                   "by the GPU inventory), and who holds the GPU."),
        table("Uncorrectable memory errors, with the GPU's owner", "short",
              Q(with_owner(f'max by (instance, gpu, uuid) (gpu_ecc_errors_total{{{GPU_SEL}, '
                           f'error_type="uncorrected", counter="volatile"}}) > 0')),
              Q(with_owner(f"max by (instance, gpu, uuid) "
                           f"(gpu_remapped_rows_pending{{{GPU_SEL}}}) > 0")),
              names={"Value #A": "uncorrected ECC", "Value #B": "remap pending"}, w=12,
              empty="No uncorrectable memory error",
              desc="GPUs with uncorrectable ECC errors since the driver loaded or a row "
                   "remap waiting for a reset, and whose jobs ran on them."),
        ts("ECC errors (uncorrected)", "short",
           Q(f'gpu_ecc_errors_total{{{GPU_SEL}, error_type="uncorrected"}}',
             _BY_GPU + " {{counter}}")),
        ts("ECC errors corrected (rate)", "cps",
           Q(f'rate(gpu_ecc_errors_total{{{GPU_SEL}, error_type="corrected"}}'
             f"[$__rate_interval])", _BY_GPU + " {{counter}}")),
        table("Remapped rows", "short",
              Q(f"max by (instance, gpu, uuid, cause) (gpu_remapped_rows{{{GPU_SEL}}})"),
              Q(f"max by (instance, gpu, uuid) (gpu_remapped_rows_pending{{{GPU_SEL}}})"),
              Q(f"max by (instance, gpu, uuid) (gpu_remapped_rows_failure{{{GPU_SEL}}})"),
              names={"Value #A": "rows", "Value #B": "remap pending",
                     "Value #C": "remap failed"}, w=12),
        ts("PCIe replays (rate)", "cps",
           Q(f"rate(gpu_pcie_replay_errors_total{{{GPU_SEL}}}[$__rate_interval])", _BY_GPU)),
        ts("GPU up", "short",
           Q(f'gpu_up{{{NODE}, gpu=~"$gpu", {SIM}}}', _BY_GPU)),
    )
    return b.builder
