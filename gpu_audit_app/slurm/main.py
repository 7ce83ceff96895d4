"""`gpu-audit slurm ...`: gpu-audit on a Slurm cluster (docs/SLURM.md).

- `epilog`: run by deploy/slurm/epilog.sh when a job's run ends on a node: records the
  run and its GPU report (gpu_audit_app/slurm/epilog.py).
- `jobreport JOBID`: the job's GPU report, seff/jobstats style, from the node's stored
  reports, Slurm's AdminComment, or the `job_finished` records of an audit trail.
- `health`: the node health check: drains a node whose exporter reports a GPU lost and
  requeues the jobs on it (gpu_audit_app/slurm/health.py).
- `idle`: the optional idle-GPU policy: jobs holding GPUs idle while others wait, flagged
  or requeued through scontrol; dry run unless --apply (gpu_audit_app/slurm/idle.py).

Exit codes: 0 done; 1 nothing found or a Slurm command failed; 2 bad arguments.

Building the parser imports nothing but argparse: `gpu-audit --help` and the launcher's
clients (which drop privileges before parsing) never load the Slurm machinery.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from gpu_audit.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE
from gpu_audit.rules import IDLE_UTILIZATION

if TYPE_CHECKING:
    from chargeback.slurm.report import RunReport


def add_arguments(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="slurm_command", metavar="COMMAND", required=True)
    e = sub.add_parser("epilog", help="Record a finished run and its GPU report (Epilog).",
                       description="Called by deploy/slurm/epilog.sh with Slurm's "
                       "SLURM_JOB_* environment: records the run's allocation and usage "
                       "(audit stream `slurm`), stores and prints its GPU report.")
    e.add_argument("--config", type=Path, metavar="FILE",
                   help="This node's gpu-audit configuration (where the exporter's spool "
                   "and archive are; the audit HMAC key).")
    e.add_argument("--jobmap-dir", type=Path, metavar="DIR",
                   help="The prolog's job-mapping directory (GPU_AUDIT_JOBMAP_DIR; default "
                   "/run/gpu-audit/jobs).")
    e.add_argument("--events-dir", type=Path, metavar="DIR",
                   help="Where the prolog made the job's events file <JOBID>.jsonl "
                   "(default $GPU_AUDIT_SLURM_EVENTS_DIR or /run/gpu-audit/slurm-events): "
                   "the run's progress and environment come from it.")
    e.add_argument("--slurm-dir", type=Path, metavar="DIR",
                   help="Where the `slurm` spool and the reports go (GPU_AUDIT_SLURM_DIR; "
                   "default /var/lib/gpu-audit/slurm).")
    e.add_argument("--trail-wait", type=float, default=None, metavar="SECONDS",
                   help="Wait at most this long for the exporter to write the audit "
                   "interval in which the run ended (default: until that interval's "
                   "record is due, up to audit.interval_seconds plus three samples; 0: "
                   "do not wait, the report may miss the run's last interval).")
    e.add_argument("--admin-comment", action="store_true",
                   help="Also store the report in the job's AdminComment (sacctmgr), so "
                   "`jobreport` finds it from any host.")

    c = sub.add_parser("store-comment", help="Store a finished job's reports in its "
                       "AdminComment once slurmdbd has its end (started by `epilog "
                       "--admin-comment`).")
    c.add_argument("job_id", metavar="JOBID", help="The Slurm job whose report to store.")
    c.add_argument("--slurm-dir", type=Path, metavar="DIR",
                   help="Where the epilog left the job's report (the epilog's --slurm-dir).")
    c.add_argument("--wait", type=float, default=300.0, metavar="SECONDS",
                   help="Give up when sacct has not shown the run's end by then.")

    r = sub.add_parser("jobreport", help="A job's GPU report (seff/jobstats style).",
                       description="The GPU report of every run of a job: GPU-hours "
                       "allocated and used, busy share, idle-held time, peak memory, energy, "
                       "and notes on what to change.")
    r.add_argument("job_id", metavar="JOBID", help="The Slurm job (its runs and requeues).")
    r.add_argument("--slurm-dir", type=Path, metavar="DIR",
                   help="This node's stored reports (GPU_AUDIT_SLURM_DIR; default "
                   "/var/lib/gpu-audit/slurm).")
    r.add_argument("--trail", type=Path, action="append", default=[], metavar="DIR",
                   help="Read the job's records from this archive or spool of the `slurm` "
                   "stream instead (repeatable).")
    r.add_argument("--no-sacct", action="store_true",
                   help="Do not look in Slurm's AdminComment.")
    r.add_argument("--json", action="store_true", help="JSON instead of text.")

    _health_arguments(sub.add_parser("health", help="Drain a node whose GPU is lost; requeue its "
                              "jobs (HealthCheckProgram; dry run unless --apply).",
                              description="Ask this node's exporter which GPUs are down; "
                              "for each, drain the node with the reason and requeue the jobs "
                              "holding it, so they resume from their checkpoints elsewhere; "
                              "prints what it would do, and does it with --apply."))
    _idle_arguments(sub.add_parser("idle", help="Flag or requeue jobs holding GPUs idle while "
                            "others wait (dry run unless --apply).",
                            description="The optional idle-GPU policy: from Prometheus, "
                            "the running jobs whose GPUs stayed under a utilisation "
                            "threshold over a window while GPU jobs wait; prints what it "
                            "would do, and does it with --apply."))


def _health_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--exporter", metavar="URL",
                   help="This node's exporter (GPU_AUDIT_EXPORTER_URL; default "
                   "http://127.0.0.1:9945).")
    p.add_argument("--node", metavar="NAME",
                   help="This node's Slurm name (SLURMD_NODENAME; default the short host "
                   "name).")
    p.add_argument("--jobmap-dir", type=Path, metavar="DIR",
                   help="The prolog's job-mapping files, which say whose jobs hold which "
                   "GPU (GPU_AUDIT_JOBMAP_DIR; default /run/gpu-audit/jobs).")
    p.add_argument("--no-requeue", action="store_true",
                   help="Drain only; leave the jobs on the lost GPU alone.")
    p.add_argument("--apply", action="store_true",
                   help="Drain and requeue (default: a dry run that only prints; "
                   "healthcheck.sh passes --apply).")
    p.add_argument("--dry-run", action="store_true",
                   help="Deprecated, the default now: say what would be done.")


def _idle_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--prometheus-url", metavar="URL", required=True,
                   help="Prometheus (or a compatible engine) scraping the nodes' exporters.")
    p.add_argument("--window", type=float, default=1800.0, metavar="SECONDS",
                   help="Judge the last this many seconds (default 1800).")
    p.add_argument("--threshold", type=float, default=IDLE_UTILIZATION, metavar="RATIO",
                   help=f"Idle below this mean GPU utilisation (default {IDLE_UTILIZATION:g}).")
    p.add_argument("--min-runtime", type=float, default=None, metavar="SECONDS",
                   help="Leave younger jobs alone (default: the window).")
    p.add_argument("--action", choices=("flag", "requeue"), default="flag",
                   help="flag: set the job's Comment; requeue: requeue it (default flag).")
    p.add_argument("--exempt-account", action="append", default=[], metavar="ACCOUNT",
                   help="Never flag or requeue this account's jobs (repeatable).")
    p.add_argument("--exempt-partition", action="append", default=[], metavar="PARTITION",
                   help="Never flag or requeue jobs in this partition (repeatable).")
    p.add_argument("--even-without-waiters", action="store_true",
                   help="Act even when no GPU job is waiting.")
    p.add_argument("--include-simulated", action="store_true",
                   help="Judge from simulated series too (tests, demos).")
    p.add_argument("--apply", action="store_true",
                   help="Do it (default: a dry run that only prints).")
    p.add_argument("--json", action="store_true", help="JSON lines instead of text.")


def _reports_from_sacct(job_id: str) -> list[RunReport]:
    from chargeback.slurm.report import parse_admin_comment
    from gpu_audit import slurmcmd

    text = slurmcmd.run("sacct", ["-j", job_id, "-X", "-n", "-P", "-o", "AdminComment"])
    out: list[RunReport] = []
    for line in text.splitlines():
        out += parse_admin_comment(line) or []
    return out


def _reports_from_trails(job_id: str, dirs: list[Path]) -> list[RunReport]:
    from chargeback.slurm.report import RunReport
    from chargeback.slurm.trail import Trails

    out = []
    for rec in Trails(dirs):
        if rec.get("stream") == "slurm":
            report = RunReport.from_record(rec)
            if report is not None and report.job_id == job_id:
                out.append(report)
    return out


def jobreport(args: argparse.Namespace) -> int:
    from chargeback.slurm.report import render_text
    from gpu_audit import slurmcmd
    from gpu_audit_app.slurm.epilog import DEFAULT_SLURM_DIR, stored_reports

    job_id = args.job_id.strip()
    if not job_id.isdigit():
        print(f"gpu-audit slurm jobreport: {job_id!r} is not a Slurm job id", file=sys.stderr)
        return EXIT_USAGE
    where = ""
    if args.trail:
        reports, where = _reports_from_trails(job_id, args.trail), "the audit trail"
    else:
        slurm_dir = Path(args.slurm_dir or os.environ.get("GPU_AUDIT_SLURM_DIR")
                         or DEFAULT_SLURM_DIR)
        reports, where = stored_reports(slurm_dir, job_id), str(slurm_dir / "reports")
        if not reports and not args.no_sacct:
            try:
                reports, where = _reports_from_sacct(job_id), "Slurm's AdminComment"
            except slurmcmd.SlurmCommandError as exc:
                print(f"gpu-audit slurm jobreport: {exc}", file=sys.stderr)
    if not reports:
        print(f"gpu-audit slurm jobreport: no GPU report for job {job_id} (looked in "
              f"{where}; a job without GPUs has none)", file=sys.stderr)
        return EXIT_FAILURE
    if args.json:
        print(json.dumps([r.to_json() for r in reports], indent=2, sort_keys=True))
    else:
        print(render_text(reports), end="")
    return EXIT_OK


def command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    cmd = args.slurm_command
    if cmd == "epilog":
        from gpu_audit_app.slurm.epilog import epilog

        return epilog(args)
    if cmd == "jobreport":
        return jobreport(args)
    if cmd == "store-comment":
        from gpu_audit_app.slurm.epilog import store_comment

        return store_comment(args)
    if cmd == "health":
        from gpu_audit_app.slurm.health import health

        return health(args)
    from gpu_audit_app.slurm.idle import idle  # the last of the required actions

    return idle(args)
