"""Shared helpers for the simulator tests: a hand-driven clock and a sampling loop."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import pytest

from exporter.sim.backend import SimBackend
from exporter.sim.scenario import load_scenario
from gpu_audit.model.samples import GpuSample

START = 1_750_000_000.0  # a fixed scenario start (unix seconds) so timestamps are stable


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def open_backend(name: str, *, time_scale: float = 1.0) -> tuple[SimBackend, FakeClock]:
    clock = FakeClock()
    backend = SimBackend(load_scenario(name), time_scale=time_scale, start_time=START, clock=clock)
    backend.open()
    return backend, clock


def play(
    backend: SimBackend, clock: FakeClock, until: float, step: float, slow_every: int = 6
) -> Iterator[tuple[float, Sequence[GpuSample]]]:
    """Sample every `step` scenario seconds (time_scale 1) until scenario time `until`."""
    cycle = 0
    while backend.elapsed_scenario_seconds <= until:
        samples = backend.sample(clock(), slow=cycle % slow_every == 0)
        yield backend.elapsed_scenario_seconds, samples
        clock.advance(step / backend.time_scale)
        cycle += 1


def by_index(samples: Sequence[GpuSample], index: int) -> GpuSample:
    return next(s for s in samples if s.info.index == index)


@pytest.fixture
def fake_clock() -> FakeClock:
    return FakeClock()
