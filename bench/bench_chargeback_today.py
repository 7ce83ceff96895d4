"""Today's streaming path, for the comparison with sealed parts: the chargeback
archive reader of the code before sealed parts (per-record parse, re-serialise, hash and
account) on the per-cycle trail it billed (64 GPUs, 10 s samples), generated and billed
by that code's own bench functions, measured here in records per second.

    git archive 4eb094e | tar -x -C /tmp/today-src     # the code before sealed parts
    .venv/bin/python bench/bench_chargeback_today.py --today-src /tmp/today-src \\
        --dir /tmp/today --days 0.25 --json bench/results/chargeback-today.json

The month's time is the month's record count (64 GPUs x 30 days x 8,640 samples x 3
records) at the measured rate: the reader is one pass over the records.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--today-src", type=Path, required=True)
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--days", type=float, default=0.25)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    sys.path[:0] = [str(args.today_src), str(args.today_src / "bench")]
    import bench_chargeback_archive as today  # the old code's bench, not this tree's

    import chargeback.sources.archive as reader

    if not Path(reader.__file__).is_relative_to(args.today_src):
        raise SystemExit(f"imported {reader.__file__}, not the code in {args.today_src}")
    archive = args.dir / "archive"
    archive.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    gen = today.generate(archive, args.days, 64, 10.0)
    generated = time.perf_counter() - t0
    t0 = time.perf_counter()
    today.run_streaming(archive, gen["start"], gen["end"])
    seconds = time.perf_counter() - t0
    month_records = 64 * 30 * 8640 * 3
    rate = gen["records"] / seconds
    result = {"records": gen["records"], "generate_seconds": round(generated, 1),
              "streaming_seconds": round(seconds, 2), "records_per_second": round(rate),
              "month_records": month_records, "month_seconds": round(month_records / rate),
              "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}
    print(f"today's streaming path: {gen['records']} records in {seconds:.1f} s "
          f"({rate:,.0f} records/s); a 64-GPU month at 10 s ({month_records:,} records): "
          f"~{month_records / rate:,.0f} s")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
