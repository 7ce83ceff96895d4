"""`gpu-audit chargeback bill --group-by slurm`: the period's bill by Slurm account, partition
and user from the audit trail, and with `--compare-with slurm` each row beside sacct's
GPU TRES-hours (chargeback/slurm/bill.py; docs/SLURM.md).

The trail is the directories given with `--trail` (archives or spools: each node's
exporter archive and its `slurm` stream), else the archive of `--config`. Every chain is
verified as it is read; a broken one is refused (exit 1, the problems listed) unless
--allow-unverified, and then the bill says so.

Exit codes as `gpu-audit chargeback`: 0 written; 1 a source could not be read, the trail
did not verify, or the period holds no Slurm run; 2 bad arguments or rates.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from chargeback.rates import load_rates
from chargeback.slurm.bill import build_slurm_bill, note_unstarted, write_slurm_bill
from chargeback.slurm.trail import Trails
from chargeback.sources.slurm import SacctData, SacctError, read_sacct, read_unstarted
from gpu_audit.errors import EXIT_FAILURE, EXIT_OK, ConfigError
from gpu_audit_app.chargeback.period import period
from gpu_audit_app.chargeback.sources import trail_dirs


def _problems(args: argparse.Namespace) -> list[str]:
    problems = []
    compare = [s.strip() for s in args.compare_with.split(",") if s.strip()]
    if any(s != "slurm" for s in compare):
        problems.append("--group-by slurm compares with `slurm` (sacct) only: "
                        f"not --compare-with {','.join(compare)}")
    if args.rates is None:
        problems.append("--rates FILE is needed (an example: chargeback/examples/rates.yaml)")
    if args.source not in (None, "archive"):
        problems.append("--group-by slurm reads the audit trail (--trail or --config's "
                        f"archive), not --source {args.source}")
    return problems


def slurm_bill_command(args: argparse.Namespace) -> int:
    problems = _problems(args)
    if problems:
        raise ConfigError("arguments", problems)
    start, end = period(args)
    rates = load_rates(args.rates)
    trails, key = trail_dirs(args)
    sacct: SacctData | None = None
    if "slurm" in args.compare_with:
        try:
            sacct = read_sacct(start, end)
        except SacctError as exc:
            print(f"gpu-audit chargeback: sacct: {exc}", file=sys.stderr)
            return EXIT_FAILURE
    reader = Trails(trails, key=key, start_ns=int(start.timestamp() * 1e9),
                    end_ns=int(end.timestamp() * 1e9))
    bill = build_slurm_bill(reader, start, end, rates, sacct,
                            include_simulated=args.include_simulated)
    if sacct is not None and bill.not_in_sacct_runs and not sacct.unstarted:
        try:
            unstarted, command = read_unstarted([job for job, _ in bill.not_in_sacct_runs])
        except SacctError as exc:
            bill.notes.append(f"sacct could not be asked about the runs it lacks: {exc}")
        else:
            note_unstarted(bill, unstarted, command)
    bill.problems = reader.problems
    bill.inputs["trails"] = reader.inputs
    if reader.problems:
        if not args.allow_unverified:
            print(f"gpu-audit chargeback: the audit trail does not verify "
                  f"({len(reader.problems)} problem(s)); --allow-unverified bills it anyway:",
                  file=sys.stderr)
            for p in reader.problems[:20]:
                print(f"  - {p}", file=sys.stderr)
            return EXIT_FAILURE
        bill.notes.append("UNVERIFIED: the audit trail did not verify "
                          "(--allow-unverified); see verification_problems")
    if bill.total.runs == 0 and bill.total.sacct_runs == 0:
        print(f"gpu-audit chargeback: no Slurm run with GPUs in {start.isoformat()} .. "
              f"{end.isoformat()}: no bill written", file=sys.stderr)
        return EXIT_FAILURE
    outputs = write_slurm_bill(bill, Path(args.out))
    t = bill.total
    print(f"chargeback by Slurm account/partition {start.isoformat()} .. {end.isoformat()}: "
          f"{len(bill.rows)} rows, {t.runs} runs, {t.allocated_gpu_seconds / 3600:.4f} "
          f"GPU-h allocated, {t.used_gpu_seconds / 3600:.4f} used")
    if bill.compared:
        ratio = t.difference_ratio
        print(f"compared with sacct: {t.sacct_runs} runs, {t.sacct_gpu_seconds / 3600:.4f} "
              f"GPU-h (difference {t.difference_gpu_seconds / 3600:+.4f} GPU-h"
              + (f", {100 * ratio:+.3f} %)" if ratio is not None else ")"))
        for line in bill.missing_from_trail:
            print(f"in sacct, not in the audit trail: {line}")
        for line in bill.not_in_sacct:
            print(f"in the audit trail, not in sacct: {line}")
    for note in bill.notes:
        print(f"note: {note}")
    for name in sorted(outputs):
        print(f"wrote {Path(args.out) / name}  sha256 {outputs[name]}")
    return EXIT_OK
