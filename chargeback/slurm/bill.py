"""The bill of a Slurm cluster, by account, partition and user, and its reconciliation
with Slurm's own accounting (`gpu-audit chargeback bill --group-by slurm [--compare-with
slurm]`, docs/SLURM.md).

From the audit trail, in one pass over the records of the period:

- allocated GPU-hours: every `job_finished` record of stream `slurm` (one per run of a
  job on a node, written by the epilog) gives the run's GPUs and its allocation
  interval; the interval cut to the period times the GPUs is what the run is billed;
- used, busy and idle-held GPU-hours and energy: the exporter's process records of Slurm
  jobs (attribution `slurm_job_id`), grouped by their `slurm_account`,
  `slurm_partition` and user (chargeback/slurm/usage.py);
- the GPU model of each run's GPUs (for its price) from the exporter's `gpu` records.

Compared with sacct (chargeback/sources/slurm.py), each row gets Slurm's GPU TRES-hours
for the same runs and the difference; runs Slurm accounted that the trail has no record
of, and records Slurm has no run for, are listed by job id.

Pure: records and sacct's runs in, a `SlurmBill` out; `write_slurm_bill` writes it.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson

from chargeback.rates import Rates
from chargeback.slurm.report import RunReport
from chargeback.slurm.usage import UsageMeter
from chargeback.sources.slurm import SacctData
from chargeback.values import (
    JOULES_PER_KWH,
    SECONDS_PER_HOUR,
    fmt_number,
    rfc3339,
    rounded,
    sha256_bytes,
    software_version,
)
from gpu_audit.atomicfile import replace_file

CSV_NAME = "slurm-chargeback.csv"
JSON_NAME = "slurm-chargeback.json"
JSON_FORMAT = "gpu-audit-slurm-chargeback/1"
UNKNOWN = "unknown"
_SEP = "\x1f"
# a run of ours and one of sacct are the same when their starts are this close (the
# node's clock, when slurmctld's stamps were not at hand, is at most a second off)
START_MATCH_S = 2.0

COLUMNS = ("period_start", "period_end", "account", "partition", "user", "runs",
           "allocated_gpu_hours", "used_gpu_hours", "busy_gpu_hours", "idle_held_gpu_hours",
           "energy_kwh", "gpu_cost", "energy_cost", "total_cost", "currency", "sacct_runs",
           "sacct_gpu_hours", "difference_gpu_hours", "difference_percent")


@dataclass(slots=True)
class SlurmRow:
    account: str
    partition: str
    user: str
    runs: int = 0
    allocated_gpu_seconds: float = 0.0
    used_gpu_seconds: float = 0.0
    busy_gpu_seconds: float = 0.0
    idle_held_gpu_seconds: float = 0.0
    energy_joules: float = 0.0
    gpu_cost: float = 0.0
    energy_cost: float = 0.0
    sacct_runs: int = 0
    sacct_gpu_seconds: float = 0.0

    @property
    def difference_gpu_seconds(self) -> float:
        return self.allocated_gpu_seconds - self.sacct_gpu_seconds

    @property
    def difference_ratio(self) -> float | None:
        """(ours - Slurm's) / Slurm's; None when Slurm accounted nothing."""
        if self.sacct_gpu_seconds <= 0:
            return None
        return self.difference_gpu_seconds / self.sacct_gpu_seconds

    def add(self, other: SlurmRow) -> None:
        for f in ("runs", "allocated_gpu_seconds", "used_gpu_seconds", "busy_gpu_seconds",
                  "idle_held_gpu_seconds", "energy_joules", "gpu_cost", "energy_cost",
                  "sacct_runs", "sacct_gpu_seconds"):
            setattr(self, f, getattr(self, f) + getattr(other, f))


@dataclass
class SlurmBill:
    start: datetime
    end: datetime
    currency: str
    rows: list[SlurmRow]
    total: SlurmRow
    compared: bool
    missing_from_trail: list[str] = field(default_factory=list)
    not_in_sacct: list[str] = field(default_factory=list)
    # (job id, start) of each run in not_in_sacct, for explaining it (note_unstarted)
    not_in_sacct_runs: list[tuple[str, float]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    inputs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class _Run:
    job_id: str
    start: float  # cut to the period
    end: float
    gpus: int
    key: tuple[str, str, str]  # account, partition, user
    models: tuple[str, ...]


# Marks a meter key that names a job (a schema-3 task), resolved to its account and
# partition from the job's report once every record was read.
_BY_JOB = "\x01"


def _group_of(rec: Mapping[str, Any]) -> str | None:
    """The (account, partition, user) key of a Slurm job's process record; a job's
    (schema-3 usage records carry the holder, not the account and partition)."""
    a = rec.get("attribution")
    if not isinstance(a, Mapping) or not isinstance(a.get("slurm_job_id"), str):
        return None
    if rec.get("schema3") is True:
        return _BY_JOB + _SEP.join((a["slurm_job_id"], str(a.get("project") or ""),
                                    str(a.get("user") or "")))
    return _SEP.join((str(a.get("slurm_account") or a.get("project") or ""),
                      str(a.get("slurm_partition") or ""),
                      str(a.get("slurm_user") or a.get("user") or "")))


def build_slurm_bill(records: Iterable[Mapping[str, Any]], start: datetime, end: datetime,
                     rates: Rates, sacct: SacctData | None, *,
                     include_simulated: bool = False) -> SlurmBill:
    lo, hi = start.timestamp(), end.timestamp()
    meter = UsageMeter(start_ns=int(lo * 1e9), end_ns=int(hi * 1e9), key=_group_of,
                       include_simulated=include_simulated)
    models: dict[str, str] = {}
    reports: list[RunReport] = []
    for rec in records:
        if rec.get("kind") == "gpu":
            gpu = rec.get("gpu")
            if isinstance(gpu, Mapping) and isinstance(gpu.get("name"), str):
                models[str(gpu.get("uuid"))] = str(gpu["name"])
        elif rec.get("kind") == "usage":  # schema 3: the model on every record
            if isinstance(rec.get("model"), str) and isinstance(rec.get("uuid"), str):
                models[rec["uuid"]] = rec["model"]
        elif rec.get("stream") == "slurm":
            report = RunReport.from_record(rec)
            if report is not None:
                reports.append(report)
        meter.add(rec)
    runs = []
    for rep in reports:
        begin, finish = max(rep.start_time, lo), min(rep.end_time, hi)
        if finish > begin and rep.gpus:
            runs.append(_Run(rep.job_id, begin, finish, len(rep.gpus),
                             (rep.account, rep.partition, rep.user),
                             tuple(models.get(g, UNKNOWN) for g in rep.gpus)))
    rows: dict[tuple[str, str, str], SlurmRow] = {}

    def row(key: tuple[str, str, str]) -> SlurmRow:
        if key not in rows:
            rows[key] = SlurmRow(*key)
        return rows[key]

    rates.check_models([m for run in runs for m in run.models], "the rates file")
    for run in runs:
        r = row(run.key)
        r.runs += 1
        seconds = run.end - run.start
        r.allocated_gpu_seconds += seconds * run.gpus
        r.gpu_cost += sum(seconds / SECONDS_PER_HOUR * rates.gpu_hour_price(m)
                          for m in run.models)
    of_job = {rep.job_id: (rep.account, rep.partition, rep.user) for rep in reports}
    for key, usage in meter.result().items():
        if key.startswith(_BY_JOB):
            job, project, user = key[1:].split(_SEP)
            account, partition, user = of_job.get(job, (project, "", user))
        else:
            account, partition, user = key.split(_SEP)
        r = row((account, partition, user))
        r.used_gpu_seconds += usage.gpu_seconds
        r.busy_gpu_seconds += usage.busy_gpu_seconds
        r.idle_held_gpu_seconds += usage.idle_held_gpu_seconds
        r.energy_joules += usage.energy_joules
        r.energy_cost += usage.energy_joules / JOULES_PER_KWH * rates.energy_kwh
    bill = SlurmBill(start, end, rates.currency, [], SlurmRow("", "", ""), sacct is not None)
    if meter.simulated_left_out:
        bill.notes.append(f"{meter.simulated_left_out} simulated process record(s) left "
                          "out (--include-simulated bills them)")
    if sacct is not None:
        for srun in sacct.runs:
            r = row((srun.account, srun.partition, srun.user))
            r.sacct_runs += 1
            r.sacct_gpu_seconds += srun.gpu_seconds
        bill.missing_from_trail, bill.not_in_sacct_runs = _unmatched(runs, sacct)
        bill.not_in_sacct = [f"job {job} (run from {_when(t)})" for job, t in
                             bill.not_in_sacct_runs]
        bill.inputs["sacct"] = {"command": sacct.command, "output_sha256": sacct.output_sha256,
                                "runs": len(sacct.runs), "runs_without_gpus": sacct.skipped}
        note_unstarted(bill, sacct.unstarted)
    bill.rows = [rows[k] for k in sorted(rows)]
    for r in bill.rows:
        bill.total.add(r)
    return bill


def _when(t: float | None) -> str:
    """RFC 3339 of Unix seconds; "unknown" for none."""
    return "unknown" if t is None else rfc3339(datetime.fromtimestamp(t, UTC))


def note_unstarted(bill: SlurmBill, unstarted: list[tuple[str, float | None]],
                   command: list[str] | None = None) -> None:
    """Explain the trail's runs sacct lacks by sacct's runs with no start time.

    Slurm 22.05 clears the start of a run requeued by preemption in slurmdbd a moment
    after the requeue (seen on the real cluster: the REQUEUED row's Start turns "None"),
    so sacct counts that run 0 GPU-seconds and a time-windowed sacct does not list it."""
    if not unstarted:
        return
    jobs = {job for job, _end in unstarted}
    bill.not_in_sacct = [
        f"job {job} (run from {_when(t)}"
        + ("; sacct has a run of it without a start time)" if job in jobs else ")")
        for job, t in bill.not_in_sacct_runs]
    bill.notes.append(
        f"sacct has {len(unstarted)} run(s) with GPUs and no start time (Slurm counts "
        "them 0 GPU-seconds; Slurm clears the start of a run requeued by preemption): "
        + ", ".join(f"job {job} (ended {_when(end)})" for job, end in unstarted))
    sacct_inputs = bill.inputs.setdefault("sacct", {})
    sacct_inputs["runs_without_start"] = len(unstarted)
    if command is not None:
        sacct_inputs["runs_without_start_command"] = command


def _unmatched(runs: list[_Run], sacct: SacctData
               ) -> tuple[list[str], list[tuple[str, float]]]:
    """Runs of one side the other does not have (ours summed over the nodes of a run)."""
    ours: dict[str, list[_Run]] = {}
    for run in runs:
        ours.setdefault(run.job_id, []).append(run)
    theirs = {(s.job_id, s.start) for s in sacct.runs}
    missing = []
    for job_id, start in sorted(theirs):
        if not any(abs(r.start - start) <= START_MATCH_S for r in ours.get(job_id, [])):
            missing.append(f"job {job_id} (run from {rfc3339(datetime.fromtimestamp(start, UTC))})")
    extra = set()
    for run in runs:
        if not any(j == run.job_id and abs(s - run.start) <= START_MATCH_S for j, s in theirs):
            extra.add((run.job_id, run.start))
    return missing, sorted(extra)


def _cells(bill: SlurmBill, r: SlurmRow, label: str | None = None) -> list[str]:
    h = SECONDS_PER_HOUR
    cost = r.gpu_cost + r.energy_cost
    ratio = r.difference_ratio
    compared = [str(r.sacct_runs), fmt_number(r.sacct_gpu_seconds / h),
                fmt_number(r.difference_gpu_seconds / h),
                fmt_number(100 * ratio) if ratio is not None else ""] if bill.compared else [
        "", "", "", ""]
    who = [label, "", ""] if label is not None else [r.account, r.partition, r.user]
    return [rfc3339(bill.start), rfc3339(bill.end), *who, str(r.runs),
            fmt_number(r.allocated_gpu_seconds / h), fmt_number(r.used_gpu_seconds / h),
            fmt_number(r.busy_gpu_seconds / h), fmt_number(r.idle_held_gpu_seconds / h),
            fmt_number(r.energy_joules / JOULES_PER_KWH), fmt_number(r.gpu_cost),
            fmt_number(r.energy_cost), fmt_number(cost), bill.currency, *compared]


def render_csv(bill: SlurmBill) -> bytes:
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\r\n")
    w.writerow(COLUMNS)
    for r in bill.rows:
        w.writerow(_cells(bill, r))
    w.writerow(_cells(bill, bill.total, "total"))
    return out.getvalue().encode()


def render_json(bill: SlurmBill) -> bytes:
    def row(r: SlurmRow) -> dict[str, Any]:
        doc = {k: (rounded(v) if isinstance(v, float) else v) for k, v in asdict(r).items()}
        ratio = r.difference_ratio
        doc["difference_ratio"] = rounded(ratio) if ratio is not None else None
        return doc

    doc = {"format": JSON_FORMAT, "period": {"start": rfc3339(bill.start),
                                             "end": rfc3339(bill.end)},
           "currency": bill.currency, "compared_with_sacct": bill.compared,
           "rows": [row(r) for r in bill.rows], "total": row(bill.total),
           "missing_from_trail": bill.missing_from_trail, "not_in_sacct": bill.not_in_sacct,
           "verification_problems": bill.problems, "notes": bill.notes,
           "inputs": bill.inputs, "software": software_version()}
    return orjson.dumps(doc, option=orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2) + b"\n"


def write_slurm_bill(bill: SlurmBill, out: Path) -> dict[str, str]:
    """The CSV and JSON, each replaced atomically; file name -> sha256."""
    out.mkdir(parents=True, exist_ok=True)
    written = {}
    for name, data in ((CSV_NAME, render_csv(bill)), (JSON_NAME, render_json(bill))):
        replace_file(out / name, data)
        written[name] = sha256_bytes(data)
    return written
