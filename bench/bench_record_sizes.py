"""Audit record volume for capacity planning: records per GPU per interval and bytes per
record, by record kind (every process attributed), for a node running one process per
GPU (the usual training job) and for the 8 GPU x 64 process node of bench_audit.py.
These are the inputs of the Elasticsearch sizing in docs/SCALING.md.

    .venv/bin/python bench/bench_record_sizes.py [--cycles 20] [--json out.json]

Records are built, chained and serialised by the real builder (the bytes the spool and
the archive store); `es_source` is the `_source` the Elasticsearch sink indexes for it.
Not a timing: sizes and counts only.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_audit import T0, build_snapshot  # the same synthetic node

from gpu_audit.audit.builder import PartsCache, build_records
from gpu_audit.audit.canonical import ZERO_HASH, seal
from gpu_audit.model.attribution import Attribution
from gpu_audit.model.snapshot import Snapshot
from shipper.sinks.base import SinkRecord
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig
from shipper.sinks.elasticsearch.encode import source_bytes


def attributed(snap: Snapshot) -> Snapshot:
    """Every process owned (bench_audit leaves one in five unattributed, and with one
    process per GPU its pids all fall in that fifth): a job-mapping file's answer."""
    procs = {
        uuid: tuple(
            p if p.attribution.user else replace(p, attribution=Attribution(
                user=f"user{p.process.pid % 8}", project=f"proj{p.process.pid % 3}",
                job=str(p.process.pid // 4),
                sources={"user": "jobmap", "project": "jobmap", "job": "jobmap"}))
            for p in ps)
        for uuid, ps in snap.processes.items()
    }
    return replace(snap, processes=procs)


def measure(n_gpus: int, n_procs: int, cycles: int) -> dict[str, Any]:
    es_cfg = ElasticsearchSinkConfig(type="elasticsearch")
    prev = None
    h, seq = ZERO_HASH, 0
    parts = PartsCache(fragments=True)
    count: dict[str, int] = defaultdict(int)
    raw: dict[str, int] = defaultdict(int)
    es: dict[str, int] = defaultdict(int)
    measured_cycles = 0
    for c in range(cycles + 1):
        snap = attributed(build_snapshot(n_gpus, n_procs, T0 + 5 * c, 1e6 + c * 1500.0))
        for rec in build_records(snap, prev, stream="exporter", exporter_version="bench",
                                 parts=parts):
            seq += 1
            body = seal(rec, seq, h, None)
            h = rec["hash"]
            if c == 0:
                continue  # the first cycle measures no interval (process_start events only)
            kind = rec["kind"] if rec["kind"] != "event" else f"event:{rec['event']}"
            count[kind] += 1
            raw[kind] += len(body)
            sink_rec = SinkRecord(offset=seq, record_id=rec["id"], raw=body, doc=json.loads(body))
            es[kind] += len(source_bytes(sink_rec, es_cfg))
        prev = snap
        measured_cycles += c > 0
    total = sum(count.values())
    return {
        "node": f"{n_gpus} GPUs x {n_procs} processes per GPU",
        "cycles": measured_cycles,
        "records_per_gpu_per_interval": total / measured_cycles / n_gpus,
        "bytes_per_record": sum(raw.values()) / total,
        "es_source_bytes_per_record": sum(es.values()) / total,
        "by_kind": {k: {"per_cycle": count[k] / measured_cycles,
                        "bytes": raw[k] / count[k], "es_source_bytes": es[k] / count[k]}
                    for k in sorted(count)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=20)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    results = [measure(8, 1, args.cycles), measure(8, 64, args.cycles)]
    for r in results:
        print(f"{r['node']}: {r['records_per_gpu_per_interval']:.2f} records per GPU per "
              f"interval, {r['bytes_per_record']:.0f} bytes per record "
              f"(Elasticsearch _source {r['es_source_bytes_per_record']:.0f})")
        for kind, k in r["by_kind"].items():
            print(f"  {kind:<12} {k['per_cycle']:8.2f} per cycle  {k['bytes']:6.0f} B"
                  f"  es {k['es_source_bytes']:6.0f} B")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
