"""Launcher scheduling decision latency with 1,000 queued jobs (target <= 50 ms).

One node of 8 simulated 80 GiB GPUs, 6 of them held by running jobs (whole and
fractional), 1,000 eligible queued jobs from 40 users and 10 projects (a quarter
fractional, urgencies mixed, every user with measured usage in the fair-share ledger),
and a waiting urgent job past the preemption threshold so the victim search runs too.
Measured in one process, interleaved so machine noise hits all alike:
  (a) Scheduler.decide, policy `priority` (priority + fair share + placement + victims);
  (b) the baselines on the same state: `first-fit` and `fifo-exclusive` (no priority);
  (c) a whole Engine.tick with the same queue in SQLite (:memory:), i.e. what the daemon
      does per round: read state, classify, schedule, store decisions.

    .venv/bin/python bench/bench_launcher_decide.py [--rounds 200] [--queued 1000] [--json P]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable

from launcher.config import LauncherCoreConfig, PolicyConfig
from launcher.engine import Engine
from launcher.gpustate import GIB, GpuInfo
from launcher.policy import FairShareLedger
from launcher.scheduler import Scheduler
from launcher.sim import SimBehaviour, SimExecutor
from launcher.sim.gpus import SimGpuSource
from launcher.spec import JobSpec
from launcher.store import JobRecord, Store

NOW = 1_700_000_000.0


def _spec(rng: random.Random, k: int) -> JobSpec:
    frac = rng.random() < 0.25
    return JobSpec.model_validate({
        "name": f"j{k}", "command": ["python", "train.py"],
        "urgency": rng.choice(["low", "normal", "normal", "high"]),
        "project": f"p{rng.randrange(10)}",
        **({"gpu_fraction": rng.choice([0.25, 0.5])} if frac else
           {"gpus": rng.choice([1, 1, 1, 2, 4, 8])})})


def state(queued_n: int, seed: int = 1) -> tuple[list[JobRecord], list[JobRecord],
                                                 list[GpuInfo], FairShareLedger]:
    rng = random.Random(seed)
    gpus = [GpuInfo(uuid=f"GPU-{i}", index=i, memory_total_bytes=80 * GIB,
                    temperature_c=40.0 + i) for i in range(8)]
    running = []
    for i in range(6):
        spec = JobSpec.model_validate({"name": f"r{i}", "command": "x", "urgency": "low",
                                       **({"gpu_fraction": 0.5} if i % 3 == 0 else {})})
        rec = JobRecord(id=100_000 + i, submission=i, spec=spec, uid=1, user=f"u{i}",
                        state="running", gpus=[f"GPU-{i}"], started_at=NOW - 3600 * (i + 1),
                        last_checkpoint_time=NOW - 60 * i, memory_bytes=40 * GIB,
                        submitted_at=NOW - 90_000)
        gpus[i].memory_used_bytes = 40 * GIB if spec.gpu_fraction else 70 * GIB
        running.append(rec)
    queued = []
    for k in range(queued_n):
        queued.append(JobRecord(id=k + 1, submission=k + 1, spec=_spec(rng, k), uid=1,
                                user=f"u{rng.randrange(40)}", state="queued",
                                submitted_at=NOW - rng.uniform(0, 86_400),
                                queued_at=NOW - rng.uniform(0, 3600)))
    urgent = JobSpec.model_validate({"name": "urgent", "command": "x", "urgency": "urgent",
                                     "gpus": 4})
    queued.append(JobRecord(id=queued_n + 1, submission=0, spec=urgent, uid=2, user="boss",
                            state="queued", submitted_at=NOW - 900, queued_at=NOW - 900))
    ledger = FairShareLedger(7 * 86400)
    for u in range(40):
        ledger.charge(NOW - rng.uniform(0, 86400), f"u{u}", f"p{u % 10}",
                      rng.uniform(0, 50 * 3600))
    return queued, running, gpus, ledger


def engine_with_queue(queued_n: int) -> tuple[Engine, list[float]]:
    clock = [NOW]
    sim = SimGpuSource(8, memory_total_bytes=80 * GIB)
    for i in range(8):  # every GPU busy with something outside the launcher: nothing starts
        sim.gpu(i).foreign_used_bytes = 79 * GIB
    ex = SimExecutor(sim, lambda: clock[0], lambda _i, _s: SimBehaviour())
    policy = PolicyConfig()
    eng = Engine(Store(":memory:"), Scheduler(policy), sim, ex, lambda: clock[0],
                 LauncherCoreConfig(policy=policy))
    rng = random.Random(2)
    for k in range(queued_n):
        eng.submit([_spec(rng, k)], uid=1000 + k % 40, user=f"u{k % 40}")
    eng.tick()
    return eng, clock


def timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000.0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--queued", type=int, default=1000)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    queued, running, gpus, ledger = state(args.queued)
    schedulers = {name: Scheduler(PolicyConfig(name=name, preempt_min_runtime_seconds=0))
                  for name in ("priority", "first-fit", "fifo-exclusive")}
    eng, clock = engine_with_queue(args.queued)
    samples: dict[str, list[float]] = {k: [] for k in (*schedulers, "engine.tick")}
    d = schedulers["priority"].decide(NOW, queued, running, gpus, ledger)
    assert d.preemptions, "the bench state must exercise the victim search"
    for _ in range(args.rounds):
        for name, s in schedulers.items():
            samples[name].append(timed(lambda s=s: s.decide(NOW, queued, running, gpus,  # type: ignore[misc]
                                                            ledger)))
        clock[0] += 30
        samples["engine.tick"].append(timed(eng.tick))
    rows = {}
    print(f"{args.queued} queued jobs, 8 GPUs, {args.rounds} rounds (ms per decision)")
    print(f"{'':28} {'median':>8} {'p95':>8} {'max':>8}")
    for name, xs in samples.items():
        xs.sort()
        row = {"median_ms": statistics.median(xs), "p95_ms": xs[int(0.95 * (len(xs) - 1))],
               "max_ms": xs[-1]}
        rows[name] = row
        label = name if name == "engine.tick" else f"decide[{name}]"
        print(f"{label:28} {row['median_ms']:8.2f} {row['p95_ms']:8.2f} {row['max_ms']:8.2f}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"queued": args.queued, "rounds": args.rounds, "results": rows}, f,
                      indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
