"""End-to-end shipper benchmark: spool -> engine -> real InfluxDB 1.x, real VictoriaMetrics
and the Elasticsearch bulk test server, one at a time and all three at once.

    python bench/bench_shipper.py [--records N] [--json PATH]

The backlog is the catch-up case: 10 minutes of an 8-GPU x 64-process node at
a 5 s interval is (8*64 + 16) * 120 = 63,360 records of about 1 KB (the producer writes
them, hash-chained, into a spool in a separate process first). Steady production is
528 / 5 s = 105.6 records/s; catch-up is reported as a multiple of it (target >= 5x).
Per scenario: records/s delivered per sink, CPU seconds of the shipper process per
10,000 records (servers run in their own processes and are not counted), the CPU each
server process used (cores busy, from /proc/<pid>/stat: a server near 1 core while the
shipper waits is the limit, not the shipper), the load average, and the shipper's peak
RSS. Targets: >= 20,000 records/s per sink, RSS <= 80 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_audit.spool import CursorStore  # noqa: E402
from gpu_audit.spool.config import SpoolConfig  # noqa: E402
from shipper.config import ShipperConfig  # noqa: E402
from shipper.engine import Shipper  # noqa: E402
from shipper.sinks.base import ItemResult, Outcome, SinkRecord  # noqa: E402
from tests.netutil import http_get  # noqa: E402
from tests.polling import wait_for  # noqa: E402
from tests.realservers import influxd_server, victoria_metrics_server  # noqa: E402

GPUS, PROCS, INTERVAL_S, WINDOW_S = 8, 64, 5.0, 600.0
RECORDS_PER_CYCLE = GPUS * PROCS + 16  # process records + per-GPU samples and node records
BACKLOG = RECORDS_PER_CYCLE * int(WINDOW_S / INTERVAL_S)
STEADY_RATE = RECORDS_PER_CYCLE / INTERVAL_S


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return env


def _bulk_server() -> tuple[subprocess.Popen[bytes], str]:
    """The in-process bulk server, run in its own process so its CPU is not ours."""
    code = (
        "from tests.shipper.sinks.servers.search import SearchServer\n"
        "s = SearchServer('elasticsearch')\n"
        "print(s.url, flush=True)\n"
        "s.serve_forever()\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    url = proc.stdout.readline().decode().strip()
    wait_for(lambda: http_get(url + "/", 1.0)[0] == 200, 30, "bulk server")
    return proc, url


_TICK = os.sysconf("SC_CLK_TCK")


def _proc_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _produce(spool: Path, count: int) -> None:
    subprocess.run(
        [sys.executable, "-m", "tests.shipper.producer", str(spool), str(count),
         "--batch", "2000", "--pad", "700"],
        cwd=ROOT, env=_env(), check=True, capture_output=True,
    )


_RSS_CHILD = """
import json, sys, time
from pathlib import Path
from gpu_audit.spool.config import SpoolConfig
from shipper.config import ShipperConfig
from shipper.engine import Shipper
spec = json.loads(sys.argv[1])
cfg = ShipperConfig.model_validate(spec["shipper"])
shipper = Shipper(cfg, SpoolConfig(directory=Path(spec["spool"]), min_free_bytes=0))
shipper.start()
deadline = time.monotonic() + 600
while time.monotonic() < deadline and any(
        st["position"] < spec["count"] for st in shipper.stats()["sinks"].values()):
    time.sleep(0.05)
shipper.stop(30)
# VmHWM, not ru_maxrss: Linux carries ru_maxrss over fork + exec from the parent
hwm = [l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmHWM")]
print(int(hwm[0].split()[1]) / 1024)
"""


def _shipper_rss_mb(spool: Path, sinks: list[dict[str, Any]], count: int, batch: int) -> float:
    """Peak RSS of a process that is only the shipper (what an operator runs), draining
    the backlog to `sinks`; the bench process itself also holds servers' test helpers."""
    spec = {"spool": str(spool), "count": count,
            "shipper": {"sinks": sinks, "batch_max_records": batch,
                        "batch_max_wait_s": 0.05, "poll_interval_s": 0.02}}
    out = subprocess.run([sys.executable, "-c", _RSS_CHILD, json.dumps(spec)], cwd=ROOT,
                         env=_env(), check=True, capture_output=True, text=True, timeout=900)
    return round(float(out.stdout.strip().splitlines()[-1]), 1)


class NullSink:
    """Acknowledges everything at once: measures the engine (spool read, decode, batching,
    outcome accounting, commits) without any sink's encoding or network."""

    kind = "null"

    def __init__(self, name: str) -> None:
        self.name = name

    def start(self) -> None:
        pass

    def send(self, batch: Sequence[SinkRecord]) -> Sequence[ItemResult]:
        return [ItemResult(Outcome.DELIVERED)] * len(batch)

    def read_back(self, start_ns: int, end_ns: int) -> Iterator[Mapping[str, Any]]:
        return iter(())

    def close(self) -> None:
        pass


def _run(
    spool_cfg: SpoolConfig,
    sinks: list[dict[str, Any]],
    count: int,
    args_batch: int,
    *,
    objects: list[Any] | None = None,
    servers: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    cfg = ShipperConfig.model_validate(
        {"sinks": sinks, "batch_max_records": args_batch, "batch_max_bytes": 4 * 1024 * 1024,
         "batch_max_wait_s": 0.05, "poll_interval_s": 0.02, "commit_interval_s": 0.5}
    )
    shipper = Shipper(cfg, spool_cfg, sinks=objects)
    servers = dict(servers or {})
    server_cpu0 = {name: _proc_cpu_s(pid) for name, pid in servers.items()}
    cpu0 = sum(os.times()[:2])
    t0 = time.perf_counter()
    shipper.start()
    done: dict[str, float] = {}
    while len(done) < len(shipper.sinks) and time.perf_counter() - t0 < 600:
        for name, st in shipper.stats()["sinks"].items():
            if name not in done and st["position"] >= count:
                done[name] = time.perf_counter() - t0
        time.sleep(0.02)
    shipper.stop(30)
    elapsed = time.perf_counter() - t0
    cpu = sum(os.times()[:2]) - cpu0
    server_cores = {
        name: round((_proc_cpu_s(pid) - server_cpu0[name]) / elapsed, 2)
        for name, pid in servers.items()
    }
    stats = shipper.stats()["sinks"]
    names = [s["name"] for s in sinks] if objects is None else [o.name for o in objects]
    return {
        "sinks": {
            name: {
                "seconds": round(done.get(name, float("nan")), 3),
                "records_per_s": round(count / done[name]) if name in done else 0,
                "catch_up_multiple": round(count / done[name] / STEADY_RATE, 1)
                if name in done else 0,
                "delivered": stats[name]["delivered"],
                "dead_lettered": stats[name]["dead_lettered"],
            }
            for name in names
        },
        "wall_s": round(elapsed, 3),
        "cpu_s": round(cpu, 3),
        "shipper_cores": round(cpu / elapsed, 2),
        "server_cores": server_cores,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "cpu_s_per_10k_records_per_sink": round(
            cpu / (count * len(objects or sinks)) * 10_000, 3
        ),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--records", type=int, default=BACKLOG)
    p.add_argument("--batch", type=int, default=2000, help="batch_max_records")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    n = args.records
    results: dict[str, Any] = {
        "records": n,
        "record_bytes": 1024,
        "steady_rate_records_per_s": STEADY_RATE,
        "batch_max_records": args.batch,
        "scenarios": {},
    }
    with tempfile.TemporaryDirectory(prefix="bench-shipper-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        spool = root / "spool"
        t = time.perf_counter()
        _produce(spool, n)
        results["produce_s"] = round(time.perf_counter() - t, 3)
        spool_cfg = SpoolConfig(directory=spool, min_free_bytes=0)
        res = _run(spool_cfg, [], n, args.batch, objects=[NullSink("null-engine")])
        CursorStore(spool).remove("null-engine")
        results["scenarios"]["engine_only"] = res
        print(f"engine: {res['sinks']['null-engine']['records_per_s']:,} rec/s with a null sink;"
              f" cpu {res['cpu_s_per_10k_records_per_sink']} s/10k", flush=True)
        influx = stack.enter_context(influxd_server(root))
        vm = stack.enter_context(victoria_metrics_server(root))
        bulk, bulk_url = _bulk_server()
        stack.callback(bulk.wait, 10)
        stack.callback(bulk.terminate)

        def sinks(tag: str, which: list[str]) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = []
            if "influxdb_v1" in which:
                out.append({"type": "influxdb_v1", "name": f"influx-{tag}", "url": influx.url,
                            "database": "gpu_audit"})
            if "victoriametrics" in which:
                out.append({"type": "influxdb_v2", "name": f"vm-{tag}", "url": vm.url,
                            "bucket": "gpu_audit", "flavour": "victoriametrics"})
            if "bulk" in which:
                out.append({"type": "elasticsearch", "name": f"bulk-{tag}", "hosts": [bulk_url],
                            "number_of_replicas": 0})
            return out

        for tag, which in [
            ("influx", ["influxdb_v1"]),
            ("vm", ["victoriametrics"]),
            ("bulk", ["bulk"]),
            ("all", ["influxdb_v1", "victoriametrics", "bulk"]),
        ]:
            chosen = sinks(tag, which)
            assert influx.proc is not None and vm.proc is not None
            pids = {"influxd": influx.proc.pid, "victoria-metrics": vm.proc.pid,
                    "bulk": bulk.pid}
            res = _run(spool_cfg, chosen, n, args.batch, servers={
                k: pid for k, pid in pids.items()
                if {"influxd": "influxdb_v1", "victoria-metrics": "victoriametrics",
                    "bulk": "bulk"}[k] in which})
            cursors = CursorStore(spool)
            for sink in chosen:  # each scenario starts from offset 0 with its own cursors
                cursors.remove(sink["name"])
            results["scenarios"][tag] = res
            print(f"{tag:>6}: " + ", ".join(
                f"{k} {v['records_per_s']:,} rec/s ({v['catch_up_multiple']}x steady)"
                for k, v in res["sinks"].items()
            ) + f"; cpu {res['cpu_s_per_10k_records_per_sink']} s/10k/sink; shipper "
                  f"{res['shipper_cores']} cores, servers {res['server_cores']} cores; "
                  f"load {res['load_average_1m']}", flush=True)
        archive = [{"type": "archive", "name": "archive-rss", "directory": str(root / "arch")}]
        rss = {"archive_only": _shipper_rss_mb(spool, archive, n, args.batch),
               "influx_vm_bulk": _shipper_rss_mb(spool, sinks("rss", [
                   "influxdb_v1", "victoriametrics", "bulk"]), n, args.batch)}
        results["shipper_process_peak_rss_mb"] = rss
        print(f"peak RSS of a shipper-only process: archive sink {rss['archive_only']} MB, "
              f"influx + vm + bulk sinks {rss['influx_vm_bulk']} MB", flush=True)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    results["peak_rss_mb"] = round(rss_mb, 1)
    print(f"peak RSS of this bench process (shipper + test helpers): {rss_mb:.1f} MB")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
