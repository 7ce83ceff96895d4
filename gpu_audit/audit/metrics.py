"""Self-metrics of the audit producer for the live /metrics registry.

A custom collector: fresh metric families on every collect, read from the producer's
counters; it must never mutate the producer or hold its lock across a scrape. Names,
types and HELP come from gpu_audit.selfmetrics (documented in docs/METRICS.md).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpu_audit import selfmetrics as sm
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.audit.witness import HASH_PARTS, hash_words


class AuditCollector(Collector):
    """gpu_audit_records_written_total, gpu_audit_records_failed_total{reason},
    gpu_audit_spool_writable, gpu_audit_audit_last_seq, gpu_audit_audit_head{host,
    stream, part} (the chain head's witness: gpu_audit.audit.witness)."""

    def __init__(self, producer: AuditProducer) -> None:
        self._producer = producer

    def collect(self) -> Iterator[Metric]:
        stats = self._producer.stats()
        failed = self._producer.failed_by_reason()
        yield sm.RECORDS_WRITTEN.counter(value=stats["records_written"])
        fail = sm.RECORDS_FAILED.counter()
        for reason, n in sm.RECORDS_FAILED.with_known(failed):
            fail.add_metric([reason], n)
        yield fail
        yield sm.SPOOL_WRITABLE.gauge(value=stats["spool_writable"])
        last = sm.AUDIT_LAST_SEQ.gauge()
        last.add_metric([self._producer.stream], stats["last_seq"])
        yield last
        host, seq, h = self._producer.head()
        head = sm.AUDIT_HEAD.gauge()
        stream = self._producer.stream
        head.add_metric([host, stream, "seq"], seq)
        for part, word in zip(HASH_PARTS, hash_words(h), strict=True):
            head.add_metric([host, stream, part], word)
        yield head
