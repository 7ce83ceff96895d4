"""Compiled curves: a scenario's CurveSpec turned into a cheap `at(t)` function.

Sampling evaluates thousands of curves per cycle for the `large` scenario, so each spec
is compiled once into a small object with no pydantic access on the hot path. Noise is a
pure function of (seed key, time bucket) through a splitmix64 hash, not a stateful RNG:
the value at a given scenario time is the same however often or rarely it is sampled,
which is what makes runs reproducible.

This module must never read files or know about GPUs.
"""

from __future__ import annotations

import abc
import bisect
import hashlib
import math

from exporter.sim.schema import CurveSpec

_MASK = (1 << 64) - 1
_PER_SECONDS = {"second": 1.0, "minute": 60.0, "hour": 3600.0}


def seed_key(*parts: object) -> int:
    """A stable 64-bit key for a noise stream (independent of PYTHONHASHSEED)."""
    digest = hashlib.blake2b(repr(parts).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def noise_bits(key: int, bucket: int) -> int:
    """64 well-mixed bits, a pure function of (key, bucket) (splitmix64)."""
    z = (key + (bucket + 1) * 0x9E3779B97F4A7C15) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def unit_noise(key: int, bucket: int) -> float:
    """Uniform in [-1, 1), a pure function of (key, bucket)."""
    return (noise_bits(key, bucket) >> 11) * (2.0 / (1 << 53)) - 1.0


class Compiled:
    """A curve ready to evaluate. `constant` is set when it never changes."""

    __slots__ = ("_at", "base", "constant", "hi", "key", "lo", "noise")

    def __init__(
        self,
        at: _Shape,
        noise: float,
        key: int,
        lo: float = -math.inf,
        hi: float = math.inf,
    ) -> None:
        self._at = at
        self.noise = noise
        self.key = key
        self.lo = lo
        self.hi = hi
        self.constant: float | None = (
            min(max(at.value, lo), hi) if isinstance(at, _Const) and noise == 0 else None
        )
        # Constant-plus-noise is the common shape; skipping the shape call saves a third.
        self.base: float | None = at.value if isinstance(at, _Const) else None

    def at(self, t: float) -> float:
        """The value at `t` seconds (clamped to [lo, hi] after noise)."""
        if self.constant is not None:
            return self.constant
        v = self.base if self.base is not None else self._at.at(t)
        if self.noise:
            v += self.noise * unit_noise(self.key, math.floor(t))
        if v < self.lo:
            return self.lo
        if v > self.hi:
            return self.hi
        return v


class _Shape(abc.ABC):
    __slots__ = ()

    @abc.abstractmethod
    def at(self, t: float) -> float:
        """The curve's value at scenario time t."""


class _Const(_Shape):
    __slots__ = ("value",)

    def __init__(self, value: float) -> None:
        self.value = value

    def at(self, t: float) -> float:
        return self.value


class _Linear(_Shape):
    __slots__ = ("hi", "lo", "rate", "start")

    def __init__(self, start: float, rate: float, lo: float, hi: float) -> None:
        self.start, self.rate, self.lo, self.hi = start, rate, lo, hi

    def at(self, t: float) -> float:
        v = self.start + self.rate * max(t, 0.0)
        return min(max(v, self.lo), self.hi)


class _Steps(_Shape):
    __slots__ = ("times", "values")

    def __init__(self, points: list[tuple[float, float]]) -> None:
        self.times = [p[0] for p in points]
        self.values = [p[1] for p in points]

    def at(self, t: float) -> float:
        i = bisect.bisect_right(self.times, t) - 1
        return self.values[max(i, 0)]


class _Ramp(_Steps):
    __slots__ = ()

    def at(self, t: float) -> float:
        times, values = self.times, self.values
        i = bisect.bisect_right(times, t)
        if i == 0:
            return values[0]
        if i == len(times):
            return values[-1]
        t0, t1 = times[i - 1], times[i]
        v0, v1 = values[i - 1], values[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


def rate_per_second(spec: CurveSpec) -> float:
    assert spec.rate is not None
    return spec.rate / _PER_SECONDS[spec.per]


def compile_curve(
    spec: CurveSpec, key: int, lo: float = -math.inf, hi: float = math.inf
) -> Compiled:
    """Compile `spec`; results are clamped to [lo, hi] (e.g. 0..1 for ratios)."""
    shape: _Shape
    if spec.value is not None:
        shape = _Const(spec.value)
    elif spec.rate is not None:
        shape = _Linear(
            spec.start,
            rate_per_second(spec),
            spec.min if spec.min is not None else -math.inf,
            spec.max if spec.max is not None else math.inf,
        )
    elif spec.steps is not None:
        shape = _Steps(list(spec.steps))
    else:
        assert spec.ramp is not None
        shape = _Ramp(list(spec.ramp))
    return Compiled(shape, spec.noise, key, lo, hi)


def curve_bounds(spec: CurveSpec, span: float | None) -> tuple[float, float]:
    """(lowest, highest) value the curve takes over [0, span] seconds, noise included.

    `span` None means unbounded time: a growing linear curve without `max` is then
    unbounded (inf), which the scenario checks report as a problem for memory.
    """
    if spec.value is not None:
        lo = hi = spec.value
    elif spec.rate is not None:
        rate = rate_per_second(spec)
        end = math.inf if span is None else spec.start + rate * span
        if rate == 0:
            end = spec.start
        lo, hi = min(spec.start, end), max(spec.start, end)
        if spec.max is not None:
            hi = min(hi, spec.max)
        if spec.min is not None:
            lo = max(lo, spec.min)
    else:
        points = spec.steps if spec.steps is not None else spec.ramp
        assert points is not None
        values = [p[1] for p in points]
        lo, hi = min(values), max(values)
    return lo - spec.noise, hi + spec.noise
