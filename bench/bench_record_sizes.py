"""Audit record volume for capacity planning: bytes of records per GPU-hour as the real
producer writes them (built, chained and serialised: the bytes the spool and the archive
store), for the default interval trail (audit.interval_seconds 60, samples every 5 s,
schema 3) and the per-cycle trail (every sample, schema 2); one process per GPU (the
usual training job) and the 8 GPU x 64 process node of bench_audit.py. These are the
inputs of docs/SCALING.md.

    .venv/bin/python bench/bench_record_sizes.py [--hours 2] [--json out.json]

The samples vary as real ones do: utilisation in whole percent, a random walk; memory in
MiB; the energy counter in millijoules; sampling times with a few milliseconds of jitter.
The first hour warms up (process_start events, the first interval), the last is
measured. `es_source` is the `_source` the Elasticsearch sink indexes (schema 3 gains a
`time` field there). Not a timing: sizes and counts only.
"""

from __future__ import annotations

import argparse
import json
import random
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.model.attribution import AttributedProcess, Attribution
from gpu_audit.model.samples import (
    BackendInfo,
    GpuInfo,
    GpuSample,
    ProcessIdentity,
    ProcessSample,
)
from gpu_audit.model.snapshot import Snapshot
from shipper.sinks.base import SinkRecord
from shipper.sinks.elasticsearch.config import ElasticsearchSinkConfig
from shipper.sinks.elasticsearch.encode import source_bytes

GIB = 1024**3
MIB = 1024**2
HOST = "gpu-node-0042"
T0 = 1_796_000_000.0 - 1_796_000_000.0 % 3600  # on the hour


class _Spool:
    def __init__(self) -> None:
        self.payloads: list[bytes] = []

    def commit(self, payloads: list[bytes]) -> int:
        self.payloads.extend(payloads)
        return 0

    def last_payload(self) -> bytes | None:
        return None

    def close(self) -> None:
        pass


class Node:
    """A node's GPUs and processes, sampled with realistic noise."""

    def __init__(self, n_gpus: int, n_procs: int, seed: int) -> None:
        self.rng = random.Random(seed)
        self.n_gpus, self.n_procs = n_gpus, n_procs
        self.util = [0.6] * n_gpus
        self.energy = [1.0e6 + 1e4 * i for i in range(n_gpus)]
        self.owners = {}
        for i in range(n_gpus):
            for j in range(n_procs):
                pid = 200_000 + i * 1000 + j
                self.owners[pid] = Attribution(
                    user=f"user{(i * n_procs + j) % 37:02d}", project=f"proj-{(i + j) % 5}",
                    job=f"slurm-{4_000_000 + i * 100 + j % 4}",
                    sources={"user": "jobmap", "project": "jobmap", "job": "jobmap"})

    def sample(self, ts: float, elapsed: float) -> Snapshot:
        rng = self.rng
        gpus, procs = [], {}
        for i in range(self.n_gpus):
            self.util[i] = min(1.0, max(0.0, self.util[i] + rng.choice((-2, -1, 0, 1, 2)) / 100))
            util = round(self.util[i], 2)
            power = 120.0 + 280.0 * util + rng.random() * 5
            self.energy[i] += round(power * elapsed, 3)
            mem_used = (20 * 1024 + rng.randrange(0, 2048)) * MIB
            uuid = f"GPU-{i:08x}-5f3a-4e1b-9c2d-{0xA1B2C3D4E5F6 + i:012x}"
            values = {"utilization_gpu": {(): util}, "memory_used": {(): float(mem_used)},
                      "power_usage": {(): round(power, 3)}, "energy": {(): self.energy[i]},
                      "memory_total": {(): 80.0 * GIB}, "temperature_gpu": {(): 61.0}}
            ps = tuple(
                ProcessSample(
                    pid=200_000 + i * 1000 + j, name="python3", uid=1000 + j % 8,
                    used_memory_bytes=mem_used // self.n_procs - rng.randrange(0, 64) * MIB,
                    sm_util_ratio=round(util / self.n_procs, 2), memory_util_ratio=0.2,
                    identity=ProcessIdentity(pid=200_000 + i * 1000 + j,
                                             start_time_ticks=81_234_567 + j))
                for j in range(self.n_procs))
            gpus.append(GpuSample(info=GpuInfo(uuid=uuid, index=i, name="NVIDIA H100 80GB HBM3"),
                                  values=values, processes=ps))
            procs[uuid] = tuple(AttributedProcess(uuid, p, self.owners[p.pid]) for p in ps)
        return Snapshot(timestamp=ts, host=HOST, backend=BackendInfo(name="bench"),
                        gpus=tuple(gpus), processes=procs, interval_seconds=5.0,
                        elapsed_seconds=elapsed, cycle=0)


def measure(n_gpus: int, n_procs: int, interval: float, hours: int) -> dict[str, Any]:
    node = Node(n_gpus, n_procs, seed=n_gpus * 100 + n_procs)
    spool = _Spool()
    clock = iter([T0 - 1.0, T0 + hours * 3600 + 1.0])
    p = AuditProducer(AuditConfig(interval_seconds=interval), spool, host=HOST,
                      exporter_version="bench", simulated=False, clock=lambda: next(clock))
    p.start()
    rng = random.Random(7)
    ts, prev = T0 + 0.003, None
    while ts < T0 + hours * 3600:
        p.on_snapshot(node.sample(ts, ts - prev if prev is not None else 0.0))
        prev, ts = ts, T0 + round((ts - T0) / 5.0 + 1) * 5.0 + rng.uniform(0.001, 0.009)
    p.stop()
    es_cfg = ElasticsearchSinkConfig(type="elasticsearch")
    last_hour = (T0 + (hours - 1) * 3600) * 1e9
    count: dict[str, int] = defaultdict(int)
    raw: dict[str, int] = defaultdict(int)
    es: dict[str, int] = defaultdict(int)
    for payload in spool.payloads:
        doc = orjson.loads(payload)
        if doc["time_ns"] <= last_hour or doc.get("event") == "exporter_stop":
            continue
        kind = doc["kind"] if doc["kind"] != "event" else f"event:{doc['event']}"
        count[kind] += 1
        raw[kind] += len(payload) + 1  # the archive's newline
        es[kind] += len(source_bytes(
            SinkRecord(offset=0, record_id=doc["id"], doc=doc, raw=payload), es_cfg))
    total = sum(count.values())
    return {
        "node": f"{n_gpus} GPUs x {n_procs} processes per GPU",
        "audit_interval_seconds": interval, "sample_interval_seconds": 5.0,
        "records_per_gpu_hour": total / n_gpus,
        "bytes_per_gpu_hour": sum(raw.values()) / n_gpus,
        "bytes_per_record": sum(raw.values()) / total,
        "es_source_bytes_per_gpu_hour": sum(es.values()) / n_gpus,
        "by_kind": {k: {"per_gpu_hour": count[k] / n_gpus, "bytes": raw[k] / count[k],
                        "es_source_bytes": es[k] / count[k]} for k in sorted(count)},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hours", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    results = [measure(8, 1, 60.0, args.hours), measure(8, 1, 5.0, args.hours),
               measure(8, 64, 60.0, args.hours), measure(8, 64, 5.0, args.hours)]
    for r in results:
        trail = ("interval trail (60 s, schema 3)" if r["audit_interval_seconds"] > 5
                 else "per-cycle trail (5 s, schema 2)")
        print(f"{r['node']}, {trail}: {r['bytes_per_gpu_hour'] / 1000:.1f} KB per GPU-hour, "
              f"{r['records_per_gpu_hour']:.0f} records of {r['bytes_per_record']:.0f} B "
              f"(Elasticsearch _source {r['es_source_bytes_per_gpu_hour'] / 1000:.1f} KB)")
        for kind, k in r["by_kind"].items():
            print(f"  {kind:<24} {k['per_gpu_hour']:9.2f} per GPU-hour  {k['bytes']:7.0f} B"
                  f"  es {k['es_source_bytes']:7.0f} B")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
