"""Job specifications: one job, or a pipeline of jobs with dependencies, in YAML.

A submission is either one job (a mapping with `name`, `command`, ...) or a pipeline:

    project: vision
    jobs:
      - {name: prepare, command: python prep.py, gpus: 0}
      - {name: train, command: [python, train.py], gpus: 1, after: [prepare]}

In a pipeline, top-level keys other than `jobs` are defaults for every job (a job's own
value wins). `after` names jobs of the same submission, or gives the ids (integers) of
earlier jobs of the same user (the engine checks those at submission). `urgency` is the
name of one of the levels the daemon's configuration defines (checked at submission
too). `load_submission` returns the jobs in submission order or raises ConfigError
naming every problem found: unknown keys, bad values, duplicate names, unknown `after`
names and dependency cycles, each with its line.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import signal
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gpu_audit.errors import ConfigError
from gpu_audit.yamlload import Loc, dotted, line_for, parse_yaml, read_text, validation_problems
from launcher.deadlines import parse_deadline, parse_duration
from launcher.limits import MAX_JOB_ID, SPEC

# Before named urgency levels an urgency was a number 0..10 (points = w_urgency x
# number); specs stored then are read back as the level that number meant. A submission
# may no longer give one.
LEGACY_URGENCY = ("low", "normal", "high", "urgent")
URGENCY_NAME = re.compile(r"^[a-z][a-z0-9_-]{0,31}$")

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


def _short(value: object) -> str:
    """`value` for a message, cut: a problem must not echo a megabyte back."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def parse_bytes(value: object) -> int:
    """A size as bytes: an integer, or a string such as "20GiB", "512 MiB", "1.5GB"."""
    if isinstance(value, bool):
        raise ValueError("a size must be a number of bytes or a string such as 20GiB")
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        match = _SIZE.match(value)
        if match and match.group(2).lower() in _UNITS:
            number = float(match.group(1)) * _UNITS[match.group(2).lower()]
            if not math.isfinite(number) or number > SPEC.max_gpu_memory_bytes:
                raise ValueError(f"{_short(value)} is more than any GPU has (at most "
                                 f"{SPEC.max_gpu_memory_bytes} bytes)")
            return int(number)
    raise ValueError(f"{_short(value)} is not a size (use bytes or e.g. 20GiB, 512MiB, 1.5GB)")


def urgency_value(value: object) -> str:
    """An urgency level's name (lower-cased); which names exist is the daemon's
    configuration (checked at submission). A number is a spec stored before levels
    were names: it reads as the level it meant."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 10:
        return LEGACY_URGENCY[min(value, 3)]
    if isinstance(value, str) and URGENCY_NAME.match(value.strip().lower()):
        return value.strip().lower()
    raise ValueError(f"urgency is the name of a level (e.g. low, normal, high, urgent), "
                     f"not {_short(value)}")


def _no_nul(where: str, text: str) -> None:
    if "\0" in text:
        raise ValueError(f"{where} contains a NUL character")


class JobSpec(BaseModel):
    """One job as submitted. `gpus` whole GPUs, or a `gpu_fraction` of one GPU (then
    `gpus` must be 1 or absent); `gpu_memory_bytes` is the memory it needs on each GPU
    (default: the whole GPU for whole-GPU jobs, the fraction of it for fractional ones).
    Every number is finite and inside the range launcher.limits.SPEC gives it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    command: list[str] | str
    cwd: str | None = Field(default=None, max_length=SPEC.max_text)
    gpus: int = Field(default=1, ge=0, le=SPEC.max_gpus)
    gpu_fraction: float | None = Field(default=None, ge=SPEC.min_gpu_fraction, le=1.0,
                                       allow_inf_nan=False)
    gpu_memory_bytes: int | None = Field(default=None, gt=0, le=SPEC.max_gpu_memory_bytes)
    urgency: str | None = None  # a level name; None: the configuration's default_urgency
    user: str | None = Field(default=None, max_length=64)
    project: str = Field(default="default", min_length=1, max_length=SPEC.max_label)
    department: str | None = Field(default=None, max_length=SPEC.max_label)
    checkpoint_dir: str | None = Field(default=None, max_length=SPEC.max_text)
    max_runtime_seconds: float | None = Field(default=None, gt=0,
                                              le=SPEC.max_runtime_seconds,
                                              allow_inf_nan=False)
    max_retries: int | None = Field(default=None, ge=0, le=SPEC.max_retries)
    after: list[str | int] = Field(default_factory=list, max_length=SPEC.max_after)
    env: dict[str, str] = Field(default_factory=dict, max_length=SPEC.max_env)
    preempt_signal: str = "SIGUSR1"
    # when the job must be done: absolute (epoch seconds / ISO 8601) or "HH:MM" (the next
    # one after submission, the submitter's local time); the engine stores it absolute
    deadline: float | str | None = None
    # how long the job runs, in seconds ("4h", "90m" accepted): the user's estimate,
    # used for slack when the launcher has no history of its own for the job
    expected_runtime: float | None = None
    # where `expected_runtime` came from, set by the engine at submission ("spec": the
    # user wrote it; "history:name" / "history:command": the median of the owner's
    # finished runs); whatever a submission writes here is overwritten
    expected_runtime_source: Literal["spec", "history:name", "history:command"] | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError("a job name is 1-64 letters, digits, '.', '_' or '-', "
                             "starting with a letter or digit")
        return v

    @field_validator("command")
    @classmethod
    def _command(cls, v: list[str] | str, info: ValidationInfo) -> list[str] | str:
        if isinstance(info.context, dict) and info.context.get(STORED):
            return v  # checked when it was submitted; splitting 256 KiB again takes 1 s
        if isinstance(v, str):
            try:
                words = shlex.split(v)
            except ValueError as exc:
                raise ValueError(f"cannot split the command line: {exc}") from None
            if not words:
                raise ValueError("the command is empty")
            if len(words) > SPEC.max_argv or len(v) > SPEC.max_command_chars:
                raise ValueError(f"the command is longer than {SPEC.max_argv} words or "
                                 f"{SPEC.max_command_chars} characters")
            _no_nul("the command", v)
        elif not v or not v[0]:
            raise ValueError("the command is empty")
        else:
            if len(v) > SPEC.max_argv or sum(map(len, v)) > SPEC.max_command_chars:
                raise ValueError(f"the command is longer than {SPEC.max_argv} words or "
                                 f"{SPEC.max_command_chars} characters")
            for word in v:
                _no_nul("the command", word)
        return v

    @field_validator("gpu_memory_bytes", mode="before")
    @classmethod
    def _memory(cls, v: object) -> object:
        return None if v is None else parse_bytes(v)

    @field_validator("urgency", mode="before")
    @classmethod
    def _urgency(cls, v: object) -> str | None:
        return None if v is None else urgency_value(v)

    @field_validator("after", mode="before")
    @classmethod
    def _after(cls, v: object) -> object:
        if isinstance(v, list):
            for dep in v:
                if isinstance(dep, bool) or not isinstance(dep, str | int):
                    raise ValueError("`after` lists job names (of this submission) or ids "
                                     f"(integers, of your earlier jobs), not {_short(dep)}")
                if isinstance(dep, int) and not 1 <= dep <= MAX_JOB_ID:
                    raise ValueError(f"job id {_short(dep)} is out of range "
                                     f"(1..{MAX_JOB_ID})")
        return v

    @field_validator("deadline", mode="before")
    @classmethod
    def _deadline(cls, v: object) -> object:
        return None if v is None else parse_deadline(v)

    @field_validator("expected_runtime", mode="before")
    @classmethod
    def _expected(cls, v: object) -> object:
        return None if v is None else parse_duration(v)

    @field_validator("preempt_signal")
    @classmethod
    def _signal(cls, v: str) -> str:
        name = v.upper() if v.upper().startswith("SIG") else "SIG" + v.upper()
        if name in ("SIGKILL", "SIGSTOP") or not hasattr(signal.Signals, name):
            raise ValueError(f"{_short(v)} is not a signal a job can catch (e.g. SIGUSR1, "
                             "SIGTERM)")
        return name

    @field_validator("env")
    @classmethod
    def _env(cls, v: dict[str, str]) -> dict[str, str]:
        bad = [k for k in v if not re.match(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$", k)]
        if bad:
            raise ValueError(f"not environment variable names: {', '.join(sorted(bad))}")
        long = [k for k, value in v.items() if len(value) > SPEC.max_text]
        if long:
            raise ValueError(f"values longer than {SPEC.max_text} characters: "
                             f"{', '.join(sorted(long))}")
        for key, value in v.items():
            _no_nul(f"env {key}", value)
        return v

    @field_validator("cwd", "checkpoint_dir", "project", "department", "user")
    @classmethod
    def _text(cls, v: str | None) -> str | None:
        if v is not None:
            _no_nul("the value", v)
        return v

    @model_validator(mode="before")
    @classmethod
    def _whole_fraction(cls, data: Any) -> Any:
        """`gpu_fraction: 1` is one whole GPU: the job is then a whole-GPU job."""
        if isinstance(data, dict) and data.get("gpu_fraction") == 1 \
                and not isinstance(data.get("gpu_fraction"), bool):
            return {**{k: v for k, v in data.items() if k != "gpu_fraction"}}
        return data

    @model_validator(mode="after")
    def _fraction(self) -> JobSpec:
        if self.gpu_fraction is not None and self.gpus != 1:
            raise ValueError("gpu_fraction is a share of ONE GPU: leave gpus at 1")
        if self.name in self.after:
            raise ValueError(f"job {self.name!r} cannot run after itself")
        return self

    @property
    def after_names(self) -> list[str]:
        """The dependencies on jobs of the same submission."""
        return [d for d in self.after if isinstance(d, str)]

    @property
    def after_ids(self) -> list[int]:
        """The dependencies on earlier jobs (ids)."""
        return [d for d in self.after if isinstance(d, int)]

    @property
    def argv(self) -> list[str]:
        """The command as an argument vector (a string is split like a shell would)."""
        return shlex.split(self.command) if isinstance(self.command, str) else list(self.command)

    @property
    def gpu_share(self) -> float:
        """GPUs this job occupies: its fraction, or its whole-GPU count."""
        return self.gpu_fraction if self.gpu_fraction is not None else float(self.gpus)

    @property
    def exclusive(self) -> bool:
        """True for whole-GPU jobs (they own their GPUs), False for fractional ones."""
        return self.gpu_fraction is None

    @property
    def signum(self) -> int:
        return int(signal.Signals[self.preempt_signal])


def _source_and_text(text_or_path: str | Path, source: str | None) -> tuple[str, str]:
    if isinstance(text_or_path, Path):
        return source or str(text_or_path), read_text(text_or_path)
    if "\n" not in text_or_path and text_or_path.strip() and os.path.isfile(text_or_path):
        return source or text_or_path, read_text(Path(text_or_path))
    return source or "<submission>", text_or_path


def load_submission(text_or_path: str | Path, source: str | None = None,
                    levels: Collection[str] | None = None) -> list[JobSpec]:
    """Parse and validate a submission (one job or a `jobs:` pipeline); ConfigError lists
    every problem. A Path (or a string naming an existing file) is read; other strings are
    the YAML text itself. `levels`: the urgency levels the daemon defines (an unknown one
    is then a problem here, listed with the others; who may use a level is the engine's
    check)."""
    source, text = _source_and_text(text_or_path, source)
    doc = parse_yaml(text, source)  # refuses alias bombs, cycles, duplicate keys, tags
    problems: list[tuple[Loc, str]] = [(loc, msg) for loc, _, msg in doc.problems]
    data = doc.data
    raw_jobs: list[tuple[Loc, Any]] = []
    if not isinstance(data, dict):
        raise ConfigError(source, ["a submission is a mapping: one job, or `jobs:` with a list"])
    if "jobs" in data:
        defaults = {k: v for k, v in data.items() if k != "jobs"}
        jobs = data["jobs"]
        if not isinstance(jobs, list) or not jobs:
            problems.append((("jobs",), "must be a non-empty list of jobs"))
            jobs = []
        elif len(jobs) > SPEC.max_jobs:
            problems.append((("jobs",), f"{len(jobs)} jobs in one submission; at most "
                             f"{SPEC.max_jobs}"))
            jobs = jobs[:SPEC.max_jobs]
        for i, job in enumerate(jobs):
            if not isinstance(job, dict):
                problems.append((("jobs", i), "each job is a mapping (name, command, ...)"))
                continue
            raw_jobs.append((("jobs", i), {**defaults, **job}))
    else:
        raw_jobs.append(((), data))

    specs: list[tuple[Loc, JobSpec]] = []
    names: dict[str, Loc] = {}
    all_names = {r.get("name") for _, r in raw_jobs if isinstance(r.get("name"), str)}
    for loc, given in raw_jobs:
        raw = given
        name = raw.get("name")
        if isinstance(name, str):
            if name in names:
                problems.append(((*loc, "name"), f"job name {_short(name)} is used twice in "
                                 f"this submission (first at {dotted(names[name])})"))
            else:
                names[name] = loc
        urgency = raw.get("urgency")
        if isinstance(urgency, int | float) and not isinstance(urgency, bool):
            problems.append(((*loc, "urgency"), f"{_short(urgency)}: urgency is the name of "
                             "a level the launcher defines (e.g. low, normal, high, urgent), "
                             "not a number"))
            raw = {k: v for k, v in raw.items() if k != "urgency"}
        try:
            spec = JobSpec.model_validate(raw)
            specs.append((loc, spec))
            if levels is not None and spec.urgency is not None and spec.urgency not in levels:
                problems.append(((*loc, "urgency"), f"{spec.urgency!r} is not a level here "
                                 f"(one of {', '.join(levels)})"))
        except ValidationError as exc:
            for sub, msg in validation_problems(exc, raw):
                problems.append(((*loc, *sub), msg))
            # a well-formed level name that does not exist is listed too (a malformed
            # one already is, by the validation)
            level = raw.get("urgency")
            if levels is not None and isinstance(level, str) and \
                    URGENCY_NAME.match(level.strip().lower()) and \
                    level.strip().lower() not in levels:
                problems.append(((*loc, "urgency"), f"{_short(level)} is not a level here "
                                 f"(one of {', '.join(levels)})"))
        after = raw.get("after", [])
        if isinstance(after, list):
            for j, dep in enumerate(after[:SPEC.max_after]):
                if isinstance(dep, str) and dep not in all_names:
                    problems.append(((*loc, "after", j), f"no job named {_short(dep)} in this "
                                     "submission"))
    problems.extend(_cycles({s.name: (loc, s.after_names) for loc, s in specs}))
    if problems:
        def render(loc: Loc, msg: str) -> str:
            line = line_for(loc, doc.marks)
            return f"{'line ' + str(line) + ': ' if line else ''}{dotted(loc)}: {msg}"
        raise ConfigError(source, [render(loc, msg) for loc, msg in problems])
    return [s for _, s in specs]


def _cycles(graph: Mapping[str, tuple[Loc, list[str]]]) -> list[tuple[Loc, str]]:
    """One problem per dependency cycle (found by depth-first search, each reported once)."""
    out: list[tuple[Loc, str]] = []
    state: dict[str, int] = {}  # 1 on the current path, 2 done
    for start in graph:
        if state.get(start):
            continue
        stack: list[tuple[str, int]] = [(start, 0)]
        path: list[str] = [start]
        state[start] = 1
        while stack:
            node, i = stack[-1]
            deps = [d for d in graph[node][1] if d in graph]
            if i < len(deps):
                stack[-1] = (node, i + 1)
                dep = deps[i]
                if state.get(dep) == 1:
                    cycle = [*path[path.index(dep):], dep]
                    out.append(((*graph[dep][0], "after"),
                                "dependency cycle: " + " -> ".join(cycle)))
                elif not state.get(dep):
                    state[dep] = 1
                    path.append(dep)
                    stack.append((dep, 0))
            else:
                state[node] = 2
                path.pop()
                stack.pop()
    return out


# The validation context of a spec the launcher checked before (read back from its store
# or from its submission reader): its command line is not split again.
STORED = "stored"
TRUSTED = {STORED: True}


def expansion_problems(specs: Sequence[JobSpec], limit: int) -> list[str]:
    """The problem with a submission whose jobs, defaults copied into each, add up to
    more than `limit` bytes as stored (none when they do not)."""
    total = sum(len(s.model_dump_json()) for s in specs)
    if total <= limit:
        return []
    return [f"the submission expands to {total} bytes over its {len(specs)} jobs (the "
            f"top-level keys, env included, are copied into every job); at most {limit} "
            "(quotas.max_expanded_bytes): put large shared values in a file the jobs read"]
