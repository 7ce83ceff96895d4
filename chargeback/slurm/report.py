"""The per-job GPU report (what `seff` and Princeton's `jobstats` give a Slurm user, for
the GPUs): one `RunReport` per run of a job on a node, its text form with notes that say
what to change, and the compact form stored in Slurm's AdminComment so it outlives the
node's files and Prometheus' retention.

A run's report is made at its end by `gpu-audit slurm epilog` (the allocation from the
prolog's job-mapping file and slurmctld, the usage from the exporter's records), kept as
a `job_finished` record in the audit trail (stream `slurm`), a JSON file on the node,
and AdminComment; `gpu-audit slurm jobreport JOBID` prints it.

Pure: no I/O. It never reports a number it did not measure: a run whose GPUs no
process used says so rather than showing 0 % busy as if it had been measured.
"""

from __future__ import annotations

import base64
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from chargeback.slurm.usage import JobUsage
from chargeback.software import describe

ADMIN_COMMENT_PREFIX = "gpu-audit:2:"
_GIB = 1024**3


@dataclass(slots=True)
class RunReport:
    """One run (attempt) of a Slurm job on one node."""

    job_id: str
    node: str
    attempt: int = 0
    user: str = ""
    account: str = ""
    partition: str = ""
    gpus: tuple[str, ...] = ()
    start_time: float = 0.0  # allocation, Unix seconds
    end_time: float = 0.0
    time_source: str = "node"  # "slurm" | "node" (gpu_audit/audit/jobevents.py)
    exit_code: int | None = None
    usage: dict[str, float | int] = field(default_factory=dict)  # JobUsage.as_record()
    simulated: bool = False
    # how far the run got, from the job's own events file (gpu_audit_ckpt's newest
    # `metrics` event, sanitised by the epilog): step, total_steps, fraction, loss,
    # steps_per_second, epoch, reported_at, remaining_seconds (at the run's end)
    progress: dict[str, Any] = field(default_factory=dict)
    # what it ran: `environment` as the job reported it (python, torch, cuda, ...), and
    # `software` as the exporter read it from its GPU processes (chargeback.software)
    environment: dict[str, Any] = field(default_factory=dict)
    software: list[dict[str, Any]] = field(default_factory=list)

    @property
    def elapsed_seconds(self) -> float:
        return max(self.end_time - self.start_time, 0.0)

    @property
    def allocated_gpu_seconds(self) -> float:
        return self.elapsed_seconds * len(self.gpus)

    def job_fields(self) -> dict[str, Any]:
        """The `job` object of this run's `job_finished` record."""
        out: dict[str, Any] = {
            "id": self.job_id, "attempt": self.attempt, "user": self.user,
            "project": self.account, "account": self.account, "partition": self.partition,
            "gpus": list(self.gpus), "start_time": self.start_time, "end_time": self.end_time,
            "time_source": self.time_source,
            "allocated_gpu_seconds": self.allocated_gpu_seconds, "usage": dict(self.usage)}
        if self.exit_code is not None:
            out["exit_code"] = self.exit_code
        for key in ("progress", "environment", "software"):  # unknown is absent
            if getattr(self, key):
                out[key] = getattr(self, key)
        return out

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> RunReport | None:
        """The report a `job_finished` record of stream `slurm` holds; None otherwise."""
        job = rec.get("job")
        if rec.get("event") != "job_finished" or not isinstance(job, Mapping):
            return None
        try:
            return cls(
                job_id=str(job["id"]), node=str(rec.get("host", "")),
                attempt=int(job.get("attempt", 0)), user=str(job.get("user", "")),
                account=str(job.get("account", job.get("project", ""))),
                partition=str(job.get("partition", "")),
                gpus=tuple(str(g) for g in job.get("gpus", ())),
                start_time=float(job["start_time"]), end_time=float(job["end_time"]),
                time_source=str(job.get("time_source", "node")),
                exit_code=job.get("exit_code") if isinstance(job.get("exit_code"), int) else None,
                usage={k: v for k, v in dict(job.get("usage", {})).items()
                       if isinstance(v, int | float) and not isinstance(v, bool)},
                simulated=bool(rec.get("simulated", False)),
                progress=dict(job.get("progress") or {}),
                environment=dict(job.get("environment") or {}),
                software=[dict(x) for x in job.get("software") or () if isinstance(x, Mapping)])
        except (KeyError, TypeError, ValueError):
            return None

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["gpus"] = list(self.gpus)
        doc["allocated_gpu_seconds"] = self.allocated_gpu_seconds
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> RunReport:
        known = {f: doc[f] for f in cls.__dataclass_fields__ if f in doc}
        known["gpus"] = tuple(known.get("gpus", ()))
        known["software"] = list(known.get("software") or ())
        return cls(**known)


def with_usage(report: RunReport, usage: JobUsage | None) -> RunReport:
    """The report with the exporter's measurement of its run (None: nothing measured)."""
    if usage is not None:
        report.usage = usage.as_record()
        report.simulated = report.simulated or usage.simulated
    return report


def _f(report: RunReport, key: str) -> float:
    v = report.usage.get(key, 0)
    return float(v) if isinstance(v, int | float) and math.isfinite(v) else 0.0


def notes(report: RunReport) -> list[str]:
    """What the user should change, as jobstats' custom notes do."""
    out = []
    held = _f(report, "gpu_seconds")
    alloc = report.allocated_gpu_seconds
    n = len(report.gpus)
    if n and held == 0:
        out.append(f"No process used the {n} GPU(s) this job held for "
                   f"{_duration(report.elapsed_seconds)}: if it does not need a GPU, "
                   "submit it without --gres=gpu (it kept others waiting).")
        return out
    if alloc > 0 and held < 0.5 * alloc:
        out.append(f"Its processes held the GPUs only {held / alloc:.0%} of the allocated "
                   "time: ask for fewer GPUs, or start the GPU work sooner.")
    if held > 0:
        busy = _f(report, "busy_gpu_seconds") / held
        idle = _f(report, "idle_held_gpu_seconds") / held
        if idle >= 0.5:
            out.append(f"The GPUs sat idle (< 5 % busy) {idle:.0%} of the time they were "
                       "held: GPUs held idle are GPUs nobody else can use.")
        elif busy < 0.15:
            out.append(f"The GPUs were busy only {busy:.0%} of the time: larger batches, "
                       "faster data loading or fewer GPUs would serve the job better.")
    peak, total = _f(report, "peak_memory_bytes"), _f(report, "memory_total_bytes")
    if total > 0 and 0 < peak < 0.1 * total:
        out.append(f"It used at most {peak / _GIB:.1f} of {total / _GIB:.0f} GiB of GPU "
                   "memory: a smaller GPU or a MIG slice would do.")
    return out


def _duration(seconds: float) -> str:
    s = round(seconds)
    return f"{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"


def render_text(reports: Sequence[RunReport]) -> str:
    """seff-style lines for every run of a job (on every node it ran on)."""
    lines: list[str] = []
    for r in sorted(reports, key=lambda x: (x.attempt, x.node)):
        held = _f(r, "gpu_seconds")
        alloc = r.allocated_gpu_seconds
        lines.append(f"Job ID: {r.job_id}   run {r.attempt} on {r.node}")
        lines.append(f"User/Account/Partition: {r.user or '?'}/{r.account or '?'}/"
                     f"{r.partition or '?'}")
        state = f"exit code {r.exit_code}" if r.exit_code is not None else "exit code unknown"
        lines.append(f"Elapsed: {_duration(r.elapsed_seconds)}   {state}   "
                     f"(times from {'slurmctld' if r.time_source == 'slurm' else 'the node'})")
        lines.append(f"GPUs: {len(r.gpus)} ({', '.join(r.gpus) or 'none'})")
        lines.append(f"GPU-hours allocated: {alloc / 3600:.4f}")
        if held > 0:
            lines.append(f"GPU-hours used: {held / 3600:.4f} "
                         f"({held / alloc:.0%} of allocated)" if alloc else
                         f"GPU-hours used: {held / 3600:.4f}")
            lines.append(f"GPU busy (SM utilisation): "
                         f"{_f(r, 'busy_gpu_seconds') / held:.1%} of the time held")
            lines.append(f"GPU held idle (< 5 % busy): "
                         f"{_f(r, 'idle_held_gpu_seconds') / 3600:.4f} GPU-hours "
                         f"({_f(r, 'idle_held_gpu_seconds') / held:.0%})")
            peak, total = _f(r, "peak_memory_bytes"), _f(r, "memory_total_bytes")
            of = f" of {total / _GIB:.1f} GiB ({peak / total:.1%})" if total else ""
            lines.append(f"Peak GPU memory: {peak / _GIB:.2f} GiB{of}")
            energy = _f(r, "energy_joules")
            lines.append(f"GPU energy: {energy / 1000:.1f} kJ ({energy / 3.6e6:.4f} kWh)")
        else:
            lines.append("GPU usage: no process of the job was seen on its GPUs")
        lines += _progress_lines(r)
        for note in notes(r):
            lines.append(f"  * {note}")
        if r.simulated:
            lines.append("SIMULATED: the GPU usage above comes from the simulator "
                         "(exporter backend 'sim'), not from a GPU")
        lines.append("")
    return "\n".join(lines)


def _progress_lines(r: RunReport) -> list[str]:
    """How far the run got and what it ran, where known (nothing is shown as 0)."""
    lines = []
    p = r.progress
    if p.get("step") is not None:
        total, frac = p.get("total_steps"), p.get("fraction")
        where = (f"step {p['step']} of {total} ({frac:.1%})"
                 if total is not None and isinstance(frac, int | float) else f"step {p['step']}")
        extra = [f"epoch {p['epoch']}"] if p.get("epoch") is not None else []
        if isinstance(p.get("loss"), int | float):
            extra.append(f"loss {p['loss']:.4g}")
        if isinstance(p.get("steps_per_second"), int | float):
            extra.append(f"{p['steps_per_second']:.3g} steps/s")
        lines.append(f"Progress: {where}" + (f", {', '.join(extra)}" if extra else ""))
        left = p.get("remaining_seconds")
        if isinstance(left, int | float) and left > 0:
            lines.append(f"Remaining at the end of this run: about {_duration(left)} "
                         "at its last throughput")
    env = r.environment
    if env:
        order = ("python", "torch", "cuda", "cudnn", "nccl", "lightning", "transformers")
        shown = [f"{k} {env[k]}" for k in order if env.get(k) is not None]
        if shown:
            lines.append(f"Ran (as the job reported): {', '.join(shown)}")
    for sw in r.software:
        lines.append(f"GPU processes ran (as the exporter saw): {describe(sw)}")
    return lines


def admin_comment(reports: Sequence[RunReport]) -> str:
    """The reports in a form Slurm keeps as AdminComment: sacctmgr (22.05) lower-cases
    the value and turns quotes into backticks, so the JSON is compressed and written in
    base32 (one case, no quotes) behind a versioned prefix."""
    data = orjson.dumps([r.to_json() for r in reports], option=orjson.OPT_SORT_KEYS)
    text = base64.b32encode(zlib.compress(data, 9)).decode().rstrip("=").lower()
    return ADMIN_COMMENT_PREFIX + text


def parse_admin_comment(text: str) -> list[RunReport] | None:
    """The reports of an AdminComment written by `admin_comment`; None when it holds
    none (another tool's comment, or damage)."""
    text = text.strip()
    if not text.startswith(ADMIN_COMMENT_PREFIX):
        return None
    body = text[len(ADMIN_COMMENT_PREFIX):]
    try:
        raw = base64.b32decode(body + "=" * (-len(body) % 8), casefold=True)
        docs = orjson.loads(zlib.decompress(raw))
        return [RunReport.from_json(d) for d in docs]
    except (ValueError, TypeError, zlib.error, orjson.JSONDecodeError):
        return None
