"""Audit record production: records/s built, hash-chained, serialised and spooled.

Compares, in one run, our design (AuditProducer: orjson canonical bytes, one group
commit = one fsync per cycle into a real SpoolWriter) with the naive approach (the same
records, serialised with the stdlib json module, each written and fsync'd on its own)
for an 8 GPU x 64 process node, and reports the ratio. Also reports the CPU-only cost of
building + chaining + serialising one cycle.

    .venv/bin/python bench/bench_audit.py [--cycles 40] [--repeat 3] [--dir DIR] [--json out.json]

Each approach runs `--repeat` times and the best run is reported; records/CPU-second is
shown next to wall-clock records/s because on a shared machine the wall clock mostly
measures the neighbours.

DIR should be on the disk the spool will live on (default: a temp dir in the current
directory), since fsync cost is most of the naive approach's time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from gpu_audit.audit.builder import PartsCache, build_cycle, build_records
from gpu_audit.audit.canonical import ZERO_HASH, seal_any
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.model.attribution import AttributedProcess, Attribution
from gpu_audit.model.samples import BackendInfo, GpuInfo, GpuSample, ProcessIdentity, ProcessSample
from gpu_audit.model.snapshot import Snapshot
from gpu_audit.spool import SpoolConfig, SpoolWriter

GIB = 1024**3
T0 = 1_796_000_000.0


def build_snapshot(n_gpus: int, n_procs: int, ts: float, energy: float) -> Snapshot:
    gpus, procs = [], {}
    for i in range(n_gpus):
        uuid = f"GPU-{i:08d}-0000-0000-0000-000000000000"
        values = {
            "utilization_gpu": {(): 0.5 + i / 100}, "utilization_memory": {(): 0.3},
            "memory_total": {(): 80 * GIB}, "memory_used": {(): 40 * GIB},
            "memory_free": {(): 40 * GIB}, "temperature_gpu": {(): 60.0 + i},
            "power_usage": {(): 300.5}, "power_limit": {(): 400.0},
            "energy": {(): energy + i * 10}, "clock_sm": {(): 1.41e9},
            "clock_memory": {(): 1.593e9}, "fan_speed": {(): 0.4},
            "clock_event_reason": {(r,): 0.0 for r in ("gpu_idle", "sw_power_cap")},
            "ecc_errors": {(k, c): 0.0 for k in ("corrected", "uncorrected")
                           for c in ("volatile", "aggregate")},
            "nvlink_up": {(str(link),): 1.0 for link in range(12)},
        }
        ps = tuple(
            ProcessSample(
                pid=10000 + i * 1000 + j, name="python", uid=1000 + j % 8,
                used_memory_bytes=(j + 1) * 64 * 1024**2, sm_util_ratio=(j % 10) / 100,
                memory_util_ratio=0.01,
                identity=ProcessIdentity(pid=10000 + i * 1000 + j, start_time_ticks=5000 + j),
            )
            for j in range(n_procs)
        )
        gpus.append(GpuSample(info=GpuInfo(uuid=uuid, index=i, name="NVIDIA H100 80GB HBM3"),
                              values=values, processes=ps))
        procs[uuid] = tuple(
            AttributedProcess(uuid, p, Attribution(
                user=f"user{p.pid % 8}", project=f"proj{p.pid % 3}", job=str(p.pid // 4),
                sources={"user": "owner", "project": "jobmap", "job": "jobmap"},
            ) if p.pid % 5 else Attribution())
            for p in ps
        )
    return Snapshot(timestamp=ts, host="bench-node", backend=BackendInfo(name="bench"),
                    gpus=tuple(gpus), processes=procs, interval_seconds=5.0)


def snapshots(n: int) -> list[Snapshot]:
    base = build_snapshot(8, 64, T0, 1e6)
    out = []
    for c in range(n):
        gpus = tuple(
            replace(g, values={**g.values, "energy": {(): 1e6 + c * 1500.0 + g.info.index}})
            for g in base.gpus
        )
        out.append(replace(base, timestamp=T0 + 5 * c, gpus=gpus))
    return out


def run_ours(snaps: list[Snapshot], directory: Path) -> dict[str, Any]:
    writer = SpoolWriter(SpoolConfig(directory=directory, min_free_bytes=0))
    producer = AuditProducer(AuditConfig(), writer, host="bench-node",
                             exporter_version="bench", simulated=False)
    producer.start()
    t0, c0 = time.perf_counter(), time.process_time()
    for s in snaps:
        producer.on_snapshot(s)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    writer.close()
    n = producer.stats()["records_written"] - 1  # minus exporter_start
    return {"records": n, "seconds": dt, "records_per_s": n / dt, "cpu_seconds": cpu,
            "records_per_cpu_s": n / cpu, "fsyncs": len(snaps),
            "ms_per_cycle": dt / len(snaps) * 1000}


def run_naive(snaps: list[Snapshot], directory: Path) -> dict[str, Any]:
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / "audit.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    prev_hash, seq, n = ZERO_HASH, 0, 0
    prev: Snapshot | None = None
    t0, c0 = time.perf_counter(), time.process_time()
    for s in snaps:
        for rec in build_records(s, prev, stream="exporter", exporter_version="bench"):
            seq += 1
            rec["seq"], rec["prev_hash"] = seq, prev_hash
            body = json.dumps(rec, sort_keys=True, separators=(",", ":")).encode()
            rec["hash"] = prev_hash = hashlib.sha256(prev_hash.encode() + body).hexdigest()
            os.write(fd, json.dumps(rec, sort_keys=True, separators=(",", ":")).encode() + b"\n")
            os.fsync(fd)
            n += 1
        prev = s
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    os.close(fd)
    return {"records": n, "seconds": dt, "records_per_s": n / dt, "cpu_seconds": cpu,
            "records_per_cpu_s": n / cpu, "fsyncs": n, "ms_per_cycle": dt / len(snaps) * 1000}


def run_cpu_only(snaps: list[Snapshot]) -> dict[str, Any]:
    prev: Snapshot | None = None
    h, seq, n, nbytes = ZERO_HASH, 0, 0, 0
    parts = PartsCache(fragments=True)  # as the producer builds them
    t0, c0 = time.perf_counter(), time.process_time()
    for s in snaps:
        for rec in build_cycle(s, prev, stream="exporter", exporter_version="bench",
                               parts=parts):
            seq += 1
            stored, h = seal_any(rec, seq, h, None)
            nbytes += len(stored)
            n += 1
        prev = s
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"records": n, "seconds": dt, "records_per_s": n / dt, "cpu_seconds": cpu,
            "records_per_cpu_s": n / cpu, "ms_per_cycle": dt / len(snaps) * 1000,
            "bytes_per_record": nbytes / n}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=40)
    ap.add_argument("--naive-cycles", type=int, default=4,
                    help="cycles for the naive run (one fsync per record is slow)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="runs per approach; the best is reported (shared machines are noisy)")
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-audit-", dir=args.dir or Path.cwd()))
    try:
        snaps = snapshots(args.cycles)

        def best(runs: list[dict[str, Any]]) -> dict[str, Any]:
            return max(runs, key=lambda r: r["records_per_s"])

        cpu = best([run_cpu_only(snaps) for _ in range(args.repeat)])
        ours = best([run_ours(snaps, work / f"spool{i}") for i in range(args.repeat)])
        naive = best([run_naive(snaps[: args.naive_cycles], work / f"naive{i}")
                      for i in range(args.repeat)])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    per_cycle = cpu["records"] // args.cycles
    result = {
        "node": "8 GPUs x 64 processes", "records_per_cycle": per_cycle,
        "cycles": args.cycles, "naive_cycles": args.naive_cycles, "repeat": args.repeat,
        "cpu_only": cpu, "ours": ours, "naive": naive,
        "ratio_ours_vs_naive": ours["records_per_s"] / naive["records_per_s"],
        "target_records_per_s": 50_000,
        "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(),
    }
    print(f"node: 8 GPUs x 64 processes, {per_cycle} records per cycle")
    print(f"{'approach':<40}{'records/s':>12}{'rec/CPU-s':>12}{'ms/cycle':>10}{'fsyncs':>8}")
    for name, r in (("build+chain+orjson (no I/O)", cpu),
                    ("ours: producer + group-commit spool", ours),
                    ("naive: json stdlib, write+fsync each", naive)):
        print(f"{name:<40}{r['records_per_s']:>12,.0f}{r['records_per_cpu_s']:>12,.0f}"
              f"{r['ms_per_cycle']:>10.2f}{r.get('fsyncs', '-'):>8}")
    met = "met" if ours["records_per_s"] >= 50_000 else "NOT met on this (shared) machine"
    print(f"ratio ours / naive: {result['ratio_ours_vs_naive']:.1f}x "
          f"(target >= 50,000 records/s: {met})")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
