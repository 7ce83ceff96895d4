"""Replay traces: a lab's job arrivals as JSON Lines (docs/REPLAY.md).

The first line may be a header (`{"trace": NAME, "gpus": 8, ...}`) describing the node the
trace was made for; every other line is one job. `load_trace` validates everything and
raises ConfigError naming every bad line and field, never just the first.

A trace describes what the jobs would do on a GPU (their true run time, utilisation,
checkpoints, failures, leaks), never how a scheduler should treat them: the same trace is
replayed under every policy.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpu_audit.atomicfile import replace_file
from gpu_audit.errors import ConfigError
from gpu_audit.yamlload import dotted, read_text, validation_problems

TRACE_VERSION = 1
GIB = 2**30
URGENCIES = ("low", "normal", "high", "urgent")


class TraceHeader(BaseModel):
    """The node and window a trace was generated for (replay defaults to them)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    trace: str
    version: int = TRACE_VERSION
    gpus: int = Field(default=8, ge=1, le=64)
    gpu_memory_bytes: int = Field(default=80 * GIB, gt=0)
    window_seconds: float = Field(default=7 * 86400.0, gt=0)
    seed: int | None = None
    generator: str | None = None

    @field_validator("version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v != TRACE_VERSION:
            raise ValueError(f"this gpu-audit reads trace version {TRACE_VERSION}, not {v}")
        return v


class TraceJob(BaseModel):
    """One job of a trace. Times are seconds; `arrival` counts from the trace's start.

    `runtime` is the GPU work the job needs when it has its GPUs (wall seconds on an
    undisturbed run); `util` the share of each GPU's compute it keeps busy while running.
    `checkpoint_interval` seconds of work between periodic checkpoints (None: the job
    never checkpoints, so a kill or a failure loses everything it did). `fails_at` is the
    fraction of its run at which an attempt crashes (exit 1, or OOM when `oom`), for the
    first `fail_attempts` attempts. `leaks`: after its last exit a process stays holding
    the job's GPU memory until the launcher reaps its process group. `interactive`: a
    notebook that holds its GPU for `runtime` seconds at near-zero utilisation.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    arrival: float = Field(ge=0)
    user: str = Field(min_length=1)
    project: str = Field(default="default", min_length=1)
    urgency: str = "normal"
    gpus: int = Field(default=1, ge=1, le=64)
    gpu_fraction: float | None = Field(default=None, gt=0.0, lt=1.0)
    memory_bytes: int = Field(gt=0)
    runtime: float = Field(gt=0)
    util: float = Field(default=0.9, ge=0.0, le=1.0)
    step_seconds: float = Field(default=1.0, gt=0)
    checkpoint_interval: float | None = Field(default=None, gt=0)
    checkpoint_seconds: float = Field(default=10.0, ge=0)
    fails_at: float | None = Field(default=None, gt=0.0, lt=1.0)
    fail_attempts: int = Field(default=1, ge=1)
    oom: bool = False
    leaks: bool = False
    interactive: bool = False
    max_retries: int = Field(default=2, ge=0, le=100)

    @field_validator("urgency")
    @classmethod
    def _urgency(cls, v: str) -> str:
        if v not in URGENCIES:
            raise ValueError(f"urgency must be one of {', '.join(URGENCIES)}, not {v!r}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> TraceJob:
        if self.gpu_fraction is not None and self.gpus != 1:
            raise ValueError("gpu_fraction is a share of ONE GPU: leave gpus at 1")
        if self.interactive and self.checkpoint_interval is not None:
            raise ValueError("an interactive job does not checkpoint: drop checkpoint_interval")
        if self.oom and self.fails_at is None:
            raise ValueError("oom describes a failure: set fails_at too")
        return self

    @property
    def gpu_share(self) -> float:
        return self.gpu_fraction if self.gpu_fraction is not None else float(self.gpus)


class Trace(BaseModel):
    model_config = ConfigDict(frozen=True)

    header: TraceHeader
    jobs: tuple[TraceJob, ...]

    def demand_gpu_seconds(self) -> float:
        return sum(j.gpu_share * j.runtime for j in self.jobs)


def _problems_for(lineno: int, exc: ValidationError, data: Any) -> list[str]:
    return [f"line {lineno}: {dotted(loc)}: {msg}" for loc, msg in validation_problems(exc, data)]


def parse_trace(text: str, source: str = "<trace>",
                header: TraceHeader | None = None) -> Trace:
    """Validate a trace's text; ConfigError lists every problem with its line."""
    problems: list[str] = []
    jobs: list[TraceJob] = []
    names: dict[str, int] = {}
    seen_job = False
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            data = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            problems.append(f"line {lineno}: not JSON: {exc}")
            continue
        if not isinstance(data, dict):
            problems.append(f"line {lineno}: each line is a JSON object, "
                            f"not {type(data).__name__}")
            continue
        if "trace" in data:
            if seen_job or header is not None:
                problems.append(f"line {lineno}: the header (the line with `trace`) must be "
                                "the first line, and only one")
                continue
            try:
                header = TraceHeader.model_validate(data)
            except ValidationError as exc:
                problems.extend(_problems_for(lineno, exc, data))
            continue
        seen_job = True
        try:
            job = TraceJob.model_validate(data)
        except ValidationError as exc:
            problems.extend(_problems_for(lineno, exc, data))
            continue
        if job.name in names:
            problems.append(f"line {lineno}: name: job name {job.name!r} is used twice "
                            f"(first on line {names[job.name]})")
            continue
        names[job.name] = lineno
        jobs.append(job)
    if header is None and not problems:
        header = TraceHeader(trace=Path(source).stem)
    if not jobs and not problems:
        problems.append("the trace has no jobs")
    if header is not None:
        for job in jobs:
            if job.gpus > header.gpus:
                problems.append(f"line {names[job.name]}: gpus: job {job.name!r} asks for "
                                f"{job.gpus} GPUs, the node has {header.gpus}")
            if job.memory_bytes > header.gpu_memory_bytes:
                problems.append(f"line {names[job.name]}: memory_bytes: job {job.name!r} "
                                "needs more memory than one GPU has")
    if problems:
        raise ConfigError(source, problems)
    assert header is not None
    return Trace(header=header, jobs=tuple(sorted(jobs, key=lambda j: (j.arrival, j.name))))


def load_trace(path: Path) -> Trace:
    return parse_trace(read_text(path), str(path))


def dump_trace(header: TraceHeader, jobs: Iterable[TraceJob]) -> bytes:
    """JSON Lines, header first; defaults left out so a line says what is special."""
    lines: Sequence[dict[str, Any]] = [
        header.model_dump(exclude_none=True),
        *(j.model_dump(exclude_defaults=True) | {"name": j.name, "arrival": j.arrival,
                                                  "user": j.user}
          for j in jobs),
    ]
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def write_trace(path: Path, header: TraceHeader, jobs: Iterable[TraceJob]) -> None:
    replace_file(path, dump_trace(header, jobs))
