"""Replay traces: a lab's job arrivals as JSON Lines (docs/REPLAY.md).

The first line may be a header (`{"trace": NAME, "gpus": 8, ...}`) describing the node the
trace was made for (version 2 adds the lab's time zone and the date of second 0); lines
with `person` say when a user is at the desk and in which time zone
(launcher/replay/people.py); every other line is one job. `load_trace` validates
everything and raises ConfigError naming every bad line and field, never just the first.

A trace describes what the jobs would do on a GPU (their true run time, utilisation,
checkpoints, failures, leaks), never how a scheduler should treat them: the same trace is
replayed under every policy.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpu_audit.atomicfile import replace_file
from gpu_audit.errors import ConfigError
from gpu_audit.yamlload import dotted, read_text, validation_problems
from launcher.replay.people import Person, Presence, TraceCalendar, parse_timezone, presences

TRACE_VERSION = 2
READS_VERSIONS = (1, 2)  # version 1: no time zone, no people, no `after`
GIB = 2**30
URGENCIES = ("low", "normal", "high", "urgent")  # the default levels (launcher/config.py)
_LEVEL = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")


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
    timezone: str = "UTC"  # the lab's: "the night", and people without their own
    start: dt.date = dt.date(2025, 3, 3)  # second 0 is local midnight of this day (a Monday)

    @field_validator("version")
    @classmethod
    def _version(cls, v: int) -> int:
        if v not in READS_VERSIONS:
            raise ValueError(f"this gpu-audit reads trace versions "
                             f"{', '.join(map(str, READS_VERSIONS))}, not {v}")
        return v

    @field_validator("timezone")
    @classmethod
    def _tz(cls, v: str) -> str:
        parse_timezone(v)
        return v


class TraceJob(BaseModel):
    """One job of a trace. Times are seconds; `arrival` counts from the trace's start.

    `runtime` is the GPU work the job needs when it has its GPUs (wall seconds on an
    undisturbed run); `util` the share of each GPU's compute it keeps busy while running.
    `checkpoint_interval` seconds of work between periodic checkpoints (None: the job
    never checkpoints, so a kill or a failure loses everything it did). `fails_at` is the
    fraction of its run at which an attempt crashes (exit `exit_code`, 1 by default; OOM
    when `oom`), for the first `fail_attempts` attempts. `after`: names of earlier jobs of
    the same user this one follows (a pipeline). `max_retries` null: the launcher's
    default (a retry budget for checkpointing jobs killed by a signal or OOM). `leaks`:
    after its last exit a process stays holding the job's GPU memory until the launcher
    reaps its process group. `interactive`: a notebook that holds its GPU for `runtime`
    seconds at near-zero utilisation.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    # pipeline steps: names of earlier jobs of the same user that must succeed first
    after: tuple[str, ...] = Field(default=(), max_length=64)
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
    exit_code: int = Field(default=1, ge=1, le=255)  # of a crash (137: killed by a signal)
    oom: bool = False
    leaks: bool = False
    interactive: bool = False
    max_retries: int | None = Field(default=2, ge=0, le=100)  # None: the launcher's default
    # when its owner needs it done, in trace seconds (None: no deadline of its own)
    deadline: float | None = Field(default=None, gt=0)

    @field_validator("urgency")
    @classmethod
    def _urgency(cls, v: str) -> str:
        if not _LEVEL.match(v):
            raise ValueError(f"urgency is a level name (e.g. {', '.join(URGENCIES)}), "
                             f"not {v[:40]!r}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> TraceJob:
        if self.gpu_fraction is not None and self.gpus != 1:
            raise ValueError("gpu_fraction is a share of ONE GPU: leave gpus at 1")
        if self.interactive and self.checkpoint_interval is not None:
            raise ValueError("an interactive job does not checkpoint: drop checkpoint_interval")
        if (self.oom or self.exit_code != 1) and self.fails_at is None:
            raise ValueError("oom and exit_code describe a failure: set fails_at too")
        if self.deadline is not None and self.deadline <= self.arrival:
            raise ValueError("deadline must be after arrival")
        if self.exit_code == 75:
            raise ValueError("exit_code 75 means preempted, not a crash")
        return self

    @property
    def gpu_share(self) -> float:
        return self.gpu_fraction if self.gpu_fraction is not None else float(self.gpus)

    def wall_seconds(self, work: float | None = None) -> float:
        """Wall seconds an undisturbed run needs for `work` seconds of work (default: all
        of it), the checkpoint pauses included."""
        work = self.runtime if work is None else work
        if work <= 0:
            return 0.0
        if self.checkpoint_interval is None:
            return work
        return work + (math.ceil(work / self.checkpoint_interval) - 1) * self.checkpoint_seconds


class Trace(BaseModel):
    model_config = ConfigDict(frozen=True)

    header: TraceHeader
    jobs: tuple[TraceJob, ...]
    people: tuple[Person, ...] = ()

    def demand_gpu_seconds(self) -> float:
        return sum(j.gpu_share * j.runtime for j in self.jobs)

    def calendar(self) -> TraceCalendar:
        return TraceCalendar(self.header.start, parse_timezone(self.header.timezone))

    def zone_of(self, user: str) -> dt.tzinfo:
        """The time zone a user lives in (their person line's, else the lab's)."""
        for p in self.people:
            if p.person == user and p.timezone:
                return parse_timezone(p.timezone)
        return parse_timezone(self.header.timezone)

    def presence(self, until: float) -> dict[str, Presence]:
        """Each person's presence windows up to trace second `until` (users without a
        person line are missing: always present)."""
        return presences(self.people, self.calendar(), until)


def _problems_for(lineno: int, exc: ValidationError, data: Any) -> list[str]:
    return [f"line {lineno}: {dotted(loc)}: {msg}" for loc, msg in validation_problems(exc, data)]


def parse_trace(text: str, source: str = "<trace>",
                header: TraceHeader | None = None) -> Trace:
    """Validate a trace's text; ConfigError lists every problem with its line."""
    problems: list[str] = []
    jobs: list[TraceJob] = []
    people: dict[str, Person] = {}
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
        if "person" in data:
            try:
                person = Person.model_validate(data)
            except ValidationError as exc:
                problems.extend(_problems_for(lineno, exc, data))
                continue
            if person.person in people:
                problems.append(f"line {lineno}: person: {person.person!r} has two lines")
                continue
            people[person.person] = person
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
    by_name = {j.name: j for j in jobs}
    for job in jobs:
        for dep in job.after:
            first = by_name.get(dep)
            where = f"line {names[job.name]}: after: job {job.name!r}"
            if first is None:
                problems.append(f"{where} follows {dep!r}, which is not in the trace")
            elif first.user != job.user:
                problems.append(f"{where} follows {dep!r} of another user")
            elif (first.arrival, _depth(first, by_name)) >= (job.arrival,
                                                             _depth(job, by_name)):
                problems.append(f"{where} follows {dep!r}, which arrives later")
    if problems:
        raise ConfigError(source, problems)
    assert header is not None
    ordered = sorted(jobs, key=lambda j: (j.arrival, _depth(j, by_name), j.name))
    return Trace(header=header, jobs=tuple(ordered),
                 people=tuple(people[n] for n in sorted(people)))


def _depth(job: TraceJob, by_name: dict[str, TraceJob], seen: int = 0) -> int:
    """How many `after` steps lead to this job (pipeline steps arriving together are
    submitted in this order); a cycle is cut at the trace's size."""
    deps = [by_name[d] for d in job.after if d in by_name]
    if not deps or seen > len(by_name):
        return 0
    return 1 + max(_depth(d, by_name, seen + 1) for d in deps)


def load_trace(path: Path) -> Trace:
    return parse_trace(read_text(path), str(path))


def dump_trace(header: TraceHeader, jobs: Iterable[TraceJob],
               people: Iterable[Person] = ()) -> bytes:
    """JSON Lines, header first, then people, then jobs; defaults left out so a line says
    what is special."""
    lines: Sequence[dict[str, Any]] = [
        header.model_dump(mode="json", exclude_none=True),
        *(p.model_dump(mode="json", exclude_defaults=True, by_alias=True)
          | {"person": p.person} for p in people),
        *(j.model_dump(mode="json", exclude_defaults=True)
          | {"name": j.name, "arrival": j.arrival, "user": j.user}
          for j in jobs),
    ]
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)


def write_trace(path: Path, header: TraceHeader, jobs: Iterable[TraceJob],
                people: Iterable[Person] = ()) -> None:
    replace_file(path, dump_trace(header, jobs, people))
