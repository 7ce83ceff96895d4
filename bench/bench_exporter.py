"""Exporter cost: one sampling cycle by stage, and a real exporter process under scrapes.

In-process, for 1, 8 and 16 GPUs x 8 processes and 8 GPUs x 64 processes (simulator
backend, so what is measured is our own overhead): CPU ms per cycle for sampling,
attribution against a fake /proc on disk, rendering, and audit records (build, hash,
serialise, group-commit fsync), each as median and p99 over N cycles.

Out of process (`gpu-audit exporter --backend sim` at the default 5 s interval): CPU
seconds per hour (from /proc/<pid>/stat over a measured window), RSS, and scrape
latency p50/p99 with 20 concurrent keep-alive scrapers.

    .venv/bin/python bench/bench_exporter.py [--cycles 60] [--window 30] [--json out.json]

wrk (Debian package) is used for the closed-loop scrape test when installed.
"""

from __future__ import annotations

import argparse
import gc
import http.client
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.attribution.config import AttributionConfig  # noqa: E402
from exporter.attribution.resolver import Resolver  # noqa: E402
from exporter.exposition.render import Renderer, RenderOptions  # noqa: E402
from exporter.sim.backend import SimBackend  # noqa: E402
from exporter.sim.fakeproc import SimProcfs  # noqa: E402
from exporter.sim.scenario import load_scenario, shipped_path  # noqa: E402
from gpu_audit.audit.config import AuditConfig  # noqa: E402
from gpu_audit.audit.producer import AuditProducer  # noqa: E402
from gpu_audit.model.snapshot import Snapshot  # noqa: E402
from gpu_audit.spool import SpoolConfig, SpoolWriter  # noqa: E402

SHAPES = [(1, 8), (8, 8), (16, 8), (8, 64)]


def scenario_file(tmp: Path, gpus: int, per_gpu: int) -> Path:
    """The shipped `large` scenario resized to gpus x per_gpu processes."""
    text = shipped_path("large").read_text()
    text = re.sub(r"count: 8", f"count: {gpus}", text, count=1)
    text = re.sub(r"per_gpu: 64", f"per_gpu: {per_gpu}", text, count=1)
    text = re.sub(r"memory: \{value: 1GiB", f"memory: {{value: {64 // per_gpu}GiB", text)
    path = tmp / f"shape-{gpus}x{per_gpu}.yaml"
    path.write_text(text.replace("name: large", f"name: bench-{gpus}x{per_gpu}"))
    return path


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def in_process(gpus: int, per_gpu: int, cycles: int, tmp: Path) -> dict[str, Any]:
    clock = [1_790_000_000.0]
    backend = SimBackend(load_scenario(str(scenario_file(tmp, gpus, per_gpu))),
                         clock=lambda: clock[0])
    info = backend.open()
    simproc = SimProcfs()
    resolver = Resolver(AttributionConfig(procfs_root=simproc.root, passwd_file=simproc.passwd))
    renderer = Renderer(RenderOptions())
    spool = SpoolWriter(SpoolConfig(directory=tmp / f"spool-{gpus}x{per_gpu}",
                                    min_free_bytes=0))
    producer = AuditProducer(AuditConfig(), spool, host="bench", exporter_version="bench",
                             simulated=True)
    producer.start()
    gc.freeze()  # as the exporter does after start-up
    stages: dict[str, list[float]] = {k: [] for k in
                                      ("sample", "fakeproc", "attribute", "render", "audit")}
    prev: Snapshot | None = None
    records_before = producer.stats().get("records_written", 0)
    for cycle in range(cycles + 5):
        clock[0] += 5.0
        t0 = time.thread_time()
        samples = tuple(backend.sample(clock[0], slow=cycle % 12 == 0))
        t1 = time.thread_time()
        simproc.update(samples)  # demo-only cost: mirrors simulated processes into a fake /proc
        t2 = time.thread_time()
        procs = resolver.attribute(samples)
        t3 = time.thread_time()
        snap = Snapshot(timestamp=clock[0], host="bench", backend=info, gpus=samples,
                        processes=procs, interval_seconds=5.0,
                        elapsed_seconds=5.0 if prev else 0.0, cycle=cycle)
        renderer.render(snap)
        t4 = time.thread_time()
        producer.on_snapshot(snap)
        t5 = time.thread_time()
        prev = snap
        if cycle >= 5:  # warm-up: first reads of /proc, first slow tier
            for key, dt in zip(stages, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4),
                               strict=True):
                stages[key].append(dt * 1000)
    records = producer.stats().get("records_written", 0) - records_before
    producer.stop()
    spool.close()
    resolver.close()
    simproc.remove()
    totals = [sum(stages[k][i] for k in ("sample", "attribute", "render", "audit"))
              for i in range(cycles)]
    out: dict[str, Any] = {"gpus": gpus, "procs_per_gpu": per_gpu,
                           "records_per_cycle": records / (cycles + 5)}
    for key, values in stages.items():
        out[f"{key}_ms_p50"] = statistics.median(values)
        out[f"{key}_ms_p99"] = pct(values, 0.99)
    out["cycle_ms_p50"] = statistics.median(totals)
    out["cycle_ms_p99"] = pct(totals, 0.99)
    return out


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def proc_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def scrape_burst(port: int, scrapers: int, rounds: int) -> tuple[float, float]:
    """20 Prometheus-like scrapers (keep-alive, gzip) firing at the same moment every
    round: the worst alignment of real scrape schedules. Returns p50, p99 in ms."""
    latencies: list[float] = []
    lock = threading.Lock()
    barrier = threading.Barrier(scrapers)

    def run() -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        mine = []
        for _ in range(rounds):
            barrier.wait()
            t = time.perf_counter()
            conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
            conn.getresponse().read()
            mine.append((time.perf_counter() - t) * 1000)
            time.sleep(0.1)
        conn.close()
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=run) for _ in range(scrapers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return statistics.median(latencies), pct(latencies, 0.99)


def scrape_closed_loop(port: int) -> dict[str, float]:
    """wrk, 20 connections back to back for 10 s (a saturation test, not a scrape
    pattern): p50/p99 latency and requests per second. Empty when wrk is missing."""
    if shutil.which("wrk") is None:
        return {}
    out = subprocess.run(
        ["wrk", "-t2", "-c20", "-d10s", "--latency", "-H", "Accept-Encoding: gzip",
         f"http://127.0.0.1:{port}/metrics"], capture_output=True, text=True, check=True).stdout

    def ms(label: str) -> float:
        m = re.search(rf"^\s*{label}\s+([\d.]+)(us|ms|s)\s*$", out, re.M)
        if not m:
            return float("nan")
        return float(m.group(1)) * {"us": 0.001, "ms": 1.0, "s": 1000.0}[m.group(2)]

    rps = re.search(r"Requests/sec:\s+([\d.]+)", out)
    return {"wrk_p50_ms": ms("50%"), "wrk_p99_ms": ms("99%"),
            "wrk_requests_per_s": float(rps.group(1)) if rps else float("nan")}


def out_of_process(gpus: int, per_gpu: int, window: float, tmp: Path) -> dict[str, Any]:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    scen = scenario_file(tmp, gpus, per_gpu)
    proc = subprocess.Popen(
        [str(ROOT / ".venv/bin/gpu-audit"), "exporter", "--backend", "sim", "--scenario",
         str(scen), "--listen", f"127.0.0.1:{port}", "--spool-dir",
         str(tmp / f"oop-spool-{gpus}x{per_gpu}"), "--log-level", "warning"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
                c.request("GET", "/readyz")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        time.sleep(6)  # past start-up and the first slow cycle
        cpu0, t0 = proc_cpu_seconds(proc.pid), time.monotonic()
        time.sleep(window)
        cpu1, t1 = proc_cpu_seconds(proc.pid), time.monotonic()
        p50, p99 = scrape_burst(port, 20, 50)
        closed = scrape_closed_loop(port)
        rss = proc_rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(20)
    return {"gpus": gpus, "procs_per_gpu": per_gpu,
            "cpu_seconds_per_hour": (cpu1 - cpu0) / (t1 - t0) * 3600,
            "rss_mb": rss, "scrape_ms_p50": p50, "scrape_ms_p99": p99, **closed}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cycles", type=int, default=60)
    parser.add_argument("--window", type=float, default=30.0,
                        help="seconds of idle running measured for CPU per hour")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results: dict[str, Any] = {"in_process": [], "process": []}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        print("per cycle CPU ms (p50 / p99); fakeproc is the simulator's demo-only cost")
        print(f"{'shape':>7} {'sample':>13} {'attribute':>13} {'render':>13} {'audit':>13}"
              f" {'cycle total':>13} {'records':>8} {'fakeproc':>9}")
        for g, p in SHAPES:
            r = in_process(g, p, args.cycles, tmp)
            results["in_process"].append(r)
            cols = " ".join(f"{r[k + '_ms_p50']:6.2f}/{r[k + '_ms_p99']:6.2f}"
                            for k in ("sample", "attribute", "render", "audit", "cycle"))
            print(f"{g:>3}x{p:<3} {cols} {r['records_per_cycle']:8.0f}"
                  f" {r['fakeproc_ms_p50']:9.2f}")
        print("\nexporter process at the default 5 s interval; scrapes: 20 scrapers firing"
              " together (gzip), and wrk's 20 back-to-back connections for 10 s")
        print(f"{'shape':>7} {'CPU s/hour':>11} {'RSS MB':>7} {'burst p50':>10}"
              f" {'burst p99':>10} {'wrk p50':>8} {'wrk p99':>8} {'wrk req/s':>10}")
        for g, p in SHAPES:
            r = out_of_process(g, p, args.window, tmp)
            results["process"].append(r)
            print(f"{g:>3}x{p:<3} {r['cpu_seconds_per_hour']:11.1f} {r['rss_mb']:7.1f}"
                  f" {r['scrape_ms_p50']:10.2f} {r['scrape_ms_p99']:10.2f}"
                  f" {r.get('wrk_p50_ms', float('nan')):8.2f}"
                  f" {r.get('wrk_p99_ms', float('nan')):8.2f}"
                  f" {r.get('wrk_requests_per_s', float('nan')):10.0f}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
