"""Chargeback from the archive: the streaming orjson engine against DuckDB
reading the compressed JSON Lines directly, on one generated archive of the per-cycle
trail (audit.interval_seconds = the sampling interval, schema 2), in one run. The
default interval trail and sealed parts: bench_chargeback_sealed.py.

    .venv/bin/python bench/bench_chargeback_archive.py [--days 1] [--gpus 64] \
        [--interval 10] [--dir DIR] [--keep] [--json out.json]

The archive is generated once (8-GPU nodes, each its own hash-chained stream, through
the real AuditProducer and the real archive sink: day parts, closed parts gzipped, as
`gpu-audit run` leaves them), then each engine runs in a fresh subprocess, one after
the other, reporting wall time and peak RSS (ru_maxrss of that subprocess):

- streaming: `chargeback.sources.archive.read_archive`, the engine the CLI uses: one
  pass, orjson, the hash chain verified as it reads, O(GPUs + owners) memory;
- duckdb: the same sums (fleet, per-owner used / charged / busy / energy) as SQL over
  `read_json('*.jsonl.gz')`. It cannot verify the chain (a SHA-256 over canonical JSON
  per record, chained), so a bill from it would need the verification pass on top: the
  "duckdb + verify" line adds the time of a verify-only streaming pass (core's
  Verifier), as a lower bound of what that engine would cost.

The issue's size, 30 days x 64 GPUs x 10 s (about 17 million GPU samples, ~3 records
each), is ~50 GB of JSON; `--days` generates a fraction and the report extrapolates
linearly (both engines are single passes over the bytes). The engines' sums are
checked against each other before anything is reported.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DAY0 = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
GPUS_PER_NODE = 8
USERS = [(f"user{i:02d}", f"proj{i % 7}") for i in range(24)]
MODEL = "NVIDIA H100 80GB HBM3"
FULL_GPU_SAMPLES = 30 * 64 * 86_400 // 10


def generate(directory: Path, days: float, gpus: int, interval: float) -> dict[str, Any]:
    """Write the archive; return what was generated."""
    from gpu_audit.audit.config import AuditConfig
    from gpu_audit.audit.producer import AuditProducer
    from gpu_audit.model.attribution import Attribution
    from tests.chargeback.archives import ArchiveWriter
    from tests.core.audit.factory import gpu, proc, snapshot

    nodes = max(1, gpus // GPUS_PER_NODE)
    cycles = int(days * 86_400 / interval)
    t0 = DAY0.timestamp()
    owners = {1000 + u: Attribution(user=user, project=project, sources={"user": "environ"})
              for u, (user, project) in enumerate(USERS)}

    class Spool:
        def __init__(self) -> None:
            self.pending: list[bytes] = []

        def commit(self, payloads: Any) -> int:
            self.pending.extend(payloads)
            return 0

        def last_payload(self) -> None:
            return None

    spools = [Spool() for _ in range(nodes)]
    clock = iter(range(10**9))
    producers = [AuditProducer(AuditConfig(stream=f"node-{n:02d}", interval_seconds=interval),
                               spools[n],
                               host=f"node-{n:02d}", exporter_version="bench", simulated=False,
                               clock=lambda: t0 - 60 + next(clock) * 1e-3)
                 for n in range(nodes)]
    writer = ArchiveWriter(directory)
    for p in producers:
        p.start()
    gpu_samples = records = 0
    for k in range(cycles + 1):
        ts = t0 + k * interval
        hour = int(k * interval // 3600)
        for n, p in enumerate(producers):
            gs = []
            for i in range(GPUS_PER_NODE):
                g = n * GPUS_PER_NODE + i
                job = (g * 7 + hour // 3) % 29  # a job per GPU, changing every 3 hours
                procs, util = [], 0.0
                if job < len(USERS):  # 24 of 29: busy with a job, else free
                    util = 0.3 + 0.6 * ((g + hour) % 5) / 4
                    procs = [proc(1000 + job, sm=util, mem=20 * 1024**3)]
                    if (g + hour) % 11 == 0:  # now and then a second, unowned process
                        procs.append(proc(9000 + g, sm=0.0, mem=1024**3))
                gs.append(gpu(i, util=util, energy=1e6 + k * interval * (80 + 300 * util),
                              power=80 + 300 * util, processes=procs))
            p.on_snapshot(snapshot(ts, gs, owners, interval=interval))
            gpu_samples += GPUS_PER_NODE if k else 0
        batch = [raw for s in spools for raw in s.pending]
        records += len(batch)
        writer.write(batch)
        for s in spools:
            s.pending.clear()
    for p in producers:
        p.stop()
    writer.write([raw for s in spools for raw in s.pending])
    writer.close()
    size = sum(f.stat().st_size for f in directory.iterdir() if f.name.startswith("gpu-audit"))
    return {"gpu_samples": gpu_samples, "records": records, "archive_bytes": size,
            "start": DAY0.isoformat(), "end": (DAY0 + dt.timedelta(days=days + 1)).isoformat()}


def _request(start: str, end: str) -> Any:
    from chargeback.model import Request

    return Request(start=dt.datetime.fromisoformat(start), end=dt.datetime.fromisoformat(end),
                   source="archive", config=None, prometheus_url=None, rates=None,
                   directory=None, idle_policy="none", out="-")


def run_streaming(directory: Path, start: str, end: str) -> dict[str, Any]:
    from chargeback.sources.archive import read_archive

    d = read_archive(_request(start, end), directory)
    assert d.verified is True, d.verification_problems
    owners: dict[str, list[float]] = {}
    for ((user, project), _model), u in d.usage.items():
        row = owners.setdefault(f"{user}/{project}", [0.0] * 4)
        for i, v in enumerate((u.used_gpu_seconds, u.charged_gpu_seconds,
                               u.busy_gpu_seconds, u.energy_joules)):
            row[i] += v
    fleet = d.fleet[MODEL]
    return {"owners": owners, "fleet": [fleet.gpu_seconds, fleet.energy_joules]}


def run_verify_only(directory: Path, start: str, end: str) -> dict[str, Any]:
    import orjson

    from chargeback.sources.archive import ID_WINDOW, parts_for
    from gpu_audit.archive import read_lines
    from gpu_audit.audit.verify import Verifier

    s = _request(start, end)
    from chargeback.sources.archive import _ns

    v = Verifier(hmac_key=None, complete=False, id_window=ID_WINDOW)
    for line in read_lines(directory, parts=parts_for(directory, _ns(s.start), _ns(s.end))):
        v.feed(orjson.loads(line.raw), line.where)
    assert v.report().ok
    return {}


DUCKDB_SQL = """
WITH r AS (
  SELECT * FROM read_json({files}, format = 'newline_delimited', columns = {{
    'kind': 'VARCHAR', 'host': 'VARCHAR', 'time_ns': 'BIGINT', 'simulated': 'BOOLEAN',
    'gpu': 'STRUCT(uuid VARCHAR, name VARCHAR, up BOOLEAN)',
    'elapsed_seconds': 'DOUBLE', 'gpu_seconds': 'DOUBLE', 'busy_gpu_seconds': 'DOUBLE',
    'energy_joules': 'DOUBLE', 'attributed': 'BOOLEAN',
    'attribution': 'STRUCT("user" VARCHAR, project VARCHAR)'}})
  WHERE time_ns > {start} AND time_ns <= {end} AND NOT coalesce(simulated, false)
),
oc AS (  -- per owner, GPU and cycle
  SELECT attribution."user" AS u, attribution.project AS p, host, gpu.uuid AS uuid, time_ns,
         max(gpu_seconds) AS used, sum(coalesce(busy_gpu_seconds, 0)) AS busy,
         sum(coalesce(energy_joules, 0)) AS energy, max(elapsed_seconds) AS e
  FROM r WHERE kind = 'process' AND attributed GROUP BY ALL
),
n AS (SELECT host, uuid, time_ns, count(*) AS n FROM oc GROUP BY ALL)
SELECT 'owner' AS what, u || '/' || p AS k, sum(used), sum(e / n), sum(busy), sum(energy)
FROM oc JOIN n USING (host, uuid, time_ns) GROUP BY ALL
UNION ALL
SELECT 'fleet', gpu.name, sum(gpu_seconds), sum(coalesce(energy_joules, 0)), 0, 0
FROM r WHERE kind = 'gpu' AND gpu.up GROUP BY ALL
"""


def run_duckdb(directory: Path, start: str, end: str) -> dict[str, Any]:
    import duckdb

    from chargeback.sources.archive import _ns

    s = _request(start, end)
    files = sorted(str(p) for p in directory.iterdir()
                   if p.name.startswith("gpu-audit_") and ".jsonl" in p.name)
    con = duckdb.connect()
    con.execute("SET preserve_insertion_order = false")
    rows = con.execute(DUCKDB_SQL.format(files=files, start=_ns(s.start), end=_ns(s.end))
                       ).fetchall()
    owners = {k: [a, b, c, d] for what, k, a, b, c, d in rows if what == "owner"}
    fleet = next([a, b] for what, _k, a, b, _c, _d in rows if what == "fleet")
    return {"owners": owners, "fleet": fleet}


ENGINES = {"streaming": run_streaming, "duckdb": run_duckdb, "verify": run_verify_only}


def child(engine: str, directory: Path, start: str, end: str) -> None:
    t = time.perf_counter()
    out = ENGINES[engine](directory, start, end)
    out["seconds"] = time.perf_counter() - t
    out["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(out))


def measure(engine: str, directory: Path, gen: dict[str, Any]) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", engine, "--dir", str(directory),
           "--start", gen["start"], "--end", gen["end"]]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=7200, check=True,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def _same(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Equal up to the last bits of sums added in another order (1e-9 relative: far
    below any billing figure)."""

    def close(x: float, y: float) -> bool:
        return abs(x - y) <= 1e-9 * max(1.0, abs(x), abs(y))

    assert set(a["owners"]) == set(b["owners"]), (set(a["owners"]) ^ set(b["owners"]))
    for k, va in a["owners"].items():
        assert all(close(x, y) for x, y in zip(va, b["owners"][k], strict=True)), (k, va)
    assert all(close(x, y) for x, y in zip(a["fleet"], b["fleet"], strict=True))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--days", type=float, default=1.0)
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--interval", type=float, default=10.0)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--keep", action="store_true", help="keep the generated archive")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--child", choices=sorted(ENGINES), help=argparse.SUPPRESS)
    ap.add_argument("--start", help=argparse.SUPPRESS)
    ap.add_argument("--end", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child, args.dir, args.start, args.end)
        return 0
    base = Path(tempfile.mkdtemp(prefix="bench-cb-archive-", dir=args.dir))
    try:
        t = time.perf_counter()
        gen = generate(base, args.days, args.gpus, args.interval)
        gen["generate_seconds"] = time.perf_counter() - t
        scale = FULL_GPU_SAMPLES / gen["gpu_samples"]
        print(f"archive: {gen['gpu_samples']:,} GPU samples, {gen['records']:,} records, "
              f"{gen['archive_bytes'] / 1e6:.1f} MB gzipped, generated in "
              f"{gen['generate_seconds']:.0f} s (x{scale:.1f} to the issue's 30 days)")
        res = {name: measure(name, base, gen)
               for name in ("streaming", "duckdb", "verify")}
        _same(res["streaming"], res["duckdb"])
        print("engines agree on every owner's used / charged / busy / energy and the fleet")
        print(f"{'engine':<16}{'seconds':>10}{'peak RSS MB':>13}{'30-day s (extrap.)':>20}")
        rows = [("streaming", res["streaming"]["seconds"], res["streaming"]["peak_rss_mb"]),
                ("duckdb", res["duckdb"]["seconds"], res["duckdb"]["peak_rss_mb"]),
                ("verify only", res["verify"]["seconds"], res["verify"]["peak_rss_mb"]),
                ("duckdb + verify", res["duckdb"]["seconds"] + res["verify"]["seconds"],
                 max(res["duckdb"]["peak_rss_mb"], res["verify"]["peak_rss_mb"]))]
        for name, secs, rss in rows:
            print(f"{name:<16}{secs:>10.1f}{rss:>13.0f}{secs * scale:>20.0f}")
        ratio = res["duckdb"]["seconds"] / res["streaming"]["seconds"]
        print(f"time duckdb / streaming: {ratio:.2f}; "
              f"(duckdb + verify) / streaming: {rows[3][1] / rows[0][1]:.2f}")
        if args.json:
            args.json.write_text(json.dumps({
                "generated": gen, "scale_to_30_days": scale,
                "results": {k: {"seconds": v["seconds"], "peak_rss_mb": v["peak_rss_mb"]}
                            for k, v in res.items()},
                "python": platform.python_version(), "cpus": os.cpu_count()}, indent=2))
    finally:
        if args.keep:
            print(f"archive kept in {base}")
        else:
            shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
