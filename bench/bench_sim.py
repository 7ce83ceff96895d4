"""CPU cost of one simulator sampling cycle, per shipped scenario.

This is our own overhead per cycle (no hardware is read): scenario evaluation plus
building every GpuSample/ProcessSample. The target for `large` (8 GPUs x 64 processes)
is well under 5 ms of CPU per cycle.

Run: .venv/bin/python bench/bench_sim.py [--cycles N]
"""

from __future__ import annotations

import argparse
import logging
import time

from exporter.sim.backend import SimBackend
from exporter.sim.scenario import SHIPPED, load_scenario


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def bench(name: str, cycles: int, interval: float = 5.0, slow_every: int = 12) -> float:
    """Mean CPU milliseconds per sample() call over `cycles` cycles of `interval` s."""
    clock = _Clock()
    backend = SimBackend(load_scenario(name), clock=clock)
    backend.open()
    backend.sample(0.0, slow=True)  # warm: first cycle computes the slow tier too
    start = time.process_time()
    for i in range(cycles):
        clock.now += interval
        backend.sample(clock.now, slow=i % slow_every == 0)
    return (time.process_time() - start) / cycles * 1000.0


def floor_ms(processes: int, cycles: int) -> float:
    """CPU ms to merely construct `processes` ProcessSample objects: the part of a cycle
    that the shared data model fixes, shown beside the result on the same noisy machine."""
    from gpu_audit.model.samples import ProcessSample

    start = time.process_time()
    for _ in range(cycles):
        for pid in range(processes):
            ProcessSample(pid, "python", 1000, "compute", 1 << 30, 0.1, 0.01, 0.0, 0.0,
                          None, None, None)
    return (time.process_time() - start) / cycles * 1000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=300)
    args = parser.parse_args()
    logging.disable(logging.WARNING)  # the "simulated data" warning, once per scenario
    print(f"{'scenario':<8} {'gpus':>4} {'procs':>5} {'cpu ms/cycle':>13}")
    for name in SHIPPED:
        scenario = load_scenario(name)
        ms = bench(name, args.cycles)
        print(f"{name:<8} {len(scenario.gpus):>4} {len(scenario.processes):>5} {ms:>13.3f}")
    floor = floor_ms(512, args.cycles)
    large = bench("large", args.cycles)
    print(f"large again: {large:.3f} ms; constructing 512 ProcessSamples alone: {floor:.3f} ms "
          f"({floor / large:.0%} of the cycle)")


if __name__ == "__main__":
    main()
