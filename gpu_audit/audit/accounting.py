"""How much GPU time and energy each audit record accounts for (pure arithmetic).

Energy is kept on a grid of 1/1024 J (a "binary millijoule", the resolution of NVML's
millijoule counter): every amount is an integer number of grid units divided by 1024,
which a double represents exactly, so sums over records are exact in any order and the
per-GPU conservation `sum(process energy) + unattributed energy == gpu energy` holds
bit for bit, not just within a tolerance.

A leaf of the audit record path: the builder, the record kinds and the interval call it,
it calls none of them (tests/core/audit/test_call_layers.py). This module must never do
I/O or look at anything but the numbers (and the GPU readings) it is given.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from math import isfinite
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from gpu_audit.model.samples import GpuSample

ENERGY_GRID = 1024  # units per joule
EnergySource = Literal["counter", "counter_reset", "power"]


def elapsed_for(
    timestamp: float,
    prev_timestamp: float | None,
    interval_seconds: float,
    max_intervals: float,
) -> float:
    """Seconds this cycle accounts for: time since the previous snapshot, capped.

    0 on the first snapshot (nothing was observed before it) and when the clock went
    backwards; at most `max_intervals` x the nominal interval, so a pause never bills
    hours to one sample.
    """
    if prev_timestamp is None:
        return 0.0
    elapsed = timestamp - prev_timestamp
    if not math.isfinite(elapsed) or elapsed <= 0:
        return 0.0
    if interval_seconds > 0:
        elapsed = min(elapsed, interval_seconds * max_intervals)
    return elapsed


def energy_units(
    counter_now: float | None,
    counter_prev: float | None,
    power_watts: float | None,
    elapsed: float,
    *,
    counter_share: float = 1.0,
) -> tuple[int, EnergySource] | None:
    """Energy of one GPU over the interval, in grid units, with where it came from.

    Counter delta when both readings exist; a negative delta means the counter restarted
    (driver reload, reset), and then the new reading is the energy since the restart.
    `counter_share` (<= 1) scales a counter delta down to the accounted part of a capped
    interval. Without both readings: power x elapsed. None when neither is known.
    """
    if counter_now is not None and counter_prev is not None:
        delta = counter_now - counter_prev
        source: EnergySource = "counter"
        if delta < 0:
            delta, source = max(counter_now, 0.0), "counter_reset"
        return round(delta * counter_share * ENERGY_GRID), source
    if power_watts is not None and power_watts >= 0:
        return round(power_watts * elapsed * ENERGY_GRID), "power"
    return None


def finite(v: float | None) -> float | None:
    """A reading, or None when it is not a finite number: a non-finite reading is "not
    measured" (as in a record's `values`), never a number to use."""
    return v if v is not None and isfinite(v) else None


def as_float(x: int | None) -> float | None:
    return float(x) if x is not None else None


def energy_of(
    gpu: GpuSample, prev_gpu: GpuSample | None, elapsed: float, counter_share: float
) -> tuple[int, EnergySource] | None:
    """energy_units() of a GPU from its readings (the energy counter of this and the
    previous sample, when that GPU was up; else the power draw)."""
    counter, power = finite(gpu.scalar("energy")), finite(gpu.scalar("power_usage"))
    prev_counter = (finite(prev_gpu.scalar("energy"))
                    if prev_gpu is not None and prev_gpu.up else None)
    return energy_units(counter, prev_counter, power, elapsed, counter_share=counter_share)


def joules(units: int) -> float:
    """Grid units to joules (exact)."""
    return units / ENERGY_GRID


def split_units(total: int, weights: Sequence[float]) -> list[int]:
    """Split `total` integer units by `weights` so the parts sum to `total` exactly.

    Largest-remainder method; ties go to the earlier weight, so the split is
    deterministic. All-zero weights give all zeros except when total is 0.
    """
    wsum = math.fsum(weights)
    if total == 0 or wsum <= 0:
        return [0] * len(weights)
    exact = [total * w / wsum for w in weights]
    parts = list(map(math.floor, exact))
    left = total - sum(parts)
    if not left:
        return parts
    if math.isfinite(wsum):
        # Largest remainder first, ties to the earlier weight: a stable sort by remainder
        # (reverse keeps equal keys in order) is the order of the key below, in C (one
        # GPU's split is in every cycle). A finite sum means finite remainders, no NaN.
        rem = list(map(operator.sub, exact, parts))
        order = sorted(range(len(weights)), key=rem.__getitem__, reverse=True)
    else:
        order = sorted(range(len(weights)), key=lambda i: (-(exact[i] - parts[i]), i))
    for i in order[:left]:
        parts[i] += 1
    return parts


def energy_weights(
    *,
    attributed_sm: Sequence[float | None],
    attributed_mem: Sequence[float | None],
    unattributed_sm: Sequence[float | None],
    unattributed_mem: Sequence[float | None],
    gpu_util: float | None,
    gpu_mem_used: float | None,
) -> list[float]:
    """Weights for [attributed process..., unattributed remainder] on one GPU: the one
    energy rule of every source (docs/CHARGEBACK.md, "Energy: the rule"; the recording
    rule `gpu:gpu_power_watts:share` applies the same steps to the holders' series).

    1. SM utilisation share, when the GPU's processes' SM ratios sum to > 0: each
       attributed process weighs its SM ratio; the remainder weighs the GPU utilisation
       no attributed process explains (or, without a GPU figure, the SM ratio of the
       processes nobody owns). Idle energy is so shared in proportion to use.
    2. Else (no per-process SM, as under MIG, or every process at 0) memory share, the
       same way with used memory.
    3. Else an equal split among attributed processes; with none, all to the remainder.
    """
    n = len(attributed_sm)

    def known(xs: Sequence[float | None]) -> list[float]:
        return [x if x is not None and x > 0 else 0.0 for x in xs]

    for own, other, gpu_total in (
        (attributed_sm, unattributed_sm, gpu_util),
        (attributed_mem, unattributed_mem, gpu_mem_used),
    ):
        if not any(x is not None for x in (*own, *other)):
            continue
        w = known(own)
        explained = math.fsum(w)
        if explained + math.fsum(known(other)) <= 0:
            continue  # the processes say nothing of this quantity: the next step
        rest = (
            max(0.0, gpu_total - explained)
            if gpu_total is not None
            else math.fsum(known(other))
        )
        if explained + rest > 0:
            return [*w, rest]
    if n:
        return [1.0] * n + [0.0]
    return [1.0]
