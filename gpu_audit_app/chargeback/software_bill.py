"""`gpu-audit chargeback bill --group-by software` (or `software:NAME`): the period's GPU-hours
of GPU processes by what they ran, from the audit trail (chargeback/software.py;
docs/CHARGEBACK.md "By software").

The trail is the directories given with `--trail`, else the archive of `--config`; every
chain is verified as it is read and a broken one is refused unless --allow-unverified.
Usage records count inside the period; the `process_start` records that name a process's
software are looked for from LOOKBACK before it (a process started earlier than that is
in the group "(no software recorded)"). The output is deterministic: the same trail and
arguments give byte-identical software.json and software.csv (their sha256 printed), and
the groups add up to the processes' GPU-seconds (the reconciliation, in the JSON).

Exit codes as `gpu-audit chargeback`: 0 written; 1 the trail could not be read or did not
verify, or the period holds no GPU process; 2 bad arguments.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import math
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson

from chargeback.slurm.trail import Trails
from chargeback.software import SoftwareUsage
from gpu_audit.atomicfile import replace_file
from gpu_audit.errors import EXIT_FAILURE, EXIT_OK, ConfigError
from gpu_audit_app.chargeback.period import period
from gpu_audit_app.chargeback.sources import trail_dirs

LOOKBACK = timedelta(days=7)


def _problems(args: argparse.Namespace) -> list[str]:
    problems = []
    if args.source not in (None, "archive"):
        problems.append(f"--group-by {args.group_by} reads the audit trail (--trail or "
                        f"--config's archive), not --source {args.source}")
    if [s for s in args.compare_with.split(",") if s.strip()]:
        problems.append(f"--group-by {args.group_by}: --compare-with is not supported")
    return problems


def software_bill_command(args: argparse.Namespace) -> int:
    problems = _problems(args)
    if problems:
        raise ConfigError("arguments", problems)
    start, end = period(args)
    trails, key = trail_dirs(args)
    start_ns, end_ns = int(start.timestamp() * 1e9), int(end.timestamp() * 1e9)
    usage = SoftwareUsage(start_ns=start_ns, end_ns=end_ns,
                          include_simulated=args.include_simulated)
    reader = Trails(trails, key=key, start_ns=int((start - LOOKBACK).timestamp() * 1e9),
                    end_ns=end_ns)
    for rec in reader:
        usage.add(rec)
    if reader.problems and not args.allow_unverified:
        print(f"gpu-audit chargeback: the audit trail does not verify "
              f"({len(reader.problems)} problem(s)); --allow-unverified reads it anyway:",
              file=sys.stderr)
        for p in reader.problems[:20]:
            print(f"  - {p}", file=sys.stderr)
        return EXIT_FAILURE
    groups = usage.groups(args.group_by)
    total = usage.total_gpu_seconds()
    if not groups:
        print(f"gpu-audit chargeback: no GPU process in {start.isoformat()} .. "
              f"{end.isoformat()}: nothing written", file=sys.stderr)
        return EXIT_FAILURE
    summed = math.fsum(g.gpu_seconds for g in groups)
    doc: dict[str, Any] = {
        "group_by": args.group_by, "period": {"start": start.isoformat(),
                                              "end": end.isoformat()},
        "inputs": {"trails": reader.inputs, "lookback_seconds": LOOKBACK.total_seconds(),
                   "include_simulated": bool(args.include_simulated)},
        "groups": [{"software": g.label, "gpu_hours": g.gpu_seconds / 3600,
                    "gpu_seconds": g.gpu_seconds, "processes": g.processes,
                    "users": sorted(g.users)} for g in groups],
        "reconciliation": {"process_gpu_seconds": total, "groups_gpu_seconds": summed,
                           "difference_gpu_seconds": summed - total},
        "simulated_left_out": usage.simulated_left_out,
        "unverified": bool(reader.problems),
        "verification_problems": reader.problems[:100],
    }
    text = io.StringIO()
    w = csv.writer(text, lineterminator="\n")
    w.writerow(["software", "gpu_hours", "processes", "users"])
    for g in groups:
        w.writerow([g.label, f"{g.gpu_seconds / 3600:.6f}", g.processes, len(g.users)])
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    files = {"software.json": orjson.dumps(doc, option=orjson.OPT_SORT_KEYS
                                           | orjson.OPT_INDENT_2),
             "software.csv": text.getvalue().encode()}
    print(f"GPU-hours by {args.group_by} {start.isoformat()} .. {end.isoformat()}: "
          f"{len(groups)} groups, {total / 3600:.4f} GPU-h of GPU processes")
    width = min(max(len(g.label) for g in groups), 70)
    for g in groups:
        share = g.gpu_seconds / total if total > 0 else 0.0
        print(f"  {g.label[:70]:<{width}}  {g.gpu_seconds / 3600:>12.4f} GPU-h  "
              f"{share:>6.1%}  {g.processes} process(es), {len(g.users)} user(s)")
    if reader.problems:
        print("note: UNVERIFIED: the audit trail did not verify (--allow-unverified)")
    for name in sorted(files):
        replace_file(out / name, files[name])
        print(f"wrote {out / name}  sha256 {hashlib.sha256(files[name]).hexdigest()}")
    return EXIT_OK
