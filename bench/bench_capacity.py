"""`gpu-audit capacity` over a synthetic archive, beside `gpu-audit chargeback` of the
same period, each in a fresh process (wall seconds, peak RSS).

    .venv/bin/python bench/bench_capacity.py --dir /tmp/capbench1000 --hosts 125 --gpus 8 \\
        --days 3 --workers 2 --json bench/results/capacity-1000gpu-3d.json

    .venv/bin/python bench/synth_archive.py /tmp/i37-month/archive --hosts 125 --gpus 8 \
        --days 30 --workers 2 --key-file /tmp/i37-month/hmac.key
    .venv/bin/python bench/bench_capacity.py --dir /tmp/i37-month/run \
        --archive /tmp/i37-month/archive --key-file /tmp/i37-month/hmac.key --hosts 125 \
        --gpus 8 --days 30 --json bench/results/capacity-1000gpu-30d.json

The archive is bench/synth_archive.py's (one usage record per GPU and holder per minute,
written and sealed by the real archive sink, a part per host and day), generated once
into --dir and reused; `--key-file`: the trail's HMAC key (a keyed trail's seals are
billed unread; an unkeyed trail's prove nothing, so every part is read). The capacity
run is the default `--bin day`: one read of the period, each sealed day from its seal.
`--hour` adds `capacity --bin hour` (one read, every record) beside `chargeback
--verify-records` (the same records read by the bill), and `--old-src DIR` the same
`--bin hour` run by an older checkout (each hour its own read). All runs must agree on
the fleet's GPU-hours.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synth_archive import START_NS, write_archive  # the fast synthetic writer

from gpu_audit.audit.canonical import load_hmac_key

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ("import resource, sys\n"
          "from gpu_audit_app.cli import main\n"
          "rc = main(sys.argv[1:])\n"
          "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
          " file=sys.stderr)\n"
          "sys.exit(rc)\n")


def run(args: list[str], cwd: Path = ROOT) -> dict[str, Any]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", RUNNER, *args], capture_output=True,
                          text=True, check=False, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(cwd)})
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"{args[0]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rss = int(next(line.split()[1] for line in done.stderr.splitlines()
                   if line.startswith("MAXRSS_KB")))
    return {"seconds": round(wall, 2), "peak_rss_mb": round(rss / 1024, 1)}


def _up(doc: dict[str, Any]) -> float:
    site = next(r for r in doc["rows"] if r["month"] == "period" and r["model"] == "all models")
    return float(site["installed_gpu_hours"] - site["down_gpu_hours"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--hosts", type=int, default=125)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--days", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--archive", type=Path,
                    help="an archive synth_archive.py already wrote (default DIR/archive)")
    ap.add_argument("--key-file", type=Path, help="the trail's HMAC key file")
    ap.add_argument("--hour", action="store_true",
                    help="also capacity --bin hour and chargeback --verify-records")
    ap.add_argument("--old-src", type=Path,
                    help="an older checkout whose capacity --bin hour is timed too")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.dir.mkdir(parents=True, exist_ok=True)
    archive = args.archive or args.dir / "archive"
    if not archive.is_dir() or not any(archive.iterdir()):
        t0 = time.monotonic()
        key = load_hmac_key(args.key_file) if args.key_file else None
        write_archive(archive, hosts=args.hosts, gpus=args.gpus, days=args.days,
                      workers=args.workers, key=key)
        print(f"archive written in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    parts = [p for p in archive.iterdir() if p.name.endswith((".jsonl", ".jsonl.gz"))]
    size = sum(p.stat().st_size for p in archive.iterdir() if p.is_file())
    cfg = args.dir / "gpu-audit.yaml"
    audit = f"audit:\n  hmac_key_file: {args.key_file}\n" if args.key_file else ""
    cfg.write_text(f"{audit}shipper:\n  sinks:\n  - type: archive\n    directory: {archive}\n")
    start = dt.datetime.fromtimestamp(START_NS / 1e9, tz=dt.UTC)
    end = start + dt.timedelta(days=args.days)
    period = ["--from", start.isoformat(), "--to", end.isoformat()]
    cap = run(["capacity", "--source", "archive", "--config", str(cfg), *period, "--out",
               str(args.dir / "capacity"), "--no-png"])
    cb = run(["chargeback", "bill", "--source", "archive", "--config", str(cfg), *period, "--out",
              str(args.dir / "chargeback")])
    doc = json.loads((args.dir / "capacity" / "capacity.json").read_text())
    recon = json.loads((args.dir / "chargeback" / "chargeback.json").read_text())[
        "reconciliation"]
    up = _up(doc)
    result: dict[str, Any] = {
        "gpus": args.hosts * args.gpus, "days": args.days, "parts": len(parts),
        "archive_mb": round(size / 1e6), "keyed": args.key_file is not None,
        "capacity": cap, "chargeback": cb,
        "capacity_up_gpu_hours": round(up, 3),
        "chargeback_fleet_gpu_hours": round(recon["fleet_gpu_hours"], 3),
        "sentence": doc["sentence"],
        "summary": (args.dir / "capacity" / "summary.txt").read_text(),
        "command": " ".join(sys.argv),
    }
    assert abs(up - recon["fleet_gpu_hours"]) < 1e-6 * max(1.0, up), result
    if args.hour:
        result["capacity_hour"] = run(["capacity", "--source", "archive", "--config",
                                       str(cfg), *period, "--bin", "hour", "--out",
                                       str(args.dir / "capacity-hour"), "--no-png"])
        hour_up = _up(json.loads((args.dir / "capacity-hour" / "capacity.json").read_text()))
        assert abs(hour_up - up) < 1e-6 * max(1.0, up), (hour_up, up)
        result["chargeback_verify_records"] = run(
            ["chargeback", "--source", "archive", "--config", str(cfg), *period,
             "--verify-records", "--out", str(args.dir / "chargeback-records")])
    if args.old_src:
        result["capacity_hour_old"] = run(["capacity", "--source", "archive", "--config",
                                           str(cfg), *period, "--bin", "hour", "--out",
                                           str(args.dir / "capacity-hour-old"), "--no-png"],
                                          cwd=args.old_src)
        old_up = _up(json.loads((args.dir / "capacity-hour-old" / "capacity.json")
                                .read_text()))
        assert abs(old_up - up) < 1e-6 * max(1.0, up), (old_up, up)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
