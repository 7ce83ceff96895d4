"""How far a job is, from what it reports: sanitised progress and the remaining-time estimate.

A job reports `step`, `total_steps`, `loss`, `steps_per_second` and `epoch` in the
`metrics` events of its events file (gpu_audit_ckpt, docs/CHECKPOINT.md). A job is not
trusted: `progress_of` keeps only finite numbers within bounds (a NaN, a negative step,
a total of 10^30 steps or a throughput of 10^12 steps/s is dropped, never shown or
exported), and `estimate_remaining` gives None where the job did not report what an
estimate needs (it never invents a throughput or a total). Runtime estimates of other
parts of the launcher (scheduling) should call `estimate_remaining`.

Pure functions on plain values: this module must never do I/O or read a clock itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

# Bounds on what a job may report; past them the field is dropped as nonsense.
MAX_STEPS = 10**12  # a trillion optimizer steps: no real run comes near
MAX_STEPS_PER_SECOND = 1e7  # faster than any training step can be
MAX_EPOCH = 10**9
MAX_ABS_LOSS = 1e30
# An estimate longer than this is not an estimate (a stalled job reporting 1e-9 steps/s)
MAX_REMAINING_SECONDS = 366 * 86400.0
# How many characters of an environment value, and how many values, the record keeps
MAX_ENV_KEYS = 24
MAX_ENV_VALUE = 64
# the environment event's fields (docs/CHECKPOINT.md), in the order people read them
KNOWN_ENV_KEYS = ("python", "torch", "cuda", "hip", "cudnn", "nccl", "lightning",
                  "pytorch_lightning", "transformers", "accelerate", "numpy",
                  "python_implementation", "platform")
_ENV_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_")


@dataclass(frozen=True, slots=True)
class Progress:
    """One job's newest sanitised report. `time`: when it was reported (launcher clock,
    never later than when it was read); `attempt`: the attempt that reported it."""

    time: float
    attempt: int
    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    steps_per_second: float | None = None
    epoch: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, doc: Mapping[str, Any]) -> Progress | None:
        """The stored form back (a damaged row: None, never an exception)."""
        t, attempt = _finite(doc.get("time")), doc.get("attempt")
        if t is None or not isinstance(attempt, int) or isinstance(attempt, bool):
            return None
        return progress_of(doc, t, attempt)


def _finite(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    f = float(v)
    return f if math.isfinite(f) else None


def _count(v: Any, limit: int) -> int | None:
    f = _finite(v)
    if f is None or f < 0 or f > limit or f != int(f):
        return None
    return int(f)


def progress_of(doc: Mapping[str, Any], time: float, attempt: int) -> Progress:
    """The progress fields of a `metrics` event, each kept only when it is sane."""
    step = _count(doc.get("step"), MAX_STEPS)
    total = _count(doc.get("total_steps"), MAX_STEPS)
    if total == 0:
        total = None  # "0 steps to do" gives no fraction and no estimate
    loss = _finite(doc.get("loss"))
    if loss is not None and abs(loss) > MAX_ABS_LOSS:
        loss = None
    sps = _finite(doc.get("steps_per_second"))
    if sps is not None and not 0 < sps <= MAX_STEPS_PER_SECOND:
        sps = None
    return Progress(time=time, attempt=attempt, step=step, total_steps=total, loss=loss,
                    steps_per_second=sps, epoch=_count(doc.get("epoch"), MAX_EPOCH))


def fraction(p: Progress) -> float | None:
    """step / total_steps in [0, 1] (a step past the total reads as done)."""
    if p.step is None or p.total_steps is None:
        return None
    return min(1.0, p.step / p.total_steps)


def estimate_remaining(p: Progress | None, now: float) -> float | None:
    """Seconds until the job reaches its total steps at its reported throughput, counted
    from `now`: (total_steps - step) / steps_per_second at the report, less the time since
    (never below 0). None when the job did not report a step, a total or a throughput,
    or when the result would exceed MAX_REMAINING_SECONDS."""
    if p is None or p.step is None or p.total_steps is None or p.steps_per_second is None:
        return None
    left = max(0, p.total_steps - p.step) / p.steps_per_second
    if not math.isfinite(left) or left > MAX_REMAINING_SECONDS:
        return None
    return max(0.0, left - max(0.0, now - p.time))


def clean_environment(doc: Mapping[str, Any]) -> dict[str, str | int | None]:
    """The `environment` event's fields a job record keeps: at most MAX_ENV_KEYS of them,
    names of lower-case letters, digits and '_', values a string (cut to MAX_ENV_VALUE
    characters, control characters dropped), a whole number or null. The fields the
    helper documents come first, so a job's own extra keys cannot push them out."""
    out: dict[str, str | int | None] = {}
    keys = sorted((k for k in doc if isinstance(k, str)),
                  key=lambda k: (k not in KNOWN_ENV_KEYS, k))
    for key in keys:
        if key in ("event", "time", "pid") or not 0 < len(key) <= 32 \
                or not set(key) <= _ENV_KEY_CHARS:
            continue
        if len(out) >= MAX_ENV_KEYS:
            break
        v = doc[key]
        if v is None or (isinstance(v, int) and not isinstance(v, bool) and abs(v) < 2**53):
            out[key] = v
        elif isinstance(v, str):
            out[key] = "".join(c for c in v if c.isprintable())[:MAX_ENV_VALUE]
    return out


def describe_environment(env: Mapping[str, Any]) -> str:
    """One line for people: 'python 3.12.3, torch 2.6.0, cuda 12.4, cudnn 90100, ...'."""
    order = KNOWN_ENV_KEYS[:11]
    parts = [f"{k} {env[k]}" for k in order if env.get(k) is not None]
    parts += [f"{k} {v}" for k, v in sorted(env.items())
              if k not in order and k not in ("python_implementation", "platform")
              and v is not None]
    return ", ".join(parts)


def format_duration(seconds: float | None) -> str:
    """'-' / '45s' / '12m05s' / '3h07m' / '2d04h'."""
    if seconds is None:
        return "-"
    s = round(seconds)
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
