"""The endpoint under abuse: idle connections, a scrape burst, a scrape beside idle clients.

Side by side in one run, the same server code with the limits effectively off
(max_connections 10000, hour-long deadlines, 1 MiB heads: what the endpoint did before
it had limits) and with the default limits (gpu_audit.http.server):

- 3,000 clients connect and send nothing: the server's threads and RSS growth;
- 1,000 clients scrape /metrics at once (one connection each): p50/p99/max latency and
  failures;
- with the 3,000 idle clients still connected, 20 scrapes one after another: latency.

    PYTHONPATH=. .venv/bin/python bench/bench_endpoint_abuse.py [--idle 3000] [--burst 1000]
        [--json out]

Clients run in a child process on asyncio (no thread per client there).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import threading
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from exporter.exposition.render import RenderOptions, render_snapshot
from gpu_audit.http.config import HttpLimitsConfig
from gpu_audit.http.server import MetricsServer
from gpu_audit.http.state import LatestState
from tests.exporter.exposition.snapshots import small_snapshot

REQUEST = b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _scrape(port: int) -> float | None:
    t = time.perf_counter()
    try:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 30)
        writer.write(REQUEST)
        data = await asyncio.wait_for(reader.read(), 30)
        writer.close()
    except (TimeoutError, OSError):
        return None
    return (time.perf_counter() - t) * 1000 if data.startswith(b"HTTP/1.1 200") else None


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def _client(port: int, idle: int, burst: int, pipe: Connection) -> None:
    # phase 1: idle clients, held until told
    idlers = []
    for _ in range(idle):
        try:
            idlers.append(await asyncio.open_connection("127.0.0.1", port))
        except OSError:
            break
    pipe.send(len(idlers))
    pipe.recv()
    # phase 2: sequential scrapes beside the idle clients
    beside = [await _scrape(port) for _ in range(20)]
    for _, w in idlers:
        w.close()
    await asyncio.sleep(1)
    # phase 3: the burst
    results = await asyncio.gather(*(_scrape(port) for _ in range(burst)))
    ok = [r for r in results if r is not None]
    ok_beside = [r for r in beside if r is not None]
    pipe.send({
        "idle_connected": len(idlers),
        "beside_idle_ok": len(ok_beside), "beside_idle_ms_p50": _pct(ok_beside, 0.5),
        "beside_idle_ms_max": max(ok_beside, default=float("nan")),
        "burst_ok": len(ok), "burst_failed": burst - len(ok),
        "burst_ms_p50": _pct(ok, 0.5), "burst_ms_p99": _pct(ok, 0.99),
        "burst_ms_max": max(ok, default=float("nan")),
    })


def _client_main(port: int, idle: int, burst: int, pipe: Connection) -> None:
    asyncio.run(_client(port, idle, burst, pipe))


def run(limits: HttpLimitsConfig, idle: int, burst: int) -> dict[str, Any]:
    state = LatestState(stale_after_seconds=3600)
    snap = small_snapshot()
    state.set_backend(True)
    state.publish(snap, render_snapshot(snap, RenderOptions()))
    srv = MetricsServer("127.0.0.1", 0, state, limits=limits)
    srv.start()
    parent, child = multiprocessing.Pipe()
    proc = multiprocessing.Process(target=_client_main, args=(srv.port, idle, burst, child))
    threads0, rss0 = threading.active_count(), rss_kb()
    proc.start()
    parent.recv()
    time.sleep(3)  # let the accept loop take in what it will
    held = {"idle_server_threads": threading.active_count() - threads0,
            "idle_rss_growth_mb": (rss_kb() - rss0) / 1024}
    parent.send("go")
    result = parent.recv()
    proc.join(60)
    srv.stop()
    return {**held, **result, "connections": srv.connections()}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--idle", type=int, default=3000)
    p.add_argument("--burst", type=int, default=1000)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    unbounded = HttpLimitsConfig(max_connections=10000, header_timeout_seconds=300,
                                 idle_timeout_seconds=3600, max_header_bytes=1048576)
    out = {"limits_off": run(unbounded, args.idle, args.burst),
           "default_limits": run(HttpLimitsConfig(), args.idle, args.burst)}
    for name, r in out.items():
        print(f"{name}: {args.idle} idle -> {r['idle_server_threads']} threads, "
              f"+{r['idle_rss_growth_mb']:.0f} MB; scrapes beside them "
              f"{r['beside_idle_ok']}/20 ok, p50 {r['beside_idle_ms_p50']:.1f} ms, "
              f"max {r['beside_idle_ms_max']:.0f} ms; burst of {args.burst}: "
              f"{r['burst_ok']} ok, p50 {r['burst_ms_p50']:.0f} ms, "
              f"p99 {r['burst_ms_p99']:.0f} ms, max {r['burst_ms_max']:.0f} ms")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=statistics.mean))


if __name__ == "__main__":
    main()
