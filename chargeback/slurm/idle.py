"""The idle-GPU policy's decisions (as Princeton's Job Defense Shield, but keeping work):
which running jobs hold GPUs idle while other GPU jobs wait, and what to do about each.

Pure: the caller measures (Prometheus) and asks Slurm (squeue), then acts on the
decisions (scontrol). A decision names its evidence; nothing here acts.

A job is an idle holder when, over the window, its GPUs' utilisation averaged below
the threshold, it was seen on its GPUs for most of the window (a job that just started
is not judged on a few samples), it has run at least `min_runtime`, its account and
partition are not exempt, and at least one GPU job waits for resources (unless told to
act regardless).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_audit.rules import IDLE_UTILIZATION

ACTIONS = ("flag", "requeue")
# squeue reasons of a pending job that waits for GPUs others hold
WAITING_REASONS = frozenset({"Resources", "Priority", "ReqNodeNotAvail"})


@dataclass(frozen=True, slots=True)
class RunningJob:
    job_id: str
    user: str
    account: str
    partition: str
    runtime_s: float


@dataclass(frozen=True, slots=True)
class PendingJob:
    job_id: str
    reason: str
    wants_gpus: bool


@dataclass(frozen=True, slots=True)
class Measured:
    """A job's GPUs over the window: mean utilisation and the share of the window it was
    seen holding them."""

    utilization: float
    coverage: float


@dataclass(frozen=True, slots=True)
class Policy:
    threshold: float = IDLE_UTILIZATION
    window_s: float = 1800.0
    min_runtime_s: float = 1800.0
    min_coverage: float = 0.8
    action: str = "flag"
    exempt_accounts: frozenset[str] = frozenset()
    exempt_partitions: frozenset[str] = frozenset()
    require_waiters: bool = True


@dataclass(frozen=True, slots=True)
class Decision:
    job: RunningJob
    measured: Measured | None
    action: str | None  # None: left alone
    why: str


def waiting_gpu_jobs(pending: Sequence[PendingJob]) -> list[PendingJob]:
    return [p for p in pending if p.wants_gpus and p.reason in WAITING_REASONS]


def decide(policy: Policy, running: Sequence[RunningJob],
           measured: Mapping[str, Measured], pending: Sequence[PendingJob]) -> list[Decision]:
    """One decision per running job that holds GPUs (is in `measured`)."""
    waiters = waiting_gpu_jobs(pending)
    out = []
    for job in sorted(running, key=lambda j: int(j.job_id) if j.job_id.isdigit() else 0):
        m = measured.get(job.job_id)
        if m is None:
            continue  # no GPU, or not seen by any exporter
        out.append(Decision(job, m, *_judge(policy, job, m, len(waiters))))
    return out


def _judge(policy: Policy, job: RunningJob, m: Measured,
           waiters: int) -> tuple[str | None, str]:
    busy = f"GPUs {m.utilization:.1%} busy over the last {policy.window_s:g} s"
    if m.utilization >= policy.threshold:
        return None, f"{busy}: not idle"
    if m.coverage < policy.min_coverage:
        return None, f"{busy}, but seen only {m.coverage:.0%} of the window: not judged yet"
    if job.runtime_s < policy.min_runtime_s:
        return None, f"{busy}, but running only {job.runtime_s:g} s: not judged yet"
    if job.account in policy.exempt_accounts:
        return None, f"{busy}; account {job.account} is exempt"
    if job.partition in policy.exempt_partitions:
        return None, f"{busy}; partition {job.partition} is exempt"
    if policy.require_waiters and not waiters:
        return None, f"{busy}; no GPU job is waiting"
    return policy.action, f"{busy} (< {policy.threshold:.0%}) while {waiters} GPU job(s) wait"
