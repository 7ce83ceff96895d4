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
    firing_alerts,
    gpu_variables,
    new_board,
    single,
    ts,
    with_owner,
)
from dashboards.common import grid as table

UID = "gpu-audit-fleet"


XIDS_IN_RANGE = (
    # per series: its count now minus its count when the range began (0 for a series
    # that began within it: the first XID of a GPU creates it); a reset is never negative
    f"clamp_min(gpu_xid_errors_total{{{GPU_SEL}}} - (gpu_xid_errors_total{{{GPU_SEL}}}"
    f" offset $__range or gpu_xid_errors_total{{{GPU_SEL}}} * 0), 0)")


# capacity (docs/CAPACITY.md): installed = every GPU the exporters report (up or down);
# allocated = held (the recording rules see processes, not reservations); hourly means
# as `gpu-audit capacity` bins them, sampled every minute (a trailing hour's mean; a
# 1h subquery step would show nothing until the first whole hour of data)
INSTALLED = f"count(gpu_up{{{GPU_SEL}}})"
HELD_1H = "avg_over_time(fleet:gpus_held:sum[1h])"
INSTALLED_1H = f"avg_over_time({INSTALLED}[1h:1m])"


def capacity_row(b: Board) -> None:
    """The capacity report's figures over the dashboard's range, from the fleet:*
    recording rules (the same definitions; queue waits are not in them)."""
    b.row("Capacity (gpu-audit capacity)")
    b.add(
        single("Allocated % of installed", "percentunit",
               Q(f"avg_over_time(fleet:gpus_held:sum[$__range]) / "
                 f"avg_over_time({INSTALLED}[$__range:1m])"), decimals=1, w=4,
               desc="Mean GPUs held by a job over the range / mean GPUs installed (up or "
                    "down). `gpu-audit capacity` gives the same from the archive."),
        single("p95 allocated GPUs (hourly)", "short",
               Q(f"quantile_over_time(0.95, ({HELD_1H})[$__range:1m])"), decimals=1, w=4,
               desc="95th percentile over the range of the trailing hour's mean of GPUs "
                    "held (sampled every minute; the report uses whole-hour bins)."),
        single("Hours at >= 90 % allocated", "short",
               Q(f"sum_over_time((({HELD_1H}) / ({INSTALLED_1H}) >= bool 0.9)"
                 f"[$__range:1m]) / 60"), decimals=0, w=4,
               desc="Hours of the range whose mean allocated GPUs were at least 90 % of "
                    "the installed ones: the hours a new job was likely to wait."),
        single("Busy % of installed", "percentunit",
               Q(f"avg_over_time(fleet:gpus_busy:sum[$__range]) / "
                 f"avg_over_time({INSTALLED}[$__range:1m])"), decimals=1, w=4,
               desc="Utilisation-weighted GPUs over the range / GPUs installed."),
        single("Held idle GPU-hours", "short",
               Q("sum_over_time(fleet:gpus_idle_held:sum[$__range:1m]) / 60"), w=4,
               desc="GPU-hours held by a job at near-zero utilisation in the range."),
        single("Free GPU-hours", "short",
               Q("sum_over_time((fleet:gpus:count - fleet:gpus_held:sum)[$__range:1m]) / 60"),
               w=4, desc="GPU-hours up and held by no job in the range. Queue waits are not "
               "in the recording rules: `gpu-audit capacity --launcher-state` reads them."),
    )
    b.add(
        ts("Installed, allocated, busy and idle-held GPUs (hourly means)", "short",
           Q(INSTALLED_1H, "installed"), Q(HELD_1H, "allocated (held)"),
           Q("avg_over_time(fleet:gpus_busy:sum[1h])", "busy"),
           Q("avg_over_time(fleet:gpus_idle_held:sum[1h])", "held idle"),
           Q(f"({INSTALLED_1H}) - avg_over_time(fleet:gpus:count[1h])", "down"),
           desc="What `gpu-audit capacity` bins per hour; free = up - allocated."),
        ts("Allocated GPUs: the 30-day linear trend, 90 days ahead", "short",
           Q(HELD_1H, "allocated (held)"),
           Q("predict_linear(fleet:gpus_held:sum[30d], 90 * 86400)",
             "in 90 days at the 30-day trend"),
           Q(INSTALLED_1H, "installed"),
           desc="A straight line through the last 30 days, no interval: "
                "`gpu-audit capacity` states the date capacity is reached and its "
                "uncertainty (docs/CAPACITY.md)."),
    )


def build() -> dashboard.Dashboard:
    b = Board(gpu_variables(new_board(
        UID, "GPU fleet overview",
        "Every GPU of every node: what is firing, how many GPUs are up, lost, held and "
        "busy, and how hot and hungry they are. Fleet totals come from the fleet:* "
        "recording rules.")))
    b.row("Fleet now")
    b.add(
        single("GPUs up", "short", Q("fleet:gpus:count"), w=3),
        single("GPUs lost", "short", Q(f"count(gpu_up{{{GPU_SEL}}} == 0)"), w=3,
               desc="GPUs the exporter cannot read (fallen off the bus, timing out) or "
                    "no longer enumerates but has in its GPU inventory."),
        single("GPUs held", "short", Q("fleet:gpus_held:sum"), w=3,
               desc="GPUs on which an identified job holds memory."),
        single("Idle but held", "short", Q("fleet:gpus_idle_held:sum"), w=3,
               desc="Held GPUs at near-zero utilisation: the waste to chase."),
        single("Fleet utilisation", "percentunit",
               Q("fleet:gpus_busy:sum / fleet:gpus:count"), decimals=1, w=3),
        single("Fleet power", "watt", Q("fleet:gpu_power_watts:sum"), w=3),
        single("XIDs in range", "short", Q(f"sum({XIDS_IN_RANGE})"), w=3,
               desc="XID errors the driver reported in the time range, every GPU."),
        single("Alerts firing", "short",
               Q('count(ALERTS{alertstate="firing", category=~"hardware|waste|leak|'
                 'pipeline", instance=~"$node"})'), w=3),
    )
    b.row("Alerts")
    b.add(table("Firing alerts", "short", firing_alerts(), hide=["Value"], h=7,
                desc="gpu-audit's alerts firing now, with the GPU and the owner they "
                     "concern; docs/runbooks.md says what to do about each.",
                empty="No alert firing"))
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
    b.row("Lost GPUs and XIDs")
    b.add(
        table("Lost GPUs and their owners", "short",
              Q(with_owner(f"max by (instance, gpu, uuid) (gpu_up{{{GPU_SEL}}}) == 0")),
              hide=["Value"], w=12, h=7,
              desc="GPUs that are down now, with the user, project and job that held them "
                   "when they were last read (whose work died).",
              empty="No GPU lost"),
        table("XIDs in range by GPU", "short",
              Q(with_owner(f"sum by (instance, gpu, uuid, xid) ({XIDS_IN_RANGE}) > 0")),
              names={"Value": "XIDs"}, w=12, h=7,
              desc="XID errors in the time range by GPU and code, with the GPU's owner "
                   "(13, 31, 43 usually the application; 48, 79 and others the hardware).",
              empty="No XID in the time range"),
    )
    capacity_row(b)
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
