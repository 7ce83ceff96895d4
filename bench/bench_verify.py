"""`gpu-audit audit verify` on an archive against the hashing floor, in one run:
`zcat PARTS | sha256sum` (decompress every part and hash every byte: what any check of
the stored bytes costs), then the full record-by-record verification, then `--fast`.

    .venv/bin/python bench/bench_verify.py --dir /tmp/cb64 [--hosts 8 --gpus 8 --days 30] \\
        --json bench/results/verify.json

The archive is synth_archive.py's (reused when --dir already holds one, e.g. the one
bench_chargeback_sealed.py generated). Each command runs in a fresh process; the best of
--repeat runs is kept for each, interleaved so that load on the shared machine hits all
three alike.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synth_archive import write_archive

from gpu_audit.archive import list_parts


def _run(cmd: str) -> tuple[float, str]:
    t0 = time.monotonic()
    done = subprocess.run(cmd, shell=True, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    if done.returncode not in (0,):
        raise SystemExit(f"{cmd}: exit {done.returncode}\n{done.stdout[-2000:]}"
                         f"{done.stderr[-2000:]}")
    return wall, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    archive = args.dir / "archive"
    if not archive.is_dir() or not any(archive.iterdir()):
        write_archive(archive, hosts=args.hosts, gpus=args.gpus, days=args.days)
    parts = list_parts(archive)
    gz = [p.path for p in parts if p.compressed]
    plain = [p.path for p in parts if not p.compressed]
    files = " ".join(shlex.quote(str(p)) for p in gz)
    extra = " ".join(shlex.quote(str(p)) for p in plain)
    floor = f"(zcat {files}; cat {extra}) | sha256sum"
    gpu_audit = shlex.quote(str(Path(sys.executable).with_name("gpu-audit")))
    commands = {
        "zcat | sha256sum": floor,
        "audit verify": f"{gpu_audit} audit verify {shlex.quote(str(archive))}",
        "audit verify --fast": f"{gpu_audit} audit verify --fast {shlex.quote(str(archive))}",
    }
    best: dict[str, float] = {}
    out: dict[str, str] = {}
    for _ in range(args.repeat):
        for name, cmd in commands.items():
            wall, text = _run(cmd)
            best[name] = min(best.get(name, wall), wall)
            out[name] = text
    head = out["audit verify"].splitlines()[0]
    records = int(head.split(": ")[1].split()[0])
    raw = sum(p.stat().st_size for p in gz) + sum(p.stat().st_size for p in plain)
    result: dict[str, Any] = {
        "parts": len(parts), "records": records, "bytes_on_disk": raw,
        "seconds": {k: round(v, 2) for k, v in best.items()},
        "ratio_to_floor": {k: round(v / best["zcat | sha256sum"], 2) for k, v in best.items()},
    }
    print(f"{len(parts)} parts, {records} records, {raw / 1e6:.0f} MB on disk")
    for name, v in best.items():
        print(f"  {name:<22} {v:8.2f} s  {v / best['zcat | sha256sum']:5.2f}x the floor")
    print(head)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
