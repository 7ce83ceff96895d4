"""A fast synthetic writer of month-long archives for the verification and chargeback
benchmarks: schema-3 usage records (one per GPU and holder per minute, the default
cadence) shaped as the real producer writes them (bench_record_sizes.py measures the real
one: ~780 B at one process per GPU), hash-chained with core's `seal` and written through
the real archive sink, which closes, compresses and seals a part per host and day.

    .venv/bin/python bench/synth_archive.py DIR --hosts 8 --gpus 8 --days 30 [--workers 2]

Simulating the samples (12 per GPU-minute) would take hours for 1,000 GPUs; the records
here are built directly: each host's 8 GPUs, one training job per GPU that changes owner
every few hours (process_end / process_start events), now and then a free GPU, usage
with realistic noise. Every record is `sim: true`-free (a bill of it needs no
--include-simulated) and says nothing else than what a real one would.

This module never writes outside DIR; DIR must be empty or new.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing
import os
import random
import shutil
import sys
import time
from pathlib import Path
from typing import Any

from gpu_audit.audit.canonical import (
    SCHEMA_ID,
    SCHEMA_V3,
    ZERO_HASH,
    format_time_ns,
    load_hmac_key,
    seal,
)
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.archive.sink import ArchiveSink
from shipper.sinks.base import SinkRecord

START_NS = 1_793_491_200 * 1_000_000_000  # 2026-11-01T00:00:00Z
MINUTE_NS = 60 * 1_000_000_000
MODEL = "NVIDIA H100 80GB HBM3"
GIB = 1024**3


class Host:
    """One node's stream: its chain, its GPUs' jobs."""

    def __init__(self, index: int, gpus: int, key: bytes | None = None) -> None:
        self.key = key
        self.name = f"gpu-node-{index:04d}"
        self.rng = random.Random(index)
        self.seq, self.prev = 0, ZERO_HASH
        self.gpus = [f"GPU-{index:06x}{g:02x}-5f3a-4e1b-9c2d-a1b2c3d4e5f6" for g in range(gpus)]
        self.jobs: list[tuple[str, str, str, int] | None] = [None] * gpus
        self.util = [0.6] * gpus

    def _id(self, *parts: object) -> str:
        return hashlib.blake2b("\x1f".join(map(str, parts)).encode(),
                               digest_size=16).hexdigest()

    def chain(self, rec: dict[str, Any]) -> tuple[dict[str, Any], bytes]:
        self.seq += 1
        raw = seal(rec, self.seq, self.prev, self.key)
        self.prev = rec["hash"]
        return rec, raw

    def event(self, t: int, event: str, **extra: Any) -> tuple[dict[str, Any], bytes]:
        rec: dict[str, Any] = {
            "schema": SCHEMA_ID, "kind": "event", "event": event,
            "id": self._id(self.name, t, event, extra), "stream": "exporter",
            "host": self.name, "time": format_time_ns(t), "time_ns": t,
            "interval_seconds": 5.0, "elapsed_seconds": 0.0, "simulated": False,
            "exporter_version": "synth", **extra}
        return self.chain(rec)

    def minute(self, t: int) -> list[tuple[dict[str, Any], bytes]]:
        """The records of the minute ending at t: job changes, then usage."""
        rng = self.rng
        out: list[tuple[dict[str, Any], bytes]] = []
        for g, uuid in enumerate(self.gpus):
            job = self.jobs[g]
            if job is None or rng.random() < 1 / 240:  # a job lasts ~4 h
                if job is not None:
                    out.append(self.event(t, "process_end", gpu={"uuid": uuid, "index": g,
                                                                  "name": MODEL, "up": True},
                                          process={"pid": job[3], "type": "compute"},
                                          attributed=True))
                if rng.random() < 0.1:
                    job = None  # a free GPU for a while
                else:
                    job = (f"user{rng.randrange(60):02d}", f"proj-{rng.randrange(12)}",
                           f"slurm-{rng.randrange(10**6, 10**7)}", rng.randrange(1000, 4_000_000))
                    out.append(self.event(t, "process_start", gpu={"uuid": uuid, "index": g,
                                                                    "name": MODEL, "up": True},
                                          process={"pid": job[3], "type": "compute",
                                                   "name": "python3"}, attributed=True,
                                          attribution={"user": job[0], "project": job[1],
                                                       "job": job[2],
                                                       "sources": {"user": "jobmap"}}))
                self.jobs[g] = job
            out.append(self.chain(self._usage(t, g, uuid, job)))
        return out

    def _usage(self, t: int, g: int, uuid: str, job: tuple[str, str, str, int] | None,
               ) -> dict[str, Any]:
        rng = self.rng
        dt = round(60 + rng.uniform(-0.005, 0.005), 3)
        util = self.util[g] = (min(1.0, max(0.05, self.util[g] + rng.uniform(-0.05, 0.05)))
                               if job else 0.0)
        power = 120 + 280 * util
        energy = round(power * dt * 1000)
        mem = (20 * 1024 + rng.randrange(2048)) * 1024**2 if job else 0
        rec: dict[str, Any] = {
            "schema": SCHEMA_V3, "kind": "usage",
            "id": self._id(self.name, t, uuid, job[:2] if job else ""), "stream": "exporter",
            "host": self.name, "time_ns": t, "dt": dt, "n": 12, "uuid": uuid, "idx": g,
            "model": MODEL, "gs": dt, "ge": energy, "gpe": energy - rng.randrange(100),
            "gms": round(mem * dt), "gmx": mem + rng.randrange(64) * 1024**2,
            "gua": round(util, 4), "gux": round(min(1.0, util + 0.07), 2)}
        if util < 0.05 and job:
            rec["gi"] = dt
        if job is not None:
            busy = round(util * dt, 3)
            rec.update({"user": job[0], "project": job[1], "s": dt, "c": dt, "b": busy,
                        "e": energy, "pe": rec["gpe"], "ms": round(mem * dt),
                        "tasks": [{"pid": job[3], "s": dt, "st": 81_234_567, "name": "python3",
                                   "job": job[2], "mx": rec["gmx"], "ua": round(util, 4),
                                   "ux": rec["gux"]}]})
        return rec


def _write(directory: Path, host_ids: list[int], gpus: int, days: int,
           key: bytes | None = None) -> int:
    sink = ArchiveSink(ArchiveSinkConfig.model_validate(
        {"type": "archive", "directory": directory, "fsync": False}), "archive", directory,
        seal_key=key)
    sink.start()
    hosts = [Host(i, gpus, key) for i in host_ids]
    offset, n = 0, 0
    batch: list[tuple[dict[str, Any], bytes]] = []

    def flush() -> None:
        nonlocal offset, batch
        recs = [SinkRecord(offset=offset + i, record_id=doc["id"], doc=doc, raw=raw)
                for i, (doc, raw) in enumerate(batch)]
        offset += len(recs)
        sink.send(recs)
        batch = []

    for h in hosts:
        batch.append(h.event(START_NS - 30 * 10**9, "exporter_start"))
    for minute in range(1, days * 1440 + 1):
        t = START_NS + minute * MINUTE_NS + 2_000_000
        for h in hosts:
            recs = h.minute(t)
            batch += recs
            n += len(recs)
        if len(batch) >= 4000:
            flush()
    flush()
    sink.close()
    return n


def write_archive(directory: Path, *, hosts: int, gpus: int, days: int,
                  workers: int = 1, key: bytes | None = None) -> int:
    """Write the archive; the number of usage and event records. `key`: the trail's
    HMAC key (records and seals keyed, as audit.hmac_key_file makes them)."""
    directory.mkdir(parents=True, exist_ok=True)
    if any(directory.iterdir()):
        raise SystemExit(f"{directory} is not empty")
    if workers <= 1:
        return _write(directory, list(range(hosts)), gpus, days, key)
    # each worker its own sink and directory (one journal per sink), then moved together
    shares = [list(range(w, hosts, workers)) for w in range(workers)]
    tmp = [directory / f".w{w}" for w in range(workers)]
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        counts = pool.starmap(_write, [(d, s, gpus, days, key)
                                       for d, s in zip(tmp, shares, strict=True)])
    for d in tmp:
        for f in d.iterdir():
            if not f.name.startswith("."):
                os.replace(f, directory / f.name)
        shutil.rmtree(d)
    return sum(counts)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("directory", type=Path)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--key-file", type=Path, default=None,
                    help="key the records and seals with this file's secret")
    args = ap.parse_args()
    t0 = time.monotonic()
    key = load_hmac_key(args.key_file) if args.key_file is not None else None
    n = write_archive(args.directory, hosts=args.hosts, gpus=args.gpus, days=args.days,
                      workers=args.workers, key=key)
    size = sum(f.stat().st_size for f in args.directory.iterdir())
    print(f"{n} records, {args.hosts * args.gpus} GPUs x {args.days} days, {size / 1e6:.0f} MB "
          f"on disk, written in {time.monotonic() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
