"""Chargeback from Prometheus: recording rules vs raw series, on a backfilled month.

Builds a regular fleet (tests/chargeback/month.py `fleet`: N GPUs, 12-hour holds by
eight users, idle gaps, a one-day outage), backfills it into a real Prometheus with
promtool (raw series, then the recording rules of alerts/ that chargeback reads, in
dependency rounds) and
times the Prometheus source reading the whole period
  (a) through the recording rules (what `gpu-audit chargeback` does), and
  (b) from the raw series (every rule expanded into a subquery at the rule interval),
alternating (a) and (b) `--repeat` times against the same server; reports the best of
each, the ratio, and the time the backfill took.

    PYTHONPATH=. .venv/bin/python bench/bench_chargeback_prom.py \\
        [--gpus 64] [--days 30] [--step 10] [--rule-interval 60] [--repeat 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from chargeback.model import Request
from chargeback.sources.prometheus import RULES, read_prometheus
from tests.chargeback.month import fleet
from tests.chargeback.promfill import backfilled_prometheus


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=64)
    ap.add_argument("--days", type=int, default=30)
    ap.add_argument("--step", type=int, default=10, help="sampling step, seconds")
    ap.add_argument("--rule-interval", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    month = fleet(args.gpus, days=args.days, step=args.step)
    result: dict[str, object] = {"gpus": args.gpus, "days": args.days, "step_s": args.step,
                                 "rule_interval_s": args.rule_interval,
                                 "gpu_samples": args.gpus * month.steps}
    with tempfile.TemporaryDirectory() as tmp, \
            backfilled_prometheus(Path(tmp), month, args.rule_interval,
                                  records=set(RULES)) as prom:
        result["samples_backfilled"] = prom.samples
        result["backfill_s"] = {k: round(v, 1) for k, v in prom.timings.items()}
        req = Request(month.start, month.end, "prometheus", None, prom.url, None, None,
                      "none", tmp)
        times: dict[str, list[float]] = {"rules": [], "raw": []}
        held: dict[str, float] = {}
        for _ in range(args.repeat):
            for mode in ("rules", "raw"):
                t0 = time.perf_counter()
                data = read_prometheus(req, raw=mode == "raw")
                times[mode].append(time.perf_counter() - t0)
                held[mode] = sum(u.charged_gpu_seconds for u in data.usage.values()) / 3600
        result["read_s"] = {m: round(min(v), 2) for m, v in times.items()}
        result["raw_over_rules"] = round(min(times["raw"]) / min(times["rules"]), 1)
        result["charged_gpu_hours"] = {m: round(v, 1) for m, v in held.items()}
        result["queries"] = len(data.queries)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
