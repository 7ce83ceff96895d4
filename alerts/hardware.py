"""Hardware alerts: XIDs, ECC, row remapping, throttling, temperature, lost and missing
GPUs. All fire per GPU, labelled with the node (`instance`), `gpu` and `uuid`, and with
the owner's `user`, `project` and `job` where the GPU has one (`gpu_owner_info`: whose
work is hit; for a lost GPU, who held it when it was last read).

Every one keeps firing for `hardware.keep_firing_for` after its condition stops holding:
a failed scrape makes every series of the node stale for an evaluation, and an exporter
restart for a few, and neither may send "resolved" and page again.
"""

from __future__ import annotations

from dataclasses import replace

from alerts.params import Params, human_duration
from alerts.promql import alternation, num, sel, with_owner
from alerts.rule import Alert
from gpu_audit.rules import GPU

WHERE = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}"
# the owner sentence of a description: empty when the GPU had no owner
OWNER = ("{{ if $labels.user }} Owner: {{ $labels.user }} (project "
         "{{ $labels.project }}, job {{ $labels.job }}{{ if $labels.slurm_job }}, Slurm job "
         "{{ $labels.slurm_job }}{{ end }}).{{ end }}")


def _xid(p: Params, name: str, match: str, critical: bool) -> Alert:
    xid = f"gpu_xid_errors_total{sel(p, match)}"
    window = p.hardware.xid_window
    # increase() misses the first event of a series that appears with its first XID,
    # so a series that did not exist one window ago counts as new events too (when it
    # is above 0: a counter first scraped at 0 is no event).
    expr = (f"{xid} > 0\n"
            f"  and (increase({xid}[{window}]) > 0 or ({xid} unless {xid} offset {window}))")
    what = ("a critical XID: the GPU needs a reset or service"
            if critical else "an XID that usually means an application fault")
    return Alert(
        name=name, expr=expr, for_="0s",
        severity="critical" if critical else "warning", category="hardware",
        summary="XID {{ $labels.xid }} on GPU {{ $labels.gpu }} "
                "of {{ $labels.instance }}",
        description=f"{WHERE} reported XID {{{{ $labels.xid }}}} in the last "
                    f"{human_duration(window)}, {what}; "
                    f"{{{{ $value }}}} XID {{{{ $labels.xid }}}} error(s) counted on it so "
                    f"far.",
    )


def hardware_alerts(p: Params) -> list[Alert]:
    """Every hardware alert, with the owner joined on and `keep_firing_for` set."""
    out = []
    for alert in _alerts(p):
        lookback = p.hardware.missing_lookback if alert.name == "GpuMissing" else None
        out.append(replace(alert, expr=with_owner(p, alert.expr, lookback),
                           description=alert.description + OWNER,
                           keep_firing_for=p.hardware.keep_firing_for))
    return out


def _alerts(p: Params) -> list[Alert]:
    h = p.hardware
    critical = f'xid=~"{alternation(h.critical_xids)}"'
    other = f'xid!~"{alternation(h.critical_xids)}"'
    ecc = sel(p, 'error_type="uncorrected"', 'counter="volatile"')
    thermal = sel(p, f'reason=~"{alternation(h.thermal_reasons)}"')
    power = sel(p, f'reason=~"{alternation(h.power_reasons)}"')
    return [
        _xid(p, "GpuXidCritical", critical, critical=True),
        _xid(p, "GpuXidError", other, critical=False),
        Alert(
            name="GpuEccUncorrectable",
            expr=f"gpu_ecc_errors_total{ecc} > 0",
            for_=h.ecc_for, severity="critical", category="hardware",
            summary="Uncorrectable ECC errors on GPU {{ $labels.gpu }} of "
                    "{{ $labels.instance }}",
            description=f"{WHERE} counted {{{{ $value }}}} uncorrectable ECC error(s) since "
                        f"the driver was loaded; data on it may be corrupt.",
        ),
        Alert(
            name="GpuRowRemapFailure",
            expr=f"gpu_remapped_rows_failure{sel(p)} == 1",
            for_=h.remap_for, severity="critical", category="hardware",
            summary="Row remapping failed on GPU {{ $labels.gpu }} of {{ $labels.instance }}",
            description=f"{WHERE} failed to remap a memory row: the GPU needs service.",
        ),
        Alert(
            name="GpuRowRemapPending",
            expr=f"gpu_remapped_rows_pending{sel(p)} == 1",
            for_=h.remap_for, severity="warning", category="hardware",
            summary="Row remap pending on GPU {{ $labels.gpu }} of {{ $labels.instance }}",
            description=f"{WHERE} has a memory row remap waiting for a GPU reset "
                        f"(for at least {human_duration(h.remap_for)}).",
        ),
        Alert(
            name="GpuThermalThrottling",
            expr=f"gpu_clock_event_reason_active{thermal} == 1",
            for_=h.throttle_for, severity="warning", category="hardware",
            summary="GPU {{ $labels.gpu }} of {{ $labels.instance }} is thermally throttled",
            description=f"{WHERE} has had its clocks held down by {{{{ $labels.reason }}}} "
                        f"for more than {human_duration(h.throttle_for)}.",
        ),
        Alert(
            name="GpuPowerThrottling",
            expr=f"gpu_clock_event_reason_active{power} == 1",
            for_=h.throttle_for, severity="warning", category="hardware",
            summary="GPU {{ $labels.gpu }} of {{ $labels.instance }} is power throttled",
            description=f"{WHERE} has had its clocks held down by {{{{ $labels.reason }}}} "
                        f"for more than {human_duration(h.throttle_for)}.",
        ),
        Alert(
            name="GpuTemperatureHigh",
            expr=f"gpu_temperature_celsius{sel(p)} > {num(h.temperature_celsius)}",
            for_=h.temperature_for, severity="warning", category="hardware",
            summary="GPU {{ $labels.gpu }} of {{ $labels.instance }} is at "
                    "{{ $value }} °C",
            description=f"{WHERE} has been above {num(h.temperature_celsius)} °C for more than "
                        f"{human_duration(h.temperature_for)}; it is at {{{{ $value }}}} °C.",
        ),
        Alert(
            name="GpuLost",
            expr=f"gpu_up{sel(p)} == 0",
            for_=h.lost_for, severity="critical", category="hardware",
            summary="GPU {{ $labels.gpu }} of {{ $labels.instance }} is lost",
            description=f"{WHERE} has not been readable for more than "
                        f"{human_duration(h.lost_for)} (gpu_up == 0): fallen off the bus, "
                        f"timing out or failing every read.",
        ),
        Alert(
            name="GpuMissing",
            # reported during the lookback, not now, while its node's exporter is up:
            # the GPU is gone from enumeration (a GPU the exporter still lists as down
            # is GpuLost; a whole node down is GpuAuditExporterDown)
            # (`job` is the scrape job's, replaced by the owner's where the GPU had one)
            expr=f"(\n"
                 f"  max by ({GPU}, job) (max_over_time(gpu_up{sel(p)}[{h.missing_lookback}]))\n"
                 f"    unless on (instance, uuid) gpu_up{sel(p)}\n"
                 f")\n"
                 f"and on (instance) (up{{job=~\"{p.scrape_jobs}\"}} == 1)",
            for_=h.missing_for, severity="warning", category="hardware",
            summary="GPU {{ $labels.gpu }} of {{ $labels.instance }} is missing",
            description=f"{WHERE} was reported in the last "
                        f"{human_duration(h.missing_lookback)} but has not been for more than "
                        f"{human_duration(h.missing_for)}, while the node's exporter is up.",
        ),
    ]
