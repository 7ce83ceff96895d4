"""Pipeline alerts: gpu-audit itself (exporter, sampler, spool, shipper, sinks).

The `gpu_audit_*` self-metrics never carry `simulated`, so these rules have no such
matcher: a simulated node's pipeline is as real as any other. The availability alerts
(exporter down or absent, stale snapshot) keep firing for `pipeline.keep_firing_for`
once their condition stops holding, so one good (or one missed) scrape in an outage
does not resolve them and page again.
"""

from __future__ import annotations

from alerts.params import Params, human_duration
from alerts.promql import num
from alerts.rule import Alert

ON = "{{ $labels.instance }}"
SINK = "Sink {{ $labels.sink }} on {{ $labels.instance }}"


def pipeline_alerts(p: Params) -> list[Alert]:
    q = p.pipeline
    up = f'up{{job=~"{p.scrape_jobs}"}}'
    return [
        Alert(
            name="GpuAuditExporterDown",
            expr=f"{up} == 0",
            for_=q.exporter_down_for, severity="critical", category="pipeline",
            summary=f"gpu-audit exporter on {ON} is down",
            description=f"Prometheus has failed to scrape the gpu-audit exporter {ON} "
                        f"(scrape job {{{{ $labels.job }}}}) for more than "
                        f"{human_duration(q.exporter_down_for)}: no GPU metrics and no audit "
                        f"records from that node.",
            keep_firing_for=q.keep_firing_for,
        ),
        Alert(
            name="GpuAuditExporterAbsent",
            expr=f"absent({up})",
            for_=q.exporter_absent_for, severity="critical", category="pipeline",
            summary="No gpu-audit exporter is scraped",
            description=f"Prometheus has had no scrape target matching job=~"
                        f"\"{p.scrape_jobs}\" for more than "
                        f"{human_duration(q.exporter_absent_for)}: every GPU alert is blind.",
            keep_firing_for=q.keep_firing_for,
        ),
        Alert(
            name="GpuAuditSnapshotStale",
            expr=f"gpu_audit_snapshot_age_seconds > {num(q.snapshot_stale_seconds)}",
            for_=q.snapshot_stale_for, severity="warning", category="pipeline",
            summary=f"gpu-audit on {ON} serves a stale snapshot",
            description=f"The metrics gpu-audit serves on {ON} were sampled "
                        f"{{{{ $value | humanizeDuration }}}} ago (more than "
                        f"{num(q.snapshot_stale_seconds)}s for more than "
                        f"{human_duration(q.snapshot_stale_for)}): the sampling loop is stuck "
                        f"or failing.",
            keep_firing_for=q.keep_firing_for,
        ),
        Alert(
            name="GpuAuditSpoolFull",
            expr="gpu_audit_spool_full == 1",
            for_=q.spool_for, severity="critical", category="pipeline",
            summary=f"gpu-audit spool on {ON} is full",
            description=f"The spool on {ON} has refused new audit records "
                        f"({{{{ $labels.reason }}}} reached) for more than "
                        f"{human_duration(q.spool_for)}: audit records are being lost.",
        ),
        Alert(
            name="GpuAuditSpoolNotWritable",
            expr="gpu_audit_spool_writable == 0",
            for_=q.spool_for, severity="critical", category="pipeline",
            summary=f"gpu-audit cannot write its spool on {ON}",
            description=f"The last commit of audit records to the spool on {ON} failed and "
                        f"it has stayed so for more than {human_duration(q.spool_for)}: "
                        f"audit records are being lost (see "
                        f"gpu_audit_records_failed_total by reason).",
        ),
        Alert(
            name="GpuAuditSinkLagGrowing",
            expr=f"gpu_audit_shipper_cursor_lag_seconds > {num(q.lag_seconds)}\n"
                 f"and deriv(gpu_audit_shipper_cursor_lag_seconds[{q.lag_window}]) > 0",
            for_=q.lag_for, severity="warning", category="pipeline",
            summary=f"Sink {{{{ $labels.sink }}}} on {ON} falls behind",
            description=f"{SINK} is {{{{ $value | humanizeDuration }}}} behind the spool "
                        f"(more than {num(q.lag_seconds)}s) and the lag has kept growing for "
                        f"more than {human_duration(q.lag_for)}.",
        ),
        Alert(
            name="GpuAuditDeadLetters",
            expr=f"increase(gpu_audit_shipper_records_dead_lettered_total"
                 f"[{q.dead_letter_window}]) > 0",
            for_="0s", severity="warning", category="pipeline",
            summary=f"Sink {{{{ $labels.sink }}}} on {ON} rejects records",
            description=f"{SINK} rejected about {{{{ $value | printf \"%.0f\" }}}} record(s) "
                        f"for good in the last {human_duration(q.dead_letter_window)}; they "
                        f"are in its dead-letter file.",
        ),
        Alert(
            name="GpuAuditRecordsDropped",
            expr=f"increase(gpu_audit_shipper_records_dropped_total[{q.dropped_window}]) > 0",
            for_="0s", severity="critical", category="pipeline",
            summary=f"Sink {{{{ $labels.sink }}}} on {ON} will never get some records",
            description=f"{SINK} lost about {{{{ $value | printf \"%.0f\" }}}} record(s) "
                        f"({{{{ $labels.reason }}}}) in the last "
                        f"{human_duration(q.dropped_window)}.",
        ),
        Alert(
            name="GpuAuditSinkDown",
            expr="gpu_audit_shipper_sink_up == 0\n"
                 "unless on (instance, sink) (gpu_audit_shipper_sink_blocked == 1)",
            for_=q.sink_down_for, severity="warning", category="pipeline",
            summary=f"Sink {{{{ $labels.sink }}}} on {ON} is down",
            description=f"{SINK} has got no records through for more than "
                        f"{human_duration(q.sink_down_for)}; the spool keeps them meanwhile.",
        ),
        Alert(
            name="GpuAuditSinkBlocked",
            expr="gpu_audit_shipper_sink_blocked == 1",
            for_=q.sink_blocked_for, severity="critical", category="pipeline",
            summary=f"Sink {{{{ $labels.sink }}}} on {ON} is blocked",
            description=f"{SINK} has held its records back for more than "
                        f"{human_duration(q.sink_blocked_for)} because of "
                        f"{{{{ $labels.reason }}}}: it will not recover without a fix.",
        ),
        Alert(
            name="GpuAuditConservationBroken",
            expr="gpu_audit_shipper_conservation_ok == 0",
            for_=q.conservation_for, severity="critical", category="pipeline",
            summary=f"Record accounting of sink {{{{ $labels.sink }}}} on {ON} does not add up",
            description=f"The record accounting of sink {{{{ $labels.sink }}}} on {ON} has not "
                        f"added up (produced != delivered + dead-lettered + dropped + pending) "
                        f"for more than {human_duration(q.conservation_for)}.",
        ),
    ]
