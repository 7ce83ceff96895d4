"""Disk full: a tiny spool limit refuses records (counted, alerted), loses nothing that was
acknowledged, and accepts records again once the shipper's GC frees delivered segments."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry

from gpu_audit.spool import SpoolFull, SpoolWriter
from gpu_audit.spool.config import SpoolConfig
from shipper.config import ShipperConfig
from shipper.engine import Shipper
from tests.polling import wait_for
from tests.shipper.memsinks import MemorySink, record


def _value(shipper: Shipper, name: str, labels: dict[str, str]) -> float | None:
    reg = CollectorRegistry()
    reg.register(shipper.collector())
    return reg.get_sample_value(name, labels)


def test_full_spool_refuses_counts_alerts_and_recovers_after_gc(
    tmp_path: Path, fast_config: ShipperConfig
) -> None:
    """With the only sink down the spool fills up: commits raise SpoolFull(max_bytes), the
    refused records are counted and gpu_audit_spool_full{reason="max_bytes"} is 1. When
    the sink returns, GC frees the delivered segments, commits succeed again, the alert
    clears, and the sink holds exactly the acknowledged records, each once."""
    spool = SpoolConfig(
        directory=tmp_path / "spool",
        segment_bytes=4096,
        max_bytes=16384,
        min_free_bytes=0,
        fsync_window_ms=1,
    )
    writer = SpoolWriter(spool)
    sink = MemorySink("archive")
    sink.down = True
    shipper = Shipper(fast_config, spool, writer=writer, sinks=[sink])
    shipper.start()
    acked: list[int] = []
    refused = 0
    seq = 0
    try:
        while refused < 20:
            batch = [record(seq + i, size=300) for i in range(5)]
            try:
                writer.commit(batch)
                acked.extend(range(seq, seq + 5))
            except SpoolFull as exc:
                assert exc.reason == "max_bytes"
                refused += 5
            seq += 5
        assert len(acked) < 60  # the limit really bit
        full = {"reason": "max_bytes"}
        assert _value(shipper, "gpu_audit_spool_full", full) == 1
        assert _value(shipper, "gpu_audit_spool_refused_records_total", full) == refused
        assert shipper.stats()["spool"]["full_reason"] == "max_bytes"

        sink.down = False
        wait_for(lambda: sink.count() == len(acked), what="backlog delivered")

        next_seq = [seq]

        def accepted() -> bool:
            # the same size as the refused batches: only freed space can let it in
            first = next_seq[0]
            try:
                writer.commit([record(first + i, size=300) for i in range(5)])
            except SpoolFull:
                return False
            acked.extend(range(first, first + 5))
            next_seq[0] = first + 5
            return True

        wait_for(accepted, what="the spool accepting records after GC")
        # the alert clears once appends succeed with no refusal since the last look
        wait_for(
            lambda: accepted() and _value(shipper, "gpu_audit_spool_full", {"reason": ""}) == 0,
            what="the spool_full alert clearing",
        )
        wait_for(lambda: sink.count() == len(acked), what="last record delivered")
        assert shipper.stats()["spool"]["gc_freed_bytes"] > 0
        ok = _value(shipper, "gpu_audit_shipper_conservation_ok", {"sink": "archive"})
        assert ok == 1
    finally:
        shipper.stop(5)
        writer.close()
    expected = {orjson_id(s) for s in acked}
    assert set(sink.docs) == expected
    assert sink.duplicates() == 0


def orjson_id(seq: int) -> str:
    return f"test-{seq:012d}"
