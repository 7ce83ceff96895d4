"""A six-month capacity report built from generated hourly bins (no source read): a
64-GPU H100 pool whose allocated demand grows ~0.1 GPU a day with a weekday and an
hour-of-day pattern, a 16-GPU A100 pool, a GPU down for a week, queue waits, and the
what-if rows a replay would give. For the HTML test and the docs/img screenshot; every
number in it comes from compute.build, as in a real run.

    .venv/bin/python -m tests.capacity.sample OUT_DIR   # writes the report there
"""

from __future__ import annotations

import datetime as dt
import random
import sys
from pathlib import Path

from chargeback.capacity.compute import build
from chargeback.capacity.model import Bin, Capacity, Figures, Wait, WhatIf
from chargeback.capacity.outputs import write_outputs

START = dt.datetime(2026, 6, 1, tzinfo=dt.UTC)
END = dt.datetime(2026, 12, 1, tzinfo=dt.UTC)
H100, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"


def _pool(rng: random.Random, gpus: int, level: float, down: float) -> Figures:
    up = gpus - down
    alloc = max(0.0, min(up, rng.gauss(level * up, 0.05 * gpus)))
    busy = alloc * rng.uniform(0.55, 0.75)
    idle = min(alloc - busy, alloc * rng.uniform(0.08, 0.2))
    return Figures(installed=gpus * 3600.0, down=down * 3600.0, allocated=alloc * 3600.0,
                   busy=busy * 3600.0, held_idle=idle * 3600.0)


def sample(seed: int = 3) -> Capacity:
    rng = random.Random(seed)
    bins: list[Bin] = []
    waits: list[Wait] = []
    t = START
    k = 0
    while t < END:
        day = (t - START).days
        weekday = 0.08 if t.weekday() < 5 else -0.12
        hour = 0.06 if 9 <= t.hour < 19 else -0.04
        level = 0.62 + 0.0016 * day + weekday + hour
        down = 1.0 if 40 <= day < 47 else 0.0
        bins.append(Bin(t, 3600.0, {H100: _pool(rng, 64, level, down),
                                    A100: _pool(rng, 16, level - 0.2, 0.0)}))
        if level > 0.78 and rng.random() < 0.5:
            q = t.timestamp() + rng.uniform(0, 3600)
            waits.append(Wait("launcher", f"j{k}", float(rng.choice((1, 1, 2, 4, 8))), q,
                              q + rng.expovariate(1 / (3 * 3600))))
            k += 1
        t += dt.timedelta(hours=1)
    whatif = [WhatIf("baseline", 64, 5.2, 40, 31), WhatIf("idle reclaim", 64, 1.9, 40, 37),
              WhatIf("+8 GPUs", 72, 0.7, 40, 39)]
    return build(START, END, "archive", 3600.0, bins,
                 "allocated: GPU time a job's process held the GPU", waits, ["launcher"],
                 183, whatif,
                 "SAMPLE: these what-if rows are made up for the picture; a real run "
                 "replays the queue through the launcher's engine", [])


if __name__ == "__main__":
    write_outputs(sample(), Path(sys.argv[1]))
