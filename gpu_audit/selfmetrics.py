"""The catalogue of gpu-audit's own metrics: every `gpu_audit_*` family any component
serves (sampler, renderer, HTTP endpoint, audit producer, spool, shipper, the launcher daemon's
socket).

It lives in core because the shipper must not import the exporter: each collector takes
its name, type, HELP and label names from here, and `python -m exporter.exposition.docs` writes
docs/METRICS.md from it, so a served self-metric cannot be missing from the docs (a test
scrapes a live `gpu-audit run` and checks). Self-metrics describe gpu-audit itself, so
they never carry `simulated`, even under the simulator.

Counters whose label values are known in advance declare them (`known`): they are
exported at 0 from the start, so a query or panel on them has data on a healthy node,
and rate()/increase() see the first failure instead of a series that appears with it.

This module is declarations only (plus a constructor of the matching prometheus_client
family): it must never compute a value or do I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)

SelfMetricType = Literal["gauge", "counter", "histogram"]
Component = Literal["sampler", "renderer", "endpoint", "audit", "spool", "shipper",
                    "launcher"]

COMPONENT_TITLES: dict[Component, str] = {
    "sampler": "Sampling loop and attribution",
    "renderer": "Renderer (computed with each cycle)",
    "endpoint": "HTTP endpoint (computed at scrape time)",
    "audit": "Audit producer",
    "spool": "Spool",
    "shipper": "Shipper (one series per sink)",
    "launcher": "Launcher daemon socket (on the launcher's metrics_listen endpoint)",
}

_NAME_RE = re.compile(r"^gpu_audit_[a-z0-9_]+$")


@dataclass(frozen=True, slots=True)
class SelfMetric:
    """One self-metric family, named as served (counters end in `_total`)."""

    name: str
    type: SelfMetricType
    help: str
    component: Component
    labels: tuple[str, ...] = ()
    source: str = ""
    unit: str = ""
    known: tuple[str, ...] = ()
    """Values of the last label known in advance: exported at 0 until they count."""

    @property
    def full_help(self) -> str:
        return f"{self.help} Source: {self.source}." if self.source else self.help

    @property
    def base_name(self) -> str:
        """The name prometheus_client wants (it appends `_total` to counters itself)."""
        return self.name.removesuffix("_total") if self.type == "counter" else self.name

    def with_known(self, counts: Mapping[str, float]) -> list[tuple[str, float]]:
        """(last label value, count) for every known value (0 until it counts) and every
        other value counted, sorted by value."""
        return sorted({**dict.fromkeys(self.known, 0), **counts}.items())

    def counter(self, *, value: float | None = None) -> CounterMetricFamily:
        """A fresh counter family of this metric (with `value` when it has no labels)."""
        if self.type != "counter":
            raise TypeError(f"{self.name} is a {self.type}, not a counter")
        return CounterMetricFamily(self.base_name, self.full_help, value=value,
                                   labels=list(self.labels) or None)

    def gauge(self, *, value: float | None = None) -> GaugeMetricFamily:
        """A fresh gauge family of this metric (with `value` when it has no labels)."""
        if self.type != "gauge":
            raise TypeError(f"{self.name} is a {self.type}, not a gauge")
        return GaugeMetricFamily(self.name, self.full_help, value=value,
                                 labels=list(self.labels) or None)

    def histogram(self) -> HistogramMetricFamily:
        """A fresh, empty histogram family of this metric."""
        if self.type != "histogram":
            raise TypeError(f"{self.name} is a {self.type}, not a histogram")
        return HistogramMetricFamily(self.name, self.full_help,
                                     labels=list(self.labels) or None)


# Table entries: _metric builds a SelfMetric from positional fields.
def _metric(name: str, type_: SelfMetricType, help_: str, component: Component,  # noqa: PLR0917
            labels: tuple[str, ...] = (), source: str = "", unit: str = "",
            known: tuple[str, ...] = ()) -> SelfMetric:
    return SelfMetric(name, type_, help_, component, labels, source, unit, known)


# The error kinds a GPU is counted down under (gpu_audit.nvml_shim.error_kind; the
# simulator uses gpu_lost).
GPU_ERROR_KINDS = ("gpu_lost", "timeout", "unknown", "nvml_error")
# Why the spool refuses records (gpu_audit.spool), and the errno names a failed write
# most often ends with.
SPOOL_FULL_REASONS = ("max_bytes", "min_free")
WRITE_ERRNO_NAMES = ("EACCES", "EDQUOT", "EIO", "ENOSPC", "EROFS")


# --- sampler (exporter/app.py SamplerCollector; renderer families below) --------------
SAMPLE_CYCLES = _metric("gpu_audit_sample_cycles_total", "counter",
                        "Sampling cycles completed.", "sampler")
SAMPLE_FAILED_CYCLES = _metric("gpu_audit_sample_failed_cycles_total", "counter",
                               "Sampling cycles that raised (logged; sampling went on).", "sampler")
SAMPLE_CPU_SECONDS = _metric("gpu_audit_sample_cpu_seconds_total", "counter",
                             "CPU time the sampling thread spent in cycles "
                             "(sampling, attribution, rendering, audit records).", "sampler",
                             unit="seconds")
SNAPSHOT_LISTENER_ERRORS = _metric("gpu_audit_snapshot_listener_errors_total", "counter",
                                   "Snapshot consumers (audit producer) that raised.", "sampler")
ATTRIBUTION_EVENTS = _metric("gpu_audit_attribution_events_total", "counter",
                             "Attribution counters by kind (cache hits and misses, "
                             "vanished processes, unreadable files, ...).", "sampler", ("kind",))

# --- renderer: rendered into each cycle's cached exposition -------------------------
SAMPLE_DURATION = _metric("gpu_audit_sample_duration_seconds", "gauge",
                          "Wall time the latest sampling cycle took.", "renderer",
                          source="the sampler loop", unit="seconds")
SNAPSHOT_TIMESTAMP = _metric("gpu_audit_snapshot_timestamp_seconds", "gauge",
                             "Unix time the latest sampling cycle started (scenario time under the"
                             " simulator).", "renderer", source="the sampler loop", unit="seconds")
SAMPLE_ERRORS = _metric("gpu_audit_sample_errors_total", "counter",
                        "Sampling errors by kind since the exporter started.", "renderer",
                        ("kind",), source="the backend's per-kind error counts",
                        known=GPU_ERROR_KINDS)
SERIES = _metric("gpu_audit_series", "gauge",
                 "Samples in the cached exposition of the latest cycle (this one included).",
                 "renderer", source="the renderer")

# --- endpoint: computed at scrape time ------------------------------------------------
SNAPSHOT_AGE = _metric("gpu_audit_snapshot_age_seconds", "gauge",
                       "Seconds since the exposition served now was rendered; computed at scrape"
                       " time.", "endpoint", source="the HTTP endpoint", unit="seconds")
SCRAPES = _metric("gpu_audit_scrapes_total", "counter", "Requests served on /metrics.",
                  "endpoint", source="the HTTP endpoint")
PROCESS_SERIES_DROPPED = _metric("gpu_audit_process_series_dropped_total", "counter",
                                 "Per-process label sets left out by the per-GPU series cap,"
                                 " summed over cycles.", "endpoint", ("gpu", "uuid"),
                                 source="the renderer's cap")

# --- audit producer (gpu_audit/audit/metrics.py) --------------------------------------
RECORDS_WRITTEN = _metric("gpu_audit_records_written_total", "counter",
                          "Audit records committed to the spool (after the group-commit fsync).",
                          "audit")
RECORDS_FAILED = _metric("gpu_audit_records_failed_total", "counter",
                         "Audit records that could not be written to the spool, by reason "
                         "(max_bytes, min_free, or the errno name such as ENOSPC, EACCES).",
                         "audit", ("reason",), known=(*SPOOL_FULL_REASONS, *WRITE_ERRNO_NAMES))
SPOOL_WRITABLE = _metric("gpu_audit_spool_writable", "gauge",
                         "1 when the last commit of audit records to the spool succeeded, else 0.",
                         "audit")
AUDIT_LAST_SEQ = _metric("gpu_audit_audit_last_seq", "gauge",
                         "Sequence number of the last audit record written, by stream; compare "
                         "with the last seq `gpu-audit audit verify` finds in a sink to see "
                         "records not yet there.", "audit", ("stream",))
AUDIT_HEAD = _metric("gpu_audit_audit_head", "gauge",
                     "The audit chain's head, by host and stream: part=\"seq\" is the seq of "
                     "the newest record written, part=\"hash0\"/\"hash1\" the first 96 bits "
                     "of its hash as two 48-bit integers; kept by Prometheus, it is the "
                     "witness `audit verify --witness` checks an archive against.", "audit",
                     ("host", "stream", "part"))

# --- spool (served by the shipper's collector) ----------------------------------------
SPOOL_BYTES = _metric("gpu_audit_spool_bytes", "gauge",
                      "Bytes the spool's segments take on disk.", "spool", unit="bytes")
SPOOL_SEGMENTS = _metric("gpu_audit_spool_segments", "gauge", "Segment files in the spool.",
                         "spool")
RECORDS_PRODUCED = _metric("gpu_audit_records_produced_total", "counter",
                           "Records ever acknowledged into the spool (its next offset).", "spool")
SPOOL_FULL = _metric("gpu_audit_spool_full", "gauge",
                     "1 while the spool refuses new records (max_bytes or min_free_bytes "
                     "reached).", "spool", ("reason",))
SPOOL_REFUSED = _metric("gpu_audit_spool_refused_records_total", "counter",
                        "Records the spool refused because it was full, by reason (max_bytes, "
                        "min_free).", "spool", ("reason",), known=SPOOL_FULL_REASONS)
SPOOL_EVICTED = _metric("gpu_audit_spool_evicted_records_total", "counter",
                        "Records deleted before every sink had them, to make room "
                        "(spool.when_full: drop_oldest). Each sink also counts them as "
                        "dropped{reason=spool_skipped}.",
                        "spool")
SPOOL_CORRUPT = _metric("gpu_audit_spool_corrupt_records_total", "counter",
                        "Records lost to damage in the spool (a corrupt frame or segment header), "
                        "counted once when the damaged segment's bytes are kept in quarantine/. "
                        "Each sink also counts them as dropped{reason=spool_skipped}.", "spool")

# --- shipper (shipper/metrics.py ShipperCollector) -------------------------------------
_SINK = ("sink",)
SHIPPER_DELIVERED = _metric("gpu_audit_shipper_records_delivered_total", "counter",
                            "Records the sink's backend acknowledged (a 409 already-exists "
                            "counts).", "shipper", _SINK)
SHIPPER_RETRIED = _metric("gpu_audit_shipper_records_retried_total", "counter",
                          "Record sends that got a transient or hold outcome and were sent again.",
                          "shipper", _SINK)
SHIPPER_REDELIVERED = _metric("gpu_audit_shipper_records_redelivered_total", "counter",
                              "Record sends that repeat an earlier send of the same record: after "
                              "a restart (cursor not yet committed), a retry, a failed delivery "
                              "round, "
                              "or inside the sink (a bisected partial write, a split 413). The "
                              "idempotent sink stores each record once.", "shipper", _SINK)
SHIPPER_DEAD_LETTERED = _metric("gpu_audit_shipper_records_dead_lettered_total", "counter",
                                "Records the backend rejected for good, written to the sink's "
                                "dead-letter file.", "shipper", _SINK)
SHIPPER_DROPPED = _metric("gpu_audit_shipper_records_dropped_total", "counter",
                          "Records this sink will never get, by reason (expected to stay 0).",
                          "shipper", ("sink", "reason"), known=("spool_skipped",))
SHIPPER_LAG_RECORDS = _metric("gpu_audit_shipper_cursor_lag_records", "gauge",
                              "Records in the spool not yet delivered to the sink.", "shipper",
                              _SINK)
SHIPPER_LAG_SECONDS = _metric("gpu_audit_shipper_cursor_lag_seconds", "gauge",
                              "Age of the oldest record not yet delivered to the sink (0 when "
                              "caught up).", "shipper", _SINK, unit="seconds")
SHIPPER_CURSOR = _metric("gpu_audit_shipper_cursor_offset", "gauge",
                         "The sink's committed (durable) cursor in the spool.", "shipper", _SINK)
SHIPPER_LAST_SUCCESS = _metric("gpu_audit_shipper_last_success_timestamp_seconds", "gauge",
                               "Unix time of the sink's last batch with a delivered record.",
                               "shipper", _SINK, unit="seconds")
SHIPPER_BLOCKED = _metric("gpu_audit_shipper_sink_blocked", "gauge",
                          "1 while the sink holds data because of an auth or configuration error.",
                          "shipper", ("sink", "reason"))
SHIPPER_SINK_UP = _metric("gpu_audit_shipper_sink_up", "gauge",
                          "1 when the sink's last attempt got records through (or it started with "
                          "nothing to send), 0 while it is down, blocked or not yet started.",
                          "shipper", _SINK)
SHIPPER_CONSERVATION = _metric("gpu_audit_shipper_conservation_ok", "gauge",
                               "1 when produced = delivered + dead_lettered + dropped + pending for"
                               " the sink.", "shipper", _SINK)
SHIPPER_BATCH_DURATION = _metric("gpu_audit_shipper_batch_duration_seconds", "histogram",
                                 "Time of one send of a batch to the sink, whatever its outcome.",
                                 "shipper", _SINK, unit="seconds")

LAUNCHER_CONNECTIONS = _metric("gpu_audit_launcher_connections", "gauge",
                               "Client connections the launcher daemon holds open.",
                               "launcher")
LAUNCHER_BUFFERED = _metric("gpu_audit_launcher_buffered_bytes", "gauge",
                            "Bytes of requests and answers the launcher holds for its clients "
                            "(bounded by limits.max_buffered_bytes).", "launcher",
                            unit="bytes")
LAUNCHER_REQUESTS = _metric("gpu_audit_launcher_requests_total", "counter",
                            "Requests answered, by operation and outcome (ok or the error "
                            "code).", "launcher", ("op", "outcome"))
LAUNCHER_REFUSED = _metric("gpu_audit_launcher_connections_refused_total", "counter",
                           "Connections answered \"too many connections\" and closed, by the "
                           "cap they hit (per_uid, total, per_uid_rate: new connections per "
                           "second).",
                           "launcher", ("reason",))
LAUNCHER_DROPPED = _metric("gpu_audit_launcher_connections_dropped_total", "counter",
                           "Connections closed by the daemon before a normal end, by reason: "
                           "read_timeout (no whole request in time), write_timeout (the client "
                           "did not read its answer), too_large (request over the limit), "
                           "error (the connection failed).", "launcher", ("reason",))
LAUNCHER_ACCEPT_ERRORS = _metric("gpu_audit_launcher_accept_errors_total", "counter",
                                 "accept() failures on the launcher's socket, by errno "
                                 "(EMFILE, ENFILE, ENOBUFS, ENOMEM...); the daemon backs off "
                                 "and keeps serving.", "launcher", ("errno",))
LAUNCHER_READ_PAUSES = _metric("gpu_audit_launcher_read_pauses_total", "counter",
                               "Times the daemon stopped reading requests because the bytes "
                               "held for clients reached limits.max_buffered_bytes.",
                               "launcher")

SELF_METRICS: tuple[SelfMetric, ...] = (
    SAMPLE_CYCLES, SAMPLE_FAILED_CYCLES, SAMPLE_CPU_SECONDS, SNAPSHOT_LISTENER_ERRORS,
    ATTRIBUTION_EVENTS,
    SAMPLE_DURATION, SNAPSHOT_TIMESTAMP, SAMPLE_ERRORS, SERIES,
    SNAPSHOT_AGE, SCRAPES, PROCESS_SERIES_DROPPED,
    RECORDS_WRITTEN, RECORDS_FAILED, SPOOL_WRITABLE, AUDIT_LAST_SEQ, AUDIT_HEAD,
    SPOOL_BYTES, SPOOL_SEGMENTS, RECORDS_PRODUCED, SPOOL_FULL, SPOOL_REFUSED, SPOOL_EVICTED,
    SPOOL_CORRUPT,
    SHIPPER_DELIVERED, SHIPPER_RETRIED, SHIPPER_REDELIVERED, SHIPPER_DEAD_LETTERED,
    SHIPPER_DROPPED, SHIPPER_LAG_RECORDS, SHIPPER_LAG_SECONDS, SHIPPER_CURSOR,
    SHIPPER_LAST_SUCCESS, SHIPPER_BLOCKED, SHIPPER_SINK_UP, SHIPPER_CONSERVATION,
    SHIPPER_BATCH_DURATION,
    LAUNCHER_CONNECTIONS, LAUNCHER_BUFFERED, LAUNCHER_REQUESTS, LAUNCHER_REFUSED,
    LAUNCHER_DROPPED, LAUNCHER_ACCEPT_ERRORS, LAUNCHER_READ_PAUSES,
)


def _check() -> None:
    names = [m.name for m in SELF_METRICS]
    if len(set(names)) != len(names):
        raise AssertionError("a self-metric is declared twice")
    for m in SELF_METRICS:
        if not _NAME_RE.match(m.name):
            raise AssertionError(f"{m.name}: self-metrics are gpu_audit_*, lower case")
        if (m.type == "counter") != m.name.endswith("_total"):
            raise AssertionError(f"{m.name}: counters and only counters end in _total")
        if "simulated" in m.labels:
            raise AssertionError(f"{m.name}: self-metrics describe gpu-audit, not the GPUs")


_check()
