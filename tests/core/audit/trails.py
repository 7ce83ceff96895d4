"""A real producer's trail over the realistic snapshots, shared by the verify tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson

from gpu_audit.audit.canonical import ZERO_HASH, seal_reference
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.producer import AuditProducer
from tests.core.audit.factory import HOST, T0, advance, realistic
from tests.core.audit.fakes import MemorySpool

Trail = list[bytes]


def producer_trail(key: bytes | None = None, tmp: Path | None = None,
                   host: str = HOST) -> Trail:
    """The stored bytes of exporter_start, three cycles and exporter_stop (HMAC-keyed
    with `key`, written to `tmp`/k, when given)."""
    spool = MemorySpool()
    cfg = AuditConfig(interval_seconds=5.0)  # per cycle
    if key is not None:
        assert tmp is not None
        (tmp / "k").write_bytes(key)
        cfg = AuditConfig(interval_seconds=5.0, hmac_key_file=tmp / "k")
    ticks = iter(range(10**6))
    p = AuditProducer(cfg, spool, host=host, exporter_version="0.1.0", simulated=False,
                      clock=lambda: T0 - 100 + next(ticks))
    p.start()
    s = realistic()
    for _ in range(3):
        p.on_snapshot(s)
        s = advance(s)
    p.stop()
    return list(spool.payloads)


def reference_chain(records: list[dict[str, Any]], key: bytes | None) -> Trail:
    """The stored bytes of `records` chained from seq 1 by seal_reference(): the plain
    path the producer's fast one is held to."""
    out, h = [], ZERO_HASH
    for seq, rec in enumerate(records, 1):
        stored = seal_reference(rec, seq, h, key)
        out.append(stored)
        h = orjson.loads(stored)["hash"]
    return out


def exporter_chain(report: Any) -> Any:
    """The one `exporter@<host>` chain of a verify report (chains are per host and stream)."""
    (chain,) = [v for k, v in report.streams.items() if k.startswith("exporter@")]
    return chain
