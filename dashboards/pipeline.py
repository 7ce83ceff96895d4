"""Audit pipeline: the exporter's sampling loop, the spool, each sink's lag, failures,
dead letters and conservation (gpu-audit's own gpu_audit_* metrics)."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard

from dashboards.common import (
    NODE,
    Board,
    Q,
    datasource_variable,
    new_board,
    query_variable,
    single,
    ts,
)
from dashboards.common import grid as table

UID = "gpu-audit-pipeline"
SINK = f'{NODE}, sink=~"$sink"'
_RATE = "[$__rate_interval]"
# The spool's and sinks' metrics come from the process that ships: `gpu-audit run`, or
# `gpu-audit shipper` (its own scrape target). A node running `gpu-audit exporter` alone
# has none of them, and these panels say so instead of staying blank.
NO_SHIPPER = "No shipper on this node (gpu-audit exporter alone; see its gpu-audit shipper)"


def _variables(b: dashboard.Dashboard) -> dashboard.Dashboard:
    return (b.with_variable(datasource_variable())
            .with_variable(query_variable("node", "Node",
                                          "label_values(gpu_audit_scrapes_total, instance)"))
            .with_variable(query_variable(
                "sink", "Sink",
                f"label_values(gpu_audit_shipper_sink_up{{{NODE}}}, sink)")))


def build() -> dashboard.Dashboard:
    b = Board(_variables(new_board(
        UID, "GPU audit pipeline",
        "Is every audit record getting through? Sampling, the spool, each sink's lag, "
        "failures, dead letters and the conservation check (produced = delivered + "
        "dead-lettered + dropped + pending).")))
    b.row("Health")
    b.add(
        # sum(1 - x) of the 0/1 gauges: 0 when all is well, yet a value from real series
        single("Sinks down", "short", Q(f"sum(1 - gpu_audit_shipper_sink_up{{{SINK}}})")),
        single("Conservation broken", "short",
               Q(f"sum(1 - gpu_audit_shipper_conservation_ok{{{SINK}}})"),
               desc="Sinks for which produced != delivered + dead-lettered + dropped + "
                    "pending."),
        single("Dead letters in range", "short",
               Q(f"sum(increase(gpu_audit_shipper_records_dead_lettered_total{{{SINK}}}"
                 f"[$__range]))")),
        single("Spool full", "short", Q(f"max(gpu_audit_spool_full{{{NODE}}})")),
        single("Spool writable", "bool", Q(f"min(gpu_audit_spool_writable{{{NODE}}})")),
        single("Snapshot age", "s", Q(f"max(gpu_audit_snapshot_age_seconds{{{NODE}}})")),
    )
    b.row("Sinks")
    by_sink = "{{instance}} {{sink}}"
    b.add(
        ts("Lag (records)", "short",
           Q(f"gpu_audit_shipper_cursor_lag_records{{{SINK}}}", by_sink),
           empty=NO_SHIPPER),
        ts("Lag (age of the oldest undelivered record)", "s",
           Q(f"gpu_audit_shipper_cursor_lag_seconds{{{SINK}}}", by_sink),
           empty=NO_SHIPPER),
        ts("Delivered, retried, redelivered (rate)", "rps",
           Q(f"rate(gpu_audit_shipper_records_delivered_total{{{SINK}}}{_RATE})",
             by_sink + " delivered"),
           Q(f"rate(gpu_audit_shipper_records_retried_total{{{SINK}}}{_RATE})",
             by_sink + " retried"),
           Q(f"rate(gpu_audit_shipper_records_redelivered_total{{{SINK}}}{_RATE})",
             by_sink + " redelivered"),
           empty=NO_SHIPPER),
        ts("Dead-lettered and dropped (rate)", "rps",
           Q(f"rate(gpu_audit_shipper_records_dead_lettered_total{{{SINK}}}{_RATE})",
             by_sink + " dead-lettered"),
           Q(f"sum by (instance, sink, reason) "
             f"(rate(gpu_audit_shipper_records_dropped_total{{{SINK}}}{_RATE}))",
             by_sink + " dropped {{reason}}"),
           empty=NO_SHIPPER),
        ts("Batch send time (p95)", "s",
           Q(f"histogram_quantile(0.95, sum by (instance, sink, le) "
             f"(rate(gpu_audit_shipper_batch_duration_seconds_bucket{{{SINK}}}{_RATE})))",
             by_sink),
           empty=NO_SHIPPER),
        table("Sink state", "short",
              Q(f"max by (instance, sink) (gpu_audit_shipper_sink_up{{{SINK}}})"),
              Q(f"max by (instance, sink) (gpu_audit_shipper_conservation_ok{{{SINK}}})"),
              Q(f"max by (instance, sink) (time() - "
                f"gpu_audit_shipper_last_success_timestamp_seconds{{{SINK}}})"),
              Q(f"max by (instance, sink) (gpu_audit_shipper_cursor_offset{{{SINK}}})"),
              names={"Value #A": "up", "Value #B": "conservation ok",
                     "Value #C": "since last success", "Value #D": "cursor offset"},
              units={"since last success": "s"}, w=12, empty=NO_SHIPPER),
    )
    b.row("Spool and audit records")
    b.add(
        ts("Spool size", "bytes", Q(f"gpu_audit_spool_bytes{{{NODE}}}", "{{instance}}"),
           empty=NO_SHIPPER),
        ts("Records written and failed (rate)", "rps",
           Q(f"rate(gpu_audit_records_written_total{{{NODE}}}{_RATE})", "{{instance}} written"),
           Q(f"sum by (instance, reason) "
             f"(rate(gpu_audit_records_failed_total{{{NODE}}}{_RATE}))",
             "{{instance}} failed {{reason}}")),
        ts("Records refused, evicted, corrupt (rate)", "rps",
           Q(f"sum by (instance) (rate(gpu_audit_spool_refused_records_total{{{NODE}}}{_RATE}))",
             "{{instance}} refused"),
           Q(f"rate(gpu_audit_spool_evicted_records_total{{{NODE}}}{_RATE})",
             "{{instance}} evicted"),
           Q(f"rate(gpu_audit_spool_corrupt_records_total{{{NODE}}}{_RATE})",
             "{{instance}} corrupt"),
           empty=NO_SHIPPER),
        ts("Spool segments", "short", Q(f"gpu_audit_spool_segments{{{NODE}}}", "{{instance}}"),
           empty=NO_SHIPPER),
    )
    b.row("Sampling")
    b.add(
        ts("Sampling cycle time", "s",
           Q(f"gpu_audit_sample_duration_seconds{{{NODE}}}", "{{instance}}")),
        ts("Sampling errors (rate)", "cps",
           Q(f"rate(gpu_audit_sample_failed_cycles_total{{{NODE}}}{_RATE})",
             "{{instance}} failed cycles"),
           Q(f"sum by (instance, kind) (rate(gpu_audit_sample_errors_total{{{NODE}}}{_RATE}))",
             "{{instance}} {{kind}}")),
        ts("Exposition series", "short", Q(f"gpu_audit_series{{{NODE}}}", "{{instance}}")),
        ts("Scrape target up", "short",
           Q(f"up{{{NODE}}}", "{{instance}} {{job}}")),
    )
    return b.builder
