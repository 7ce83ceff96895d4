"""`gpu-audit capacity` over a synthetic archive, beside `gpu-audit chargeback` of the
same period, each in a fresh process (wall seconds, peak RSS).

    .venv/bin/python bench/bench_capacity.py --dir /tmp/capbench1000 --hosts 125 --gpus 8 \\
        --days 3 --workers 2 --json bench/results/capacity-1000gpu-3d.json

The archive is bench/synth_archive.py's (one usage record per GPU and holder per minute,
written and sealed by the real archive sink, a part per host and day), generated once
into --dir and reused. The capacity run is the default `--bin day`: one read of the
period, each sealed day from its seal. Both runs must agree on the fleet's GPU-hours.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synth_archive import START_NS, write_archive  # the fast synthetic writer

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ("import resource, sys\n"
          "from gpu_audit_app.cli import main\n"
          "rc = main(sys.argv[1:])\n"
          "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
          " file=sys.stderr)\n"
          "sys.exit(rc)\n")


def run(args: list[str]) -> dict[str, Any]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", RUNNER, *args], capture_output=True,
                          text=True, check=False, cwd=ROOT)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{args[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rss = int(next(line.split()[1] for line in done.stderr.splitlines()
                   if line.startswith("MAXRSS_KB")))
    return {"seconds": round(wall, 2), "peak_rss_mb": round(rss / 1024, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--hosts", type=int, default=125)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--archive", type=Path,
                    help="an archive synth_archive.py already wrote (default DIR/archive)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    archive = args.archive or args.dir / "archive"
    if not archive.is_dir() or not any(archive.iterdir()):
        t0 = time.monotonic()
        write_archive(archive, hosts=args.hosts, gpus=args.gpus, days=args.days,
                      workers=args.workers)
        print(f"archive written in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    parts = [p for p in archive.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz"))]
    size = sum(p.stat().st_size for p in archive.iterdir() if p.is_file())
    cfg = args.dir / "gpu-audit.yaml"
    cfg.write_text(f"shipper:\n  sinks:\n  - type: archive\n    directory: {archive}\n")
    start = dt.datetime.fromtimestamp(START_NS / 1e9, tz=dt.UTC)
    end = start + dt.timedelta(days=args.days)
    period = ["--from", start.isoformat(), "--to", end.isoformat()]
    cap = run(["capacity", "--source", "archive", "--config", str(cfg), *period, "--out",
               str(args.dir / "capacity"), "--no-png"])
    cb = run(["chargeback", "bill", "--source", "archive", "--config", str(cfg), *period, "--out",
              str(args.dir / "chargeback")])
    doc = json.loads((args.dir / "capacity" / "capacity.json").read_text())
    site = next(r for r in doc["rows"] if r["month"] == "period" and r["model"] == "all models")
    recon = json.loads((args.dir / "chargeback" / "chargeback.json").read_text())[
        "reconciliation"]
    up = site["installed_gpu_hours"] - site["down_gpu_hours"]
    result = {
        "gpus": args.hosts * args.gpus, "days": args.days, "parts": len(parts),
        "archive_mb": round(size / 1e6), "capacity": cap, "chargeback": cb,
        "capacity_up_gpu_hours": round(up, 3),
        "chargeback_fleet_gpu_hours": round(recon["fleet_gpu_hours"], 3),
        "sentence": doc["sentence"],
        "command": " ".join(sys.argv),
    }
    assert abs(up - recon["fleet_gpu_hours"]) < 1e-6 * max(1.0, up), result
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
