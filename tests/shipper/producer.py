"""A producer process for the crash test and the bench: hash-chained audit records into a
spool through SpoolWriter.commit (acknowledged only after the group-commit fsync).

    python -m tests.shipper.producer SPOOL_DIR COUNT [--batch B] [--pause S] [--pad P]

Records are sealed with the audit module's own hash chain (`canonical.seal`), so
`audit verify` can check them wherever they are delivered. Every record has its own
series key (pid) and a distinct millisecond, so InfluxDB and VictoriaMetrics store one
point per record. Prints the acknowledged count at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path
from typing import Any

from gpu_audit.audit.canonical import SCHEMA_ID, ZERO_HASH, seal
from gpu_audit.spool import SpoolWriter
from gpu_audit.spool.config import SpoolConfig

STREAM = "node-1/exporter"


def make_doc(seq: int, time_ns: int, pad: int = 0) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "kind": "process",
        "stream": STREAM,
        "time_ns": time_ns,
        "host": "node-1",
        "gpu": {"uuid": f"GPU-{seq % 8:08d}-aaaa", "index": seq % 8, "name": "H100"},
        "process": {"pid": 100000 + seq, "name": "python", "uid": 1000},
        "attribution": {"user": "alice", "project": "vision", "job": "j-17"},
        "values": {"memory_used_bytes": float(1024 * seq), "sm_utilization_ratio": 0.5},
        "simulated": True,
    }
    if pad:
        doc["note"] = "x" * pad
    doc["id"] = hashlib.blake2b(f"{STREAM}/{seq}/{time_ns}".encode(), digest_size=16).hexdigest()
    return doc


def chained(count: int, start_ns: int, pad: int = 0) -> list[bytes]:
    """`count` sealed records, seq 1..count, 1 ms apart from start_ns."""
    out = []
    prev = ZERO_HASH
    for seq in range(1, count + 1):
        doc = make_doc(seq, start_ns + seq * 1_000_000, pad)
        out.append(seal(doc, seq, prev, None))
        prev = doc["hash"]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("spool", type=Path)
    p.add_argument("count", type=int)
    p.add_argument("--batch", type=int, default=50)
    p.add_argument("--pause", type=float, default=0.0)
    p.add_argument("--pad", type=int, default=0)
    p.add_argument("--start-ns", type=int, default=0)
    args = p.parse_args(argv)
    start_ns = args.start_ns or (time.time_ns() // 1_000_000_000 - 3600) * 1_000_000_000
    records = chained(args.count, start_ns, args.pad)
    cfg = SpoolConfig(directory=args.spool, segment_bytes=256 * 1024, min_free_bytes=0,
                      fsync_window_ms=2)
    acked = 0
    with SpoolWriter(cfg) as writer:
        for i in range(0, len(records), args.batch):
            chunk = records[i : i + args.batch]
            writer.commit(chunk)
            acked += len(chunk)
            if args.pause:
                time.sleep(args.pause)
    print(acked, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
