"""Slurm's own accounting of GPUs for a period: `sacct`'s GPU TRES-hours per run of a job.

One `sacct -a -X -D --truncate -S START -E END` call (allocations only, every run of a
requeued job, times cut to the period) gives each run's user, account, partition, start,
end and `AllocTRES`; the run's GPU-seconds are `gres/gpu=N` x (end - start), as Slurm
counts TRES usage. A run still going at the end of the period (End Unknown) counts up to
the period's end. The command and a sha256 of what it printed are kept, so a bill says
exactly what it was compared with.

`read_nodes` gives `scontrol show node -o` as printed (the capacity report's installed
GPUs). This module only reads (the `sacct` client of this machine, for the cluster of its
SLURM_CONF); a missing or failing sacct is a `SacctError` naming the cause.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpu_audit import slurmcmd
from gpu_audit.errors import GpuAuditError

FIELDS = ("JobIDRaw", "User", "Account", "Partition", "AllocTRES", "Start", "End", "State",
          "NodeList")
# states of a run that never started (its missing start is no gap in Slurm's accounting)
_NEVER_RAN = frozenset({"PENDING", "CANCELLED"})
_GPU_TRES = re.compile(r"(?:^|,)gres/gpu=(\d+)(?:,|$)")


class SacctError(GpuAuditError, RuntimeError):
    """sacct could not be read (not installed, no slurmdbd, refused)."""


@dataclass(frozen=True, slots=True)
class SacctRun:
    job_id: str
    user: str
    account: str
    partition: str
    gpus: int
    start: float  # Unix seconds, within the period
    end: float
    state: str
    nodes: str

    @property
    def gpu_seconds(self) -> float:
        return self.gpus * max(self.end - self.start, 0.0)


@dataclass
class SacctData:
    runs: list[SacctRun] = field(default_factory=list)
    command: list[str] = field(default_factory=list)
    output_sha256: str = ""
    skipped: int = 0  # runs without GPUs
    # runs with GPUs whose start Slurm never recorded (Start "None"/"Unknown": seen for a
    # run preempted and requeued before its start reached slurmdbd): (job id, end);
    # sacct counts them 0 GPU-seconds, so the bill names them rather than guess a start
    unstarted: list[tuple[str, float | None]] = field(default_factory=list)


def gpus_of(alloc_tres: str) -> int:
    """`gres/gpu=N` of an AllocTRES string (typed entries such as gres/gpu:a100=N repeat
    the untyped total and are not added again)."""
    found = _GPU_TRES.search(alloc_tres)
    return int(found.group(1)) if found else 0


def read_sacct(start: datetime, end: datetime,
               run: Callable[[str, Sequence[str]], str] | None = None) -> SacctData:
    """Every run with GPUs that overlaps [start, end), times cut to it."""
    lo, hi = start.timestamp(), end.timestamp()
    # sacct's -E is inclusive to the second; the period's end is exclusive
    args = ["-a", "-X", "-D", "-n", "-P", "--truncate", "-S", slurmcmd.slurm_time(lo),
            "-E", slurmcmd.slurm_time(hi - 1), "-o", ",".join(FIELDS)]
    call = run if run is not None else slurmcmd.run
    try:
        text = call("sacct", args)
        rows = slurmcmd.parsable(text, FIELDS)
    except slurmcmd.SlurmCommandError as exc:
        raise SacctError(str(exc)) from None
    data = SacctData(command=["sacct", *args],
                     output_sha256=hashlib.sha256(text.encode()).hexdigest())
    for r in rows:
        gpus = gpus_of(r["AllocTRES"])
        if gpus == 0:
            data.skipped += 1
            continue
        begin = slurmcmd.parse_time(r["Start"])
        finish = slurmcmd.parse_time(r["End"])
        if begin is None:
            if _ran(r["State"]):
                data.unstarted.append((r["JobIDRaw"], finish))
            continue
        finish = hi if finish is None else finish
        begin, finish = max(begin, lo), min(finish, hi)
        if finish <= begin:
            continue
        data.runs.append(SacctRun(r["JobIDRaw"], r["User"], r["Account"], r["Partition"],
                                  gpus, begin, finish, r["State"].split(" ")[0], r["NodeList"]))
    return data


def read_nodes(run: Callable[[str, Sequence[str]], str] | None = None) -> str:
    """`scontrol show node -o` as printed (one line per node: Gres, State, ...)."""
    try:
        return (run or slurmcmd.run)("scontrol", ["show", "node", "-o"])
    except slurmcmd.SlurmCommandError as exc:
        raise SacctError(f"scontrol show node: {exc}") from None


def _ran(state: str) -> bool:
    return state.split(" ", maxsplit=1)[0] not in _NEVER_RAN


def read_unstarted(job_ids: Sequence[str],
                   run: Callable[[str, Sequence[str]], str] | None = None,
                   ) -> tuple[list[tuple[str, float | None]], list[str]]:
    """The runs with GPUs of these jobs that sacct holds without a start time (job id,
    end), and the command: a time-windowed sacct never lists them (no start, no overlap
    with the period), so they are asked for by job id, at any time."""
    ids = sorted({j for j in job_ids if j.isdigit()}, key=int)
    if not ids:
        return [], []
    args = ["-a", "-X", "-D", "-n", "-P", "-j", ",".join(ids), "-o", ",".join(FIELDS)]
    call = run if run is not None else slurmcmd.run
    try:
        rows = slurmcmd.parsable(call("sacct", args), FIELDS)
    except slurmcmd.SlurmCommandError as exc:
        raise SacctError(str(exc)) from None
    found = [(r["JobIDRaw"], slurmcmd.parse_time(r["End"])) for r in rows
             if gpus_of(r["AllocTRES"]) and slurmcmd.parse_time(r["Start"]) is None
             and _ran(r["State"])]
    return found, ["sacct", *args]
