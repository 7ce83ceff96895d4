"""`gpu-audit capacity`'s arguments, apart from the command: building the whole parser
(every `gpu-audit` call, the launcher's clients after they dropped privileges) loads
only this, never the report's sources, replay or Slurm machinery."""

from __future__ import annotations

import argparse

from gpu_audit_app.chargeback.period import add_location_arguments, add_period_arguments

SOURCES = ("archive", "prometheus", "elasticsearch", "opensearch", "slurm")
BINS = {"hour": 3600.0, "day": 86400.0}


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_period_arguments(p)
    p.add_argument("--source", default="archive", choices=SOURCES,
                   help="Where the fleet figures come from (default archive), as for "
                   "`gpu-audit chargeback`; slurm: sacct's allocations against the GPUs "
                   "of `scontrol show node` (busy, held idle and down not known).")
    add_location_arguments(p)
    p.add_argument("--prometheus-url", metavar="URL",
                   help="Prometheus-compatible query API, with --source prometheus.")
    p.add_argument("--bin", choices=sorted(BINS), default="day",
                   help="Bin length for the per-bin figures (p95/p99 allocated GPUs, hours "
                   "at >= 90 %%): day (default; the archive is read once, each sealed day "
                   "from its seal) or hour (the archive's parts read once, record by "
                   "record: a seal sums a whole day).")
    p.add_argument("--launcher-state", metavar="DB", action="append", default=[],
                   help="A launcher store (state.db) to read queue waits from (repeatable, "
                   "one per node).")
    p.add_argument("--slurm", action="store_true",
                   help="Read Slurm pending times (sacct) as queue waits too.")
    p.add_argument("--horizon-days", type=int, default=183, metavar="N",
                   help="How far ahead the forecast looks (default 183: six months).")
    p.add_argument("--whatif-gpus", metavar="N", type=int, action="append", default=[],
                   help="Replay the period's launcher queue with N more GPUs (repeatable).")
    p.add_argument("--node-gpus", metavar="N", type=int, default=None,
                   help="GPUs of the launcher's node for the replay (default: the GPUs the "
                   "store's jobs were started on).")
    p.add_argument("--whatif-trace", metavar="FILE",
                   help="Replay this trace (docs/REPLAY.md) instead of the queue rebuilt "
                   "from --launcher-state.")
    p.add_argument("--out", metavar="DIR", default="capacity-out", help="Output directory.")
    p.add_argument("--no-png", action="store_true", help="Write the charts as SVG only.")
    p.add_argument("--include-simulated", action="store_true",
                   help="Count simulated records too (left out by default).")
    p.add_argument("--allow-gaps", action="store_true",
                   help="Use a trail with gaps (said in the report).")
    p.add_argument("--hash-parts", action="store_true",
                   help="Check each sealed archive part's SHA-256 against its seal (default: "
                   "its size: the report uses the key-proven seals' sums, never the "
                   "parts' bytes; `gpu-audit audit verify` checks them).")
    p.add_argument("--allow-unverified", action="store_true",
                   help="Use an archive whose hash chain does not verify (said in the report).")
