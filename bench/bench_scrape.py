"""Render cost per cycle and scrape latency under 20 concurrent scrapers.

Compares, in one run, our design (render once per cycle into cached bytes; a scrape sends
them) with the obvious alternative (a prometheus_client custom collector that builds the
families from the snapshot on every scrape, served by generate_latest), on the same HTTP
server. Snapshots are hand-made: 1, 8, 16 GPUs x 8 processes and 8 GPUs x 64 processes.

    .venv/bin/python bench/bench_scrape.py [--scrapes 50] [--json out.json]

Scrapers run in a child process (20 threads, keep-alive http.client); RSS is the server
process's (the bench process, which also holds the snapshots).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily

from exporter.exposition.render import RenderOptions, render_snapshot
from gpu_audit.http.server import MetricsServer
from gpu_audit.http.state import LatestState
from gpu_audit.model.attribution import AttributedProcess, Attribution
from gpu_audit.model.fields import CATALOGUE
from gpu_audit.model.samples import BackendInfo, GpuInfo, GpuSample, ProcessSample
from gpu_audit.model.snapshot import Snapshot

GIB = 1024**3


def build_snapshot(n_gpus: int, n_procs: int) -> Snapshot:
    gpus, procs = [], {}
    for i in range(n_gpus):
        uuid = f"GPU-{i:08d}-0000-0000-0000-000000000000"
        values = {
            "utilization_gpu": {(): 0.5 + i / 100}, "utilization_memory": {(): 0.3},
            "utilization_encoder": {(): 0.0}, "utilization_decoder": {(): 0.0},
            "memory_total": {(): 80 * GIB}, "memory_used": {(): 40 * GIB},
            "memory_free": {(): 40 * GIB}, "memory_reserved": {(): GIB // 2},
            "temperature_gpu": {(): 60.0 + i}, "temperature_memory": {(): 70.0},
            "power_usage": {(): 300.5}, "power_limit": {(): 400.0},
            "energy": {(): 123456789.5}, "clock_sm": {(): 1.41e9},
            "clock_memory": {(): 1.593e9}, "fan_speed": {(): 0.4},
            "performance_state": {(): 0},
            "clock_event_reason": {(r,): 0 for r in ("gpu_idle", "sw_power_cap", "hw_slowdown",
                                                     "sw_thermal_slowdown",
                                                     "hw_thermal_slowdown")},
            "ecc_errors": {(k, c): 0 for k in ("corrected", "uncorrected")
                           for c in ("volatile", "aggregate")},
            "remapped_rows": {("correctable",): 0, ("uncorrectable",): 0},
            "pcie_replay": {(): 0},
            "nvlink_up": {(str(link),): 1 for link in range(12)},
        }
        ps = tuple(ProcessSample(pid=10000 + i * 1000 + j, name="python", uid=1000 + j % 8,
                                 used_memory_bytes=(j + 1) * 64 * 1024**2,
                                 sm_util_ratio=0.01 * (j % 10), memory_util_ratio=0.02)
                   for j in range(n_procs))
        gpus.append(GpuSample(info=GpuInfo(uuid=uuid, index=i, name="NVIDIA H100",
                                           pci_bus_id=f"00000000:{i:02x}:00.0",
                                           driver_version="550.54"),
                              values=values, processes=ps))
        procs[uuid] = tuple(
            AttributedProcess(uuid, p, Attribution(user=f"user{p.uid}", project="p",
                                                   job=f"job{p.pid % 16}",
                                                   sources={"user": "owner", "job": "environ"}))
            for p in ps)
    return Snapshot(timestamp=time.time(), host="bench", backend=BackendInfo(name="nvml"),
                    gpus=tuple(gpus), processes=procs, sample_duration_seconds=0.01)


class CollectOnScrape:
    """The alternative: build families from the snapshot on every scrape."""

    def __init__(self, snap: Snapshot) -> None:
        self.snap = snap

    def collect(self) -> Iterator[GaugeMetricFamily]:
        for m in CATALOGUE:
            f = GaugeMetricFamily(m.name.removesuffix("_total"), m.full_help,
                                  labels=["gpu", "uuid", *m.labels])
            for g in self.snap.gpus:
                for lv, v in g.values.get(m.key, {}).items():
                    f.add_metric([str(g.info.index), g.uuid, *lv], v)
            yield f
        f = GaugeMetricFamily("gpu_process_memory_used_bytes", "x",
                              labels=["gpu", "uuid", "user", "project", "job", "process_name"])
        for g in self.snap.gpus:
            for ap in self.snap.processes.get(g.uuid, ()):
                a = ap.attribution
                f.add_metric([str(g.info.index), g.uuid, a.user, a.project, a.job,
                              ap.process.name], ap.process.used_memory_bytes or 0)
        yield f


def cpu_ms(fn: object, n: int) -> float:
    t = time.process_time()
    for _ in range(n):
        fn()  # type: ignore[operator]
    return (time.process_time() - t) / n * 1000


def scrape_latency(port: int, scrapers: int, per: int) -> tuple[float, float]:
    lat: list[float] = []
    lock = threading.Lock()

    def worker() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine = []
        for _ in range(per):
            t = time.perf_counter()
            conn.request("GET", "/metrics")
            conn.getresponse().read()
            mine.append(time.perf_counter() - t)
        conn.close()
        with lock:
            lat.extend(mine)

    threads = [threading.Thread(target=worker) for _ in range(scrapers)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    lat.sort()
    return statistics.median(lat) * 1000, lat[int(len(lat) * 0.99) - 1] * 1000


def scrape_latency_in_child(port: int, scrapers: int, per: int) -> tuple[float, float]:
    """Run the scrapers in another process so they do not share the server's GIL."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        return pool.apply(scrape_latency, (port, scrapers, per))


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scrapes", type=int, default=50, help="scrapes per scraper thread")
    ap.add_argument("--scrapers", type=int, default=20)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    rows = []
    for gpus, procs in ((1, 8), (8, 8), (16, 8), (8, 64)):
        snap = build_snapshot(gpus, procs)
        opts = RenderOptions()
        rendered = render_snapshot(snap, opts)
        render = cpu_ms(lambda s=snap, o=opts: render_snapshot(s, o), 50)
        render_compat = cpu_ms(lambda s=snap: render_snapshot(s, RenderOptions(dcgm_compat=True)),
                               50)
        alt_reg = CollectorRegistry()
        alt_reg.register(CollectOnScrape(snap))  # type: ignore[arg-type]
        alt = cpu_ms(lambda r=alt_reg: generate_latest(r), 50)

        state = LatestState(stale_after_seconds=60)
        state.set_backend(True)
        state.publish(snap, rendered)
        ours = MetricsServer("127.0.0.1", 0, state)
        ours.start()
        p50, p99 = scrape_latency_in_child(ours.port, args.scrapers, args.scrapes)
        ours.stop()
        empty = LatestState(stale_after_seconds=60)
        alt_srv = MetricsServer("127.0.0.1", 0, empty, registry=alt_reg)
        alt_srv.start()
        a50, a99 = scrape_latency_in_child(alt_srv.port, args.scrapers, args.scrapes)
        alt_srv.stop()
        rows.append({"gpus": gpus, "procs_per_gpu": procs, "series": rendered.series,
                     "body_kb": round(len(rendered.body) / 1024, 1),
                     "render_cpu_ms": round(render, 3),
                     "render_compat_cpu_ms": round(render_compat, 3),
                     "collect_on_scrape_cpu_ms": round(alt, 3),
                     "scrape_p50_ms": round(p50, 3), "scrape_p99_ms": round(p99, 3),
                     "alt_scrape_p50_ms": round(a50, 3), "alt_scrape_p99_ms": round(a99, 3),
                     "rss_mb": round(rss_mb(), 1)})
    head = list(rows[0])
    print(" ".join(f"{h:>24}" if i > 2 else f"{h:>8}" for i, h in enumerate(head)))
    for r in rows:
        print(" ".join(f"{r[h]!s:>24}" if i > 2 else f"{r[h]!s:>8}" for i, h in enumerate(head)))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
