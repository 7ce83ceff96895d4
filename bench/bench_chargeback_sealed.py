"""A month billed from sealed archive parts, against reading every record, in one run.

    .venv/bin/python bench/bench_chargeback_sealed.py --dir /tmp/cb64 --hosts 8 --gpus 8 \\
        --days 30 --streaming --json bench/results/chargeback-sealed-64.json
    .venv/bin/python bench/bench_chargeback_sealed.py --dir /tmp/cb1000 --hosts 125 \\
        --gpus 8 --days 30 --workers 2 --json bench/results/chargeback-sealed-1000.json

The archive (synth_archive.py: the default 60 s cadence, one usage record per GPU and
holder per minute, written and sealed by the real archive sink) is generated once into
--dir and reused. Each bill is `gpu-audit chargeback bill --month 2026-11 --source archive`
in a fresh process (peak RSS from its own ru_maxrss): from the seals (the default: the
rollup of every sealed part whose MAC matches, each part's SHA-256 and the seal chain
checked, the open parts read: `--key`; an unkeyed trail's seals prove nothing, so that
bill reads every part) and, with --streaming, reading, verifying and adding up every record
(`--verify-records`: the streaming path). The two bills must be the same, row for row.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synth_archive import write_archive  # the fast synthetic writer

from gpu_audit.audit.canonical import load_hmac_key

ROOT = Path(__file__).resolve().parents[1]
RUNNER = ("import resource, sys\n"
          "from gpu_audit_app.cli import main\n"
          "rc = main(sys.argv[1:])\n"
          "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,"
          " file=sys.stderr)\n"
          "sys.exit(rc)\n")


def bill(archive: Path, out: Path, *extra: str, key_file: Path | None = None
         ) -> dict[str, Any]:
    cfg = out.parent / f"{out.name}.yaml"
    audit = f"audit:\n  hmac_key_file: {key_file}\n" if key_file is not None else ""
    cfg.write_text(f"{audit}shipper:\n  sinks:\n  - type: archive\n"
                   f"    directory: {archive}\n")
    cmd = [sys.executable, "-c", RUNNER, "chargeback", "bill", "--month", "2026-11", "--source",
           "archive", "--config", str(cfg), "--rates",
           str(ROOT / "chargeback" / "examples" / "rates.yaml"), "--out", str(out), *extra]
    t0 = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=ROOT)
    wall = time.monotonic() - t0
    if done.returncode != 0:
        raise SystemExit(f"chargeback failed ({done.returncode}):\n{done.stderr[-3000:]}")
    rss = int(next(line.split()[1] for line in done.stderr.splitlines()
                   if line.startswith("MAXRSS_KB")))
    rows = list(csv.DictReader(io.StringIO((out / "chargeback.csv").read_text())))
    return {"seconds": round(wall, 2), "peak_rss_mb": round(rss / 1024, 1), "rows": rows,
            "stdout": done.stdout}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--streaming", action="store_true")
    ap.add_argument("--key", action="store_true",
                    help="a keyed trail (records and seals under a key file in --dir): "
                    "only then are seals billed unread; unkeyed, every part is read")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    archive = args.dir / ("archive-keyed" if args.key else "archive")
    key_file = args.dir / "hmac.key" if args.key else None
    args.dir.mkdir(parents=True, exist_ok=True)
    if key_file is not None and not key_file.exists():
        key_file.write_bytes(b"bench-chargeback-key-not-a-secret\n")
    key = load_hmac_key(key_file) if key_file is not None else None
    result: dict[str, Any] = {"gpus": args.hosts * args.gpus, "days": args.days}
    if not archive.is_dir() or not any(archive.iterdir()):
        t0 = time.monotonic()
        n = write_archive(archive, hosts=args.hosts, gpus=args.gpus, days=args.days,
                          workers=args.workers, key=key)
        result["generated"] = {"records": n, "seconds": round(time.monotonic() - t0, 1)}
    parts = [p for p in archive.iterdir() if ".jsonl" in p.name]
    result["archive"] = {"parts": len(parts),
                         "seals": sum(1 for p in archive.iterdir() if p.name.endswith(
                             ".seal.json")),
                         "bytes": sum(p.stat().st_size for p in parts)}
    sealed = bill(archive, args.dir / "sealed", key_file=key_file)
    result["sealed"] = {k: v for k, v in sealed.items() if k != "rows"}
    print(f"{result['gpus']} GPUs x {args.days} days, {result['archive']['parts']} parts, "
          f"{result['archive']['bytes'] / 1e6:.0f} MB: from the seals "
          f"{sealed['seconds']:.1f} s, peak RSS {sealed['peak_rss_mb']:.0f} MB")
    if args.streaming:
        streamed = bill(archive, args.dir / "streamed", "--verify-records",
                        key_file=key_file)
        result["streaming"] = {k: v for k, v in streamed.items() if k != "rows"}
        same = _same(sealed["rows"], streamed["rows"])
        result["same_bill"] = same
        result["ratio"] = round(streamed["seconds"] / sealed["seconds"], 1)
        print(f"  reading every record: {streamed['seconds']:.1f} s, peak RSS "
              f"{streamed['peak_rss_mb']:.0f} MB; ratio {result['ratio']}x; same bill: {same}")
    print(sealed["stdout"])
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


def _same(a: list[dict[str, str]], b: list[dict[str, str]]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        for k in x:
            if k.endswith(("_hours", "_kwh", "_cost")) and x[k] and y[k]:
                if abs(float(x[k]) - float(y[k])) > 1e-6 * max(1.0, abs(float(x[k]))):
                    return False
            elif x[k] != y[k]:
                return False
    return True


if __name__ == "__main__":
    main()
