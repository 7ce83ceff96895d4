"""`gpu-audit slurm idle`: the optional idle-GPU policy (chargeback/slurm/idle.py decides).

Measures from Prometheus, over `--window`, each Slurm job's GPUs: the mean utilisation of
the GPUs it holds (`gpu_utilization_ratio` joined with the exporter's
`gpu_allocation_info{slurm_job=...}`) and how much of the window it held them; asks
`squeue` which jobs run and which GPU jobs wait; prints one line per GPU job with the
decision and its evidence. With `--apply` it acts through the real scontrol: `flag` sets
the job's Comment (the user sees it in squeue/scontrol), `requeue` requeues it (a job
run through deploy/slurm/sbatch-checkpoint.sh checkpoints on the signal and resumes
later from where it stopped). Without `--apply` nothing is changed.

Simulated series (`simulated="true"`) are left out unless --include-simulated.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from chargeback.slurm.idle import (
    Decision,
    Measured,
    PendingJob,
    Policy,
    RunningJob,
    decide,
)
from gpu_audit import slurmcmd
from gpu_audit.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE

_RUNNING = ("JobID", "User", "Account", "Partition", "TimeUsed")
_PENDING = ("JobID", "Reason", "TRES")


def _query(url: str, expr: str) -> list[dict[str, Any]]:
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"--prometheus-url {url!r} is not an http(s) URL")
    q = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url.rstrip('/')}/api/v1/query?{q}",  # noqa: S310
                                timeout=30) as resp:
        doc = json.loads(resp.read(64 * 1024 * 1024))
    if doc.get("status") != "success":
        raise ValueError(f"Prometheus refused the query: {doc.get('error', doc)}")
    result: list[dict[str, Any]] = doc["data"]["result"]
    return result


def measure(url: str, window: float, include_simulated: bool) -> dict[str, Measured]:
    """slurm job id -> its GPUs' mean utilisation and coverage over the window."""
    sim = "" if include_simulated else ', simulated!="true"'
    alloc = f'max by (instance, uuid, slurm_job) (gpu_allocation_info{{slurm_job!=""{sim}}})'
    held = (f"max by (instance, uuid) (gpu_utilization_ratio{{{sim.lstrip(', ')}}})"
            f" * on (instance, uuid) group_right () {alloc}")
    w = f"{int(window)}s"
    step = max(int(window // 60), 1)
    util = _query(url, f"avg by (slurm_job) (avg_over_time(({held})[{w}:{step}s]))")
    seen = _query(url, f"max by (slurm_job) (count_over_time(({alloc})[{w}:{step}s]))")
    samples = window / step
    counts = {r["metric"].get("slurm_job", ""): float(r["value"][1]) for r in seen}
    out = {}
    for r in util:
        job = r["metric"].get("slurm_job", "")
        if job:
            out[job] = Measured(float(r["value"][1]), min(counts.get(job, 0.0) / samples, 1.0))
    return out


def _seconds(text: str) -> float:
    """squeue's TimeUsed ([days-]hours:minutes:seconds, or minutes:seconds) in seconds."""
    days = 0
    if "-" in text:
        d, text = text.split("-", 1)
        days = int(d)
    parts = [int(x) for x in text.split(":")]
    while len(parts) < 3:
        parts.insert(0, 0)
    return days * 86400 + parts[0] * 3600 + parts[1] * 60 + parts[2]


def slurm_jobs() -> tuple[list[RunningJob], list[PendingJob]]:
    running = [RunningJob(r["JobID"], r["User"], r["Account"], r["Partition"],
                          _seconds(r["TimeUsed"]))
               for r in slurmcmd.parsable(slurmcmd.run("squeue", [
                   "-h", "-t", "RUNNING", "-o", "%i|%u|%a|%P|%M"]), _RUNNING)]
    pending = [PendingJob(r["JobID"], r["Reason"], "gpu" in r["TRES"])
               for r in slurmcmd.parsable(slurmcmd.run("squeue", [
                   "-h", "-t", "PENDING", "-o", "%i|%r|%b"]), _PENDING)]
    return running, pending


def act(decision: Decision) -> str | None:
    """Carry out a decision through scontrol; the error, if any."""
    job = decision.job.job_id
    try:
        if decision.action == "flag":
            slurmcmd.run("scontrol", ["update", f"JobId={job}",
                                      f"Comment=gpu-audit idle-policy: {decision.why}"])
        elif decision.action == "requeue":
            slurmcmd.run("scontrol", ["requeue", job])
    except slurmcmd.SlurmCommandError as exc:
        return str(exc)
    return None


def idle(args: argparse.Namespace) -> int:
    if not 0 <= args.threshold <= 1 or args.window <= 0:
        print("gpu-audit slurm idle: --threshold is a ratio 0..1 and --window positive",
              file=sys.stderr)
        return EXIT_USAGE
    policy = Policy(threshold=args.threshold, window_s=args.window,
                    min_runtime_s=args.window if args.min_runtime is None else args.min_runtime,
                    action=args.action, exempt_accounts=frozenset(args.exempt_account),
                    exempt_partitions=frozenset(args.exempt_partition),
                    require_waiters=not args.even_without_waiters)
    try:
        measured = measure(args.prometheus_url, args.window, args.include_simulated)
        running, pending = slurm_jobs()
    except (OSError, urllib.error.URLError, ValueError, KeyError) as exc:
        print(f"gpu-audit slurm idle: cannot measure: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except slurmcmd.SlurmCommandError as exc:
        print(f"gpu-audit slurm idle: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    ok = True
    mode = "" if args.apply else "would "
    for d in decide(policy, running, measured, pending):
        error = act(d) if args.apply and d.action is not None else None
        ok = ok and error is None
        verdict = f"{mode}{d.action}" if d.action else "leave"
        if args.json:
            print(json.dumps({"job": d.job.job_id, "user": d.job.user,
                              "account": d.job.account, "partition": d.job.partition,
                              "action": d.action, "applied": bool(args.apply and d.action
                                                                  and error is None),
                              "why": d.why, "error": error}, sort_keys=True))
        else:
            print(f"job {d.job.job_id} ({d.job.user}, {d.job.account}/{d.job.partition}): "
                  f"{verdict}: {d.why}" + (f" [failed: {error}]" if error else ""))
    if not args.apply:
        print("dry run: nothing changed (--apply acts)", file=sys.stderr)
    return EXIT_OK if ok else EXIT_FAILURE
