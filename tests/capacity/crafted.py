"""A crafted trail and launcher history whose capacity figures are known by hand.

Four GPUs of one node, three hours from DAY 00:00, a cycle every 300 s (the real
producer, the real archive sink). Per hour h0, h1, h2:
- GPU 0: alice, utilisation 1.0 throughout (allocated and busy);
- GPU 1: bob holds it at utilisation 0 in h0 and h1 (held idle), free in h2;
- GPU 2: free in h0; alice at 0.5 in h1 and h2;
- GPU 3: free in h0; alice at 0.9 in h1; down in h2.
So (GPU-hours) installed 4/4/4, down 0/0/1, allocated 2/4/2, busy 1.0/2.4/1.5,
held idle 1/1/0, free 2/0/1; allocated is >= 90 % of installed in h1 only.

The launcher store: job A (1 GPU) queued at 00:00, started 00:30; job B (2 GPUs) queued
01:00, started 02:30; job C (1 GPU) queued 02:00, still waiting. Queued GPU-hours
0.5 + 3 + 1 = 4.5; waits 0.5 h, 1.5 h, 1.0 h (C's so far); while GPUs were held idle:
h0 min(0.5, 1) + h1 min(2, 1) + h2 min(2, 0) = 1.5 GPU-hours.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import orjson

from gpu_audit.model.samples import GpuSample
from launcher.spec import JobSpec
from launcher.store import Event, Store
from tests.chargeback.archives import produce, write_archive
from tests.core.audit.factory import ALICE, BOB, gpu, proc, snapshot

DAY = dt.datetime(2026, 11, 3, tzinfo=dt.UTC)
DAY_S = DAY.timestamp()
END = DAY + dt.timedelta(hours=3)
STEP = 300.0
HOUR = 3600.0


def _gpus(k: int) -> list[GpuSample]:
    """The GPUs of the cycle ending at DAY + k x STEP (its interval is in hour h)."""
    h = (k - 1) // 12 if k > 0 else 0
    e = 1000.0 * k
    g0 = gpu(0, util=1.0, energy=e, processes=[proc(101, sm=1.0)])
    g1 = (gpu(1, util=0.0, energy=e, processes=[proc(201, sm=0.0)]) if h < 2
          else gpu(1, util=0.0, energy=e))
    g2 = (gpu(2, util=0.0, energy=e) if h == 0
          else gpu(2, util=0.5, energy=e, processes=[proc(301, sm=0.5)]))
    if h == 0:
        g3 = gpu(3, util=0.0, energy=e)
    elif h == 1:
        g3 = gpu(3, util=0.9, energy=e, processes=[proc(401, sm=0.9)])
    else:
        g3 = gpu(3, up=False)
    return [g0, g1, g2, g3]


def trail_records() -> list[bytes]:
    """The trail's records as the real producer stores them."""
    owners = {101: ALICE, 201: BOB, 301: ALICE, 401: ALICE}
    snaps = [snapshot(DAY_S + STEP * k, _gpus(k), owners, interval=STEP) for k in range(37)]
    return produce(snaps, host="gpu-node-01", start_s=DAY_S - 10,
                   stop_s=DAY_S + 3 * HOUR + 10)


def write_trail(root: Path) -> Path:
    """The archive and a gpu-audit configuration naming it; returns the configuration."""
    archive = root / "archive"
    write_archive(archive, trail_records())
    config = root / "gpu-audit.yaml"
    config.write_text(
        f"spool:\n  directory: {orjson.dumps(str(root / 'spool')).decode()}\n"
        "shipper:\n  sinks:\n  - type: archive\n"
        f"    directory: {orjson.dumps(str(archive)).decode()}\n", encoding="utf-8")
    return config


def write_store(path: Path) -> Path:
    store = Store(path)
    try:
        def job(name: str, gpus: int, queued: float, started: float | None) -> None:
            (job_id,) = store.add_jobs([JobSpec(name=name, command=["x"], gpus=gpus)],
                                       20_001, "alice", DAY_S + queued)
            if started is None:
                return
            store.update(job_id, state="succeeded", started_at=DAY_S + started,
                         finished_at=DAY_S + started + 600, allocated_gpu_seconds=600 * gpus,
                         measured_gpu_seconds=300 * gpus)
            store.add_event(Event(DAY_S + started, job_id, "started", {
                "attempt": 1, "gpus": [f"GPU-{i}" for i in range(gpus)],
                "waited_seconds": started - queued}))

        job("a", 1, 0.0, 0.5 * HOUR)
        job("b", 2, 1.0 * HOUR, 2.5 * HOUR)
        job("c", 1, 2.0 * HOUR, None)
    finally:
        store.close()
    return path
