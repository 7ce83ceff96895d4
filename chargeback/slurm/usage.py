"""What each Slurm job did on its GPUs, added up from the exporter's audit records.

Feed `UsageMeter.add()` the records of one or more exporter streams in trail order (a
cycle's `gpu` record comes before its `process` records); `result()` gives, per Slurm
job id (the process's `attribution.slurm_job_id`), the GPU time its processes held a GPU
(an interval counts once per GPU however many of its processes were on it), the busy
(SM-utilisation weighted) GPU time, the time held while the GPU was under 5 % busy, its
share of the energy, the most GPU memory it had on one GPU at once and how many distinct
processes it ran. A record accounts for `(time - elapsed, time]`, so it counts for a
window `(start, end]` when its time is inside it (as chargeback's archive source).

Both cadences of the trail are read (docs/AUDIT.md). A schema-3 `usage` record adds up a
holder's minute on one GPU; its `tasks` name each process's Slurm job (`sj`). The
holder's sums (GPU time held, busy, idle-held, energy) go to the jobs of its tasks in
proportion to the time each job's processes were seen, which is exact in the usual case
of one job per holder, GPU and interval (a GPU is a Slurm job's alone), and a job's peak
memory on a GPU is the sum of its processes' peaks in the interval (an upper bound when
they peaked at different moments). `key` sees such a task as a process record whose
`attribution` holds `slurm_job_id`, `user` and `project` (`schema3: True` marks it).

Pure: no I/O. Memory is bounded by the jobs and GPUs seen, not by the records.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_audit.rules import IDLE_UTILIZATION

# Below this GPU utilisation a held GPU is idle (chargeback's idle-held GPU-hours).


@dataclass(slots=True)
class JobUsage:
    gpu_seconds: float = 0.0
    busy_gpu_seconds: float = 0.0
    idle_held_gpu_seconds: float = 0.0
    energy_joules: float = 0.0
    peak_memory_bytes: int = 0
    memory_total_bytes: int = 0  # of the GPU where the peak was
    samples: int = 0  # GPU-cycles held
    simulated: bool = False
    gpus: set[str] = field(default_factory=set)
    hosts: set[str] = field(default_factory=set)
    pids: set[tuple[str, int, int]] = field(default_factory=set)

    @property
    def processes(self) -> int:
        return len(self.pids)

    def as_record(self) -> dict[str, float | int]:
        """The `usage` object of a `job_finished` record (gpu_audit/audit/jobevents.py)."""
        return {"gpu_seconds": self.gpu_seconds, "busy_gpu_seconds": self.busy_gpu_seconds,
                "idle_held_gpu_seconds": self.idle_held_gpu_seconds,
                "energy_joules": self.energy_joules,
                "peak_memory_bytes": self.peak_memory_bytes,
                "memory_total_bytes": self.memory_total_bytes,
                "processes": self.processes, "samples": self.samples}


def slurm_job_of(rec: Mapping[str, Any]) -> str | None:
    attribution = rec.get("attribution")
    if not isinstance(attribution, Mapping):
        return None
    job = attribution.get("slurm_job_id")
    return job if isinstance(job, str) else None


def _num(v: Any) -> float | None:
    return float(v) if type(v) in (int, float) else None


class UsageMeter:
    """Per-job usage from exporter records (see the module docstring)."""

    def __init__(self, *, start_ns: int | None = None, end_ns: int | None = None,
                 key: Callable[[Mapping[str, Any]], str | None] = slurm_job_of,
                 include_simulated: bool = True) -> None:
        self._start, self._end = start_ns, end_ns
        self._key = key
        self._include_simulated = include_simulated
        self.jobs: dict[str, JobUsage] = {}
        # (host, uuid) -> (time_ns, utilisation, memory total) of the latest gpu record
        self._gpu: dict[tuple[str, str], tuple[int, float | None, int]] = {}
        # (host, uuid, job) -> (time_ns, memory of the job's processes in that cycle)
        self._cycle: dict[tuple[str, str, str], tuple[int, int]] = {}
        self.simulated_left_out = 0
        self._mem_total: dict[tuple[str, str], int] = {}  # (host, uuid) -> schema-3 `gmt`

    def add(self, rec: Mapping[str, Any]) -> None:
        kind = rec.get("kind")
        if kind == "usage":
            self._add_interval(rec)
            return
        if kind not in ("gpu", "process"):
            return
        t = rec.get("time_ns")
        gpu = rec.get("gpu")
        host = rec.get("host")
        if not isinstance(t, int) or not isinstance(gpu, Mapping) or not isinstance(host, str):
            return
        uuid = gpu.get("uuid")
        if not isinstance(uuid, str):
            return
        values = rec.get("values") if isinstance(rec.get("values"), Mapping) else {}
        assert isinstance(values, Mapping)
        if kind == "gpu":
            total = _num(values.get("memory_total_bytes"))
            self._gpu[(host, uuid)] = (t, _num(values.get("utilization_ratio")),
                                       int(total) if total is not None else 0)
            return
        job = self._key(rec)
        if job is None:
            return
        if (self._start is not None and t <= self._start) or (
                self._end is not None and t > self._end):
            return
        usage = self._usage_of(job, rec.get("simulated") is True, host, uuid)
        if usage is None:
            return
        proc = rec.get("process") if isinstance(rec.get("process"), Mapping) else {}
        assert isinstance(proc, Mapping)
        pid, ticks = proc.get("pid"), proc.get("start_time_ticks", 0)
        if isinstance(pid, int):
            usage.pids.add((host, pid, ticks if isinstance(ticks, int) else 0))
        usage.busy_gpu_seconds += _num(rec.get("busy_gpu_seconds")) or 0.0
        usage.energy_joules += _num(rec.get("energy_joules")) or 0.0
        memory = int(_num(values.get("memory_used_bytes")) or 0)
        key = (host, uuid, job)
        cycle = self._cycle.get(key)
        if cycle is not None and cycle[0] == t:
            memory += cycle[1]  # another process of the job on this GPU, this cycle
        else:
            # the first of the job's processes on this GPU this cycle: the interval once
            elapsed = _num(rec.get("elapsed_seconds")) or 0.0
            usage.gpu_seconds += elapsed
            usage.samples += 1
            ctx = self._gpu.get((host, uuid))
            util = ctx[1] if ctx is not None and ctx[0] == t else None
            if util is not None and util < IDLE_UTILIZATION:
                usage.idle_held_gpu_seconds += elapsed
        self._cycle[key] = (t, memory)
        if memory > usage.peak_memory_bytes:
            usage.peak_memory_bytes = memory
            ctx = self._gpu.get((host, uuid))
            usage.memory_total_bytes = ctx[2] if ctx is not None else 0

    def result(self) -> dict[str, JobUsage]:
        return self.jobs

    def _usage_of(self, job: str, simulated: bool, host: str, uuid: str) -> JobUsage | None:
        """The job's usage, now also on this host and GPU; None for a simulated record
        left out (counted)."""
        if simulated and not self._include_simulated:
            self.simulated_left_out += 1
            return None
        usage = self.jobs.get(job)
        if usage is None:
            usage = self.jobs[job] = JobUsage()
        usage.simulated |= simulated
        usage.gpus.add(uuid)
        usage.hosts.add(host)
        return usage

    def _add_interval(self, rec: Mapping[str, Any]) -> None:
        """A schema-3 usage record: the holder's sums shared among its tasks' jobs."""
        t, host, uuid = rec.get("time_ns"), rec.get("host"), rec.get("uuid")
        tasks = rec.get("tasks")
        if not (isinstance(t, int) and isinstance(host, str) and isinstance(uuid, str)):
            return
        total = _num(rec.get("gmt"))  # on the GPU's first record of the interval
        if total is not None:
            self._mem_total[(host, uuid)] = int(total)
        if not isinstance(tasks, list):
            return
        if (self._start is not None and t <= self._start) or (
                self._end is not None and t > self._end):
            return
        # per Slurm job (None: processes of no job): the longest any of its processes was
        # seen (the job's time on the GPU), the sum of their peaks, their identities
        seen: dict[str | None, list[float]] = {}
        peaks: dict[str | None, int] = {}
        pids: dict[str | None, set[tuple[str, int, int]]] = {}
        for task in tasks:
            if not isinstance(task, Mapping):
                continue
            sj = task.get("sj") if isinstance(task.get("sj"), str) and task.get("sj") else None
            secs = _num(task.get("s")) or 0.0
            held = seen.setdefault(sj, [0.0])
            held[0] = max(held[0], secs)
            peaks[sj] = peaks.get(sj, 0) + int(_num(task.get("mx")) or 0)
            pid, ticks = task.get("pid"), task.get("st", 0)
            if isinstance(pid, int):
                pids.setdefault(sj, set()).add((host, pid, ticks if isinstance(ticks, int) else 0))
        total = math.fsum(v[0] for v in seen.values())
        if total <= 0:
            return
        user, project = rec.get("user"), rec.get("project")
        dt, n = _num(rec.get("dt")) or 0.0, _num(rec.get("n")) or 0.0
        for sj, held in seen.items():
            if sj is None:
                continue
            who = {"slurm_job_id": sj, "user": user if isinstance(user, str) else "",
                   "project": project if isinstance(project, str) else ""}
            view = {"kind": "process", "schema3": True, "host": host, "time_ns": t,
                    "attribution": who}
            job = self._key(view)
            if job is None:
                continue
            usage = self._usage_of(job, rec.get("sim") is True, host, uuid)
            if usage is None:
                continue
            share = held[0] / total
            usage.pids |= pids.get(sj, set())
            usage.gpu_seconds += (_num(rec.get("s")) or 0.0) * share
            usage.busy_gpu_seconds += (_num(rec.get("b")) or 0.0) * share
            usage.idle_held_gpu_seconds += (_num(rec.get("i")) or 0.0) * share
            usage.energy_joules += (_num(rec.get("e")) or 0.0) / 1000.0 * share
            if dt > 0:
                usage.samples += max(1, round(n * held[0] / dt))
            peak = peaks.get(sj, 0)
            if peak > usage.peak_memory_bytes:
                usage.peak_memory_bytes = peak
                usage.memory_total_bytes = self._mem_total.get((host, uuid), 0)
