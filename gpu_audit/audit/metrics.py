"""Self-metrics of the audit producer for the live /metrics registry.

A custom collector: fresh metric families on every collect, read from the producer's
counters; it must never mutate the producer or hold its lock across a scrape.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpu_audit.audit.producer import AuditProducer


class AuditCollector(Collector):
    """gpu_audit_records_written_total, gpu_audit_records_failed_total{reason},
    gpu_audit_spool_writable, gpu_audit_audit_last_seq."""

    def __init__(self, producer: AuditProducer) -> None:
        self._producer = producer

    def collect(self) -> Iterator[Metric]:
        stats = self._producer.stats()
        failed = self._producer.failed_by_reason()
        written = CounterMetricFamily(
            "gpu_audit_records_written",
            "Audit records committed to the spool (after the group-commit fsync).",
        )
        written.add_metric([], stats["records_written"])
        yield written
        fail = CounterMetricFamily(
            "gpu_audit_records_failed",
            "Audit records that could not be written to the spool, by reason "
            "(max_bytes, min_free, or the errno name such as ENOSPC, EACCES).",
            labels=["reason"],
        )
        for reason in sorted(failed):
            fail.add_metric([reason], failed[reason])
        yield fail
        writable = GaugeMetricFamily(
            "gpu_audit_spool_writable",
            "1 when the last commit of audit records to the spool succeeded, else 0.",
        )
        writable.add_metric([], stats["spool_writable"])
        yield writable
        last = GaugeMetricFamily(
            "gpu_audit_audit_last_seq",
            "Sequence number of the last audit record written, by stream; compare with the "
            "last seq `gpu-audit audit verify` finds in a sink to see records not yet there.",
            labels=["stream"],
        )
        last.add_metric([self._producer.stream], stats["last_seq"])
        yield last
