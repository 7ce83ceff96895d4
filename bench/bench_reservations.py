"""Deadline reservations on the replay weeks: the priority policy with and without
`policy.deadline_reservations`, in the same run, on each week (the site's evening policy
on). For each: the deadline figures (met, and which jobs were missed), utilisation,
urgent p95 wait, and how often reservations acted: decisions that held one, deadline
jobs that got one, and jobs later in the order held back by one (the decisions'
reasons).

Run: .venv/bin/python bench/bench_reservations.py                     (the three weeks)
     .venv/bin/python bench/bench_reservations.py --set 'policy.evening_starts="15:00"'
Writes bench/results/reservations[-<out>].txt as printed.
"""

from __future__ import annotations

import argparse
import io
import sys
from collections.abc import Sequence
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

from launcher.config import LauncherCoreConfig
from launcher.replay.run import replay
from launcher.replay.trace import load_trace
from launcher.scheduler import Decision, Scheduler

ROOT = Path(__file__).resolve().parent
WEEKS = ("lab-week", "lab-evening-week", "lab-deadline-week")


class Counting(Scheduler):
    """The scheduler, counting what its reservations did (nothing else changes)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        self.decisions = self.with_reservation = 0
        self.reserved: set[int] = set()
        self.held: set[int] = set()

    def decide(self, *args: Any, **kwargs: Any) -> Decision:
        d = super().decide(*args, **kwargs)
        self.decisions += 1
        self.with_reservation += bool(d.reservations)
        self.reserved |= set(d.reservations)
        self.held |= {i for i, (_, detail) in d.waits.items()
                      if "reserved for deadline job" in detail}
        return d


def core_config(settings: Sequence[str]) -> LauncherCoreConfig:
    import yaml

    data: dict[str, dict[str, object]] = {"policy": {"evening_deadline": "09:00"}}
    for item in settings:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        data.setdefault(section, {})[name] = yaml.safe_load(value)
    return LauncherCoreConfig.model_validate(data)


def one(week: str, core: LauncherCoreConfig, reserve: bool) -> str:
    config = core.model_copy(update={"policy": core.policy.model_copy(
        update={"deadline_reservations": reserve})})
    import launcher.replay.run as run_module

    made: list[Counting] = []

    def counting(cfg: Any) -> Counting:
        s = Counting(cfg)
        made.append(s)
        return s

    real = run_module.Scheduler  # type: ignore[attr-defined]
    run_module.Scheduler = counting  # type: ignore[attr-defined]
    try:
        r = replay(load_trace(ROOT / "traces" / f"{week}.jsonl"), "priority", config=config)
    finally:
        run_module.Scheduler = real  # type: ignore[attr-defined]
    m, s = r.metrics, made[0]
    # met of all the jobs with a deadline (the jointly feasible ceiling needs every
    # policy's run: bench_replay.py), and the jointly feasible ones missed
    figs = "; ".join(
        f"{label} met {f.met} of {f.jobs}, missed {','.join(f.missed) or '-'}"
        for label, f in (("trainings", m.deadline_long), ("short", m.deadline_short),
                         ("overnight", m.overnight)) if f.jobs)
    urgent = m.wait.get("urgent")
    return (f"{week:<18} reservations {'on ' if reserve else 'off'}: utilisation "
            f"{100 * m.ceiling_share:.1f} % of ceiling, urgent p95 "
            f"{urgent.p95_s / 60 if urgent else float('nan'):.1f} min; {figs}; "
            f"decisions {s.decisions}, with a reservation {s.with_reservation}, "
            f"deadline jobs reserved for {len(s.reserved)}, jobs held back "
            f"{len(s.held)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    ap.add_argument("--week", action="append", choices=WEEKS)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    core = core_config(args.set)
    buf = io.StringIO()
    print(f"priority policy, evening_deadline 09:00{''.join(', ' + s for s in args.set)}",
          file=buf)
    for week in args.week or WEEKS:
        for reserve in (False, True):
            with redirect_stdout(io.StringIO()):
                line = one(week, core, reserve)
            print(line, file=buf)
            print(line, flush=True)
    out = ROOT / "results" / f"reservations{'-' + args.out if args.out else ''}.txt"
    out.write_text(buf.getvalue())
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
