"""Training anomalies from the loss alone: a non-finite loss, or a spike over the median.

Pure logic, no I/O. A spike is a loss above `spike_factor` times the median of the last
`window` finite losses, judged once at least `min_history` of them were seen and only while
that median is positive (a loss that can go negative has no meaningful ratio).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Anomaly:
    kind: str  # "nonfinite_loss" | "loss_spike"
    step: int
    loss: float
    median: float | None
    first_in_streak: bool  # the previous step was normal


class LossMonitor:
    def __init__(self, spike_factor: float = 10.0, window: int = 50, min_history: int = 10) -> None:
        problems = []
        if not spike_factor > 1.0:
            problems.append(f"spike_factor must be > 1, not {spike_factor}")
        if window < 1 or min_history < 1 or min_history > window:
            problems.append(f"need 1 <= min_history ({min_history}) <= window ({window})")
        if problems:
            raise ValueError("; ".join(problems))
        self.spike_factor = spike_factor
        self.min_history = min_history
        self._history: deque[float] = deque(maxlen=window)
        self._in_streak = False

    def observe(self, step: int, loss: float) -> Anomaly | None:
        median = statistics.median(self._history) if self._history else None
        kind = None
        if not math.isfinite(loss):
            kind = "nonfinite_loss"
        else:
            if (
                median is not None
                and len(self._history) >= self.min_history
                and median > 0
                and loss > self.spike_factor * median
            ):
                kind = "loss_spike"
            self._history.append(loss)
        if kind is None:
            self._in_streak = False
            return None
        first = not self._in_streak
        self._in_streak = True
        return Anomaly(kind, step, loss, median, first)
