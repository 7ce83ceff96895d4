"""Scheduling replay: lab weeks through the launcher under its priority
policy and three baselines (first-fit, FIFO with whole GPUs, and people launching by
hand while at their desk), on the same simulated node, in one run.

Each policy is the same Engine and Scheduler with a different `policy.name` (the
hand-launched lab adds the presence gate); the jobs are VirtualExecutor runs of the
committed traces (docs/REPLAY.md). For each trace it prints the metrics table and the
targets in BENCHMARKS.md, and writes bench/results/replay-<trace>/ (report.md, metrics.json,
utilisation.svg) through the same code as `gpu-audit launcher replay --report`.

Run: .venv/bin/python bench/bench_replay.py                  (the two committed weeks)
     .venv/bin/python bench/bench_replay.py --trace my.jsonl  (any trace)
     .venv/bin/python bench/bench_replay.py --write-traces    (regenerate bench/traces/)
     .venv/bin/python bench/bench_replay.py --set policy.preempt_by=urgency --out urgency
                                                              (a what-if on the policy)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpu_audit.errors import EXIT_USAGE, ConfigError
from launcher.config import LauncherCoreConfig
from launcher.replay.generate import generate
from launcher.replay.generate_deadlines import generate_deadlines
from launcher.replay.generate_evening import generate_evening
from launcher.replay.metrics import ReplayMetrics
from launcher.replay.report import lift_ceilings, table, targets, targets_table, write_report
from launcher.replay.run import POLICIES, replay
from launcher.replay.trace import Trace, load_trace, write_trace

ROOT = Path(__file__).resolve().parent
TRACES = ROOT / "traces"
RESULTS = ROOT / "results"
WEEKS = (TRACES / "lab-week.jsonl", TRACES / "lab-evening-week.jsonl",
         TRACES / "lab-deadline-week.jsonl")


def write_traces() -> None:
    write_trace(TRACES / "lab-week.jsonl", *generate(seed=7, days=7, name="lab-week"))
    write_trace(TRACES / "lab-day.jsonl", *generate(seed=7, days=1, name="lab-day"))
    write_trace(TRACES / "lab-evening-week.jsonl",
                *generate_evening(seed=2024, days=7, name="lab-evening-week"))
    write_trace(TRACES / "lab-deadline-week.jsonl",
                *generate_deadlines(seed=2031, days=7, name="lab-deadline-week"))
    print(f"wrote lab-week, lab-day, lab-evening-week and lab-deadline-week in {TRACES}")


def core_config(settings: list[str]) -> LauncherCoreConfig:
    """The core configuration with `section.key=value` settings (YAML values)."""
    import yaml

    data: dict[str, dict[str, object]] = {}
    for item in settings:
        key, _, value = item.partition("=")
        section, _, name = key.partition(".")
        data.setdefault(section, {})[name] = yaml.safe_load(value)
    return LauncherCoreConfig.model_validate(data)


def run(path: Path, tick: float, notebooks_as: float | None,
        core: LauncherCoreConfig, suffix: str) -> int:
    try:
        trace = load_trace(path)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_USAGE
    name = trace.header.trace
    if notebooks_as:
        trace = Trace(header=trace.header, people=trace.people, jobs=tuple(
            j.model_copy(update={"gpu_fraction": notebooks_as}) if j.interactive else j
            for j in trace.jobs))
        name += f"-nb-{notebooks_as:g}"
        print(f"what-if: interactive jobs submitted as {notebooks_as:g} GPU")
    name += f"-{suffix}" if suffix else ""
    h = trace.header
    print(f"trace {path.name}: {len(trace.jobs)} jobs, {len(trace.people)} people, "
          f"{h.gpus} x {h.gpu_memory_bytes / 2**30:.0f} GiB GPUs, window "
          f"{h.window_seconds / 86400:g} d, time zone {h.timezone}")
    metrics: dict[str, ReplayMetrics] = {}
    walls: dict[str, float] = {}
    for p in POLICIES:
        r = replay(trace, p, config=core, tick_seconds=tick)
        metrics[p] = r.metrics
        walls[p] = round(r.wall_seconds, 2)
        print(f"  {p}: replayed in {r.wall_seconds:.1f} s wall ({r.metrics.ticks} ticks"
              + (f", {len(r.refused)} refused" if r.refused else "") + ")")
    lift_ceilings(metrics)
    print()
    print(table(metrics))
    print()
    print(targets_table(targets(metrics)))
    out = RESULTS / f"replay-{name}"
    write_report(out, metrics, title=f"{name}: GPU utilisation per hour, {h.gpus} GPUs",
                 extra={"trace": str(path.relative_to(ROOT.parent)) if path.is_absolute()
                        and ROOT.parent in path.parents else str(path),
                        "tick_seconds": tick, "wall_seconds": walls}, start=h.start)
    png = render_png(out / "utilisation.svg", out / "utilisation.png")
    print(f"\nwrote {out}/report.md, metrics.json, utilisation.svg"
          + (", utilisation.png" if png else " (no PNG: chromium not found)") + "\n")
    return 0


def render_png(svg: Path, png: Path) -> bool:
    """The report's figure as PNG, rendered by headless Chromium (the launcher itself
    draws SVG only, without any plotting library); False when Chromium is not here."""
    import re
    import shutil
    import subprocess

    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        return False
    m = re.search(r'width="(\d+)" height="(\d+)"', svg.read_text())
    size = f"{m.group(1)},{m.group(2)}" if m else "1100,900"
    subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu",
                    "--hide-scrollbars", f"--window-size={size}",
                    f"--screenshot={png}", svg.resolve().as_uri()],
                   check=True, capture_output=True, timeout=120)
    return png.exists()


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--trace", type=Path, action="append",
                    help="a trace to replay (repeat for several; default: the three weeks)")
    ap.add_argument("--tick", type=float, default=60.0, help="engine tick, seconds")
    ap.add_argument("--write-traces", action="store_true")
    ap.add_argument("--notebooks-as-fraction", type=float, metavar="F",
                    help="what-if: submit every interactive job as this fraction of a GPU")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                    help="what-if: a core setting, e.g. policy.preempt_by=urgency")
    ap.add_argument("--out", default="", help="suffix of the result directories")
    args = ap.parse_args()
    if args.write_traces:
        write_traces()
        return 0
    core = core_config(args.set)
    if args.set:
        print(f"what-if: {', '.join(args.set)}")
    code = 0
    for path in args.trace or WEEKS:
        code = max(code, run(path, args.tick, args.notebooks_as_fraction, core, args.out))
    return code


if __name__ == "__main__":
    sys.exit(main())
