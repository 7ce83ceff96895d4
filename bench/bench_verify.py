"""`gpu-audit audit verify` on an archive against the hashing floor, in CPU time (user +
sys of the command and every process it starts) and wall time, the parts in page cache:
`cat PARTS | gzip -dcf | sha256sum` (read, decompress and hash every byte: what any
check of the stored bytes costs), then the full record-by-record verification (every
record's hash and chain, every seal against its part's records, its rollup included),
then `--fast` (on an unkeyed archive no seal is authentic: it reads every part too;
`--key`: an archive keyed with a key file, verified with it).

    .venv/bin/python bench/bench_verify.py --dir /tmp/cb64 [--hosts 8 --gpus 8 --days 30] \\
        --json bench/results/verify.json

The archive is synth_archive.py's (reused when --dir already holds one, e.g. the one
bench_chargeback_sealed.py generated). Each command runs in a fresh process, one worker
(`--workers 1`: CPU time is what is compared; more workers only spread it); a warm-up
read puts the parts in page cache, and the best of --repeat runs is kept for each,
interleaved so that load on the shared machine hits all of them alike.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from synth_archive import write_archive

from gpu_audit.archive import list_parts
from gpu_audit.audit.canonical import load_hmac_key


def _run(cmd: str) -> tuple[float, float, str]:
    """(CPU seconds of the command and its children, wall seconds, stdout)."""
    before = os.times()
    t0 = time.monotonic()
    done = subprocess.run(cmd, shell=True, capture_output=True, text=True, check=False)
    wall = time.monotonic() - t0
    after = os.times()
    if done.returncode != 0:
        raise SystemExit(f"{cmd}: exit {done.returncode}\n{done.stdout[-2000:]}"
                         f"{done.stderr[-2000:]}")
    cpu = (after.children_user - before.children_user
           + after.children_system - before.children_system)
    return cpu, wall, done.stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--hosts", type=int, default=8)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--key", action="store_true",
                    help="key the records and seals (a key file in --dir): verification "
                    "with the key, whose authentic seals need no rollup recomputed")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    archive = args.dir / ("archive-keyed" if args.key else "archive")
    key_file = args.dir / "hmac.key"
    if args.key and not key_file.exists():
        key_file.write_bytes(b"bench-verify-key-not-a-secret\n")
    if not archive.is_dir() or not any(archive.iterdir()):
        write_archive(archive, hosts=args.hosts, gpus=args.gpus, days=args.days,
                      key=load_hmac_key(key_file) if args.key else None)
    parts = list_parts(archive)
    files = " ".join(shlex.quote(str(p.path)) for p in parts)
    gpu_audit = shlex.quote(str(Path(sys.executable).with_name("gpu-audit")))
    a = shlex.quote(str(archive))
    if args.key:
        a = f"--hmac-key-file {shlex.quote(str(key_file))} {a}"
    commands = {
        "cat | gzip -dcf | sha256sum": f"cat {files} | gzip -dcf | sha256sum",
        "audit verify": f"{gpu_audit} audit verify --workers 1 {a}",
        "audit verify --fast": f"{gpu_audit} audit verify --fast --workers 1 {a}",
    }
    _run(f"cat {files} > /dev/null")  # page cache
    best: dict[str, tuple[float, float]] = {}
    out: dict[str, str] = {}
    for _ in range(args.repeat):
        for name, cmd in commands.items():
            cpu, wall, text = _run(cmd)
            old = best.get(name)
            best[name] = (min(old[0], cpu), min(old[1], wall)) if old else (cpu, wall)
            out[name] = text
    head = out["audit verify"].splitlines()[0]
    records = int(head.split(": ")[1].split()[0])
    raw = sum(p.path.stat().st_size for p in parts)
    floor = best["cat | gzip -dcf | sha256sum"]
    result: dict[str, Any] = {
        "parts": len(parts), "records": records, "bytes_on_disk": raw,
        "cpu_seconds": {k: round(v[0], 2) for k, v in best.items()},
        "wall_seconds": {k: round(v[1], 2) for k, v in best.items()},
        "cpu_ratio_to_floor": {k: round(v[0] / floor[0], 2) for k, v in best.items()},
    }
    print(f"{len(parts)} parts, {records} records, {raw / 1e6:.0f} MB on disk (page cache)")
    for name, (cpu, wall) in best.items():
        print(f"  {name:<28} CPU {cpu:7.2f} s  {cpu / floor[0]:5.2f}x the floor   "
              f"wall {wall:7.2f} s")
    print(head)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
