"""Scheduling replay (issue 15): a lab's week through the launcher under its priority
policy and the two baselines, on the same simulated node, in one run.

Each policy is the same Engine and Scheduler with a different `policy.name`; the jobs are
VirtualExecutor runs of the committed trace (docs/REPLAY.md). Prints the table and the
ratios against both baselines, checks the issue's targets, writes the metrics to
bench/results/replay-week.json and the utilisation over the week per policy to
bench/results/replay-week-utilisation.png (matplotlib, from the `bench` extra; an SVG
drawn here when matplotlib is missing).

Run: .venv/bin/python bench/bench_replay.py [--trace bench/traces/lab-week.jsonl]
     .venv/bin/python bench/bench_replay.py --write-traces   (regenerate the fixtures)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

from gpu_audit.errors import EXIT_USAGE, ConfigError
from launcher.replay.generate import generate
from launcher.replay.metrics import ReplayMetrics
from launcher.replay.run import POLICIES, replay
from launcher.replay.trace import Trace, load_trace, write_trace

ROOT = Path(__file__).resolve().parent
TRACES = ROOT / "traces"
RESULTS = ROOT / "results"
Metrics = dict[str, ReplayMetrics]
TARGETS: dict[str, Callable[[Metrics], bool]] = {
    "utilisation >= 2x FIFO": lambda m: m["priority"].utilisation_window
    >= 2 * m["fifo-exclusive"].utilisation_window,
    "idle-held GPU-hours <= 1/2 of first-fit": lambda m: m["priority"].idle_held_gpu_hours
    <= 0.5 * m["first-fit"].idle_held_gpu_hours,
    "urgent p95 wait < 10 min": lambda m: _p95(m["priority"], "urgent") < 600,
    "preemption loss < 2 % of delivered": lambda m: m["priority"].preemption_loss_ratio < 0.02,
}


def _p95(m: ReplayMetrics, cls: str) -> float:
    w = m.wait.get(cls)
    return w.p95_s if w is not None else math.nan


def write_traces() -> None:
    write_trace(TRACES / "lab-week.jsonl", *generate(seed=7, days=7, name="lab-week"))
    write_trace(TRACES / "lab-day.jsonl", *generate(seed=7, days=1, name="lab-day"))
    print(f"wrote {TRACES / 'lab-week.jsonl'} and {TRACES / 'lab-day.jsonl'}")


def _fmt_wait(m: ReplayMetrics, cls: str) -> str:
    w = m.wait.get(cls)
    if w is None:
        return "-"
    return f"{w.mean_s / 60:.1f} / {w.p95_s / 60:.1f}"


def _waiter(cls: str) -> Callable[[ReplayMetrics], str]:
    return lambda m: _fmt_wait(m, cls)


def table(metrics: dict[str, ReplayMetrics]) -> str:
    rows: list[tuple[str, Callable[[ReplayMetrics], str]]] = [
        ("GPU utilisation, week window", lambda m: f"{m.utilisation_window:.1%}"),
        ("GPU utilisation, until the last job", lambda m: f"{m.utilisation_overall:.1%}"),
        ("busy GPU-hours", lambda m: f"{m.busy_gpu_hours:.0f}"),
        ("idle-held GPU-hours", lambda m: f"{m.idle_held_gpu_hours:.1f}"),
        ("delivered (held) GPU-hours", lambda m: f"{m.delivered_gpu_hours:.0f}"),
        ("lost to preemption, GPU-h", lambda m: f"{m.lost_preemption_gpu_hours:.2f} "
         f"({m.preemption_loss_ratio:.2%})"),
        ("lost to failures, GPU-h", lambda m: f"{m.lost_failure_gpu_hours:.2f}"),
        ("preemptions", lambda m: str(m.preemptions)),
        ("makespan, h", lambda m: f"{m.makespan_s / 3600:.1f}"),
        ("jobs finished / failed / unfinished",
         lambda m: f"{m.jobs_finished} / {m.jobs_failed} / {m.jobs_unfinished}"),
        *((f"wait {c}, mean / p95 min", _waiter(c)) for c in ("urgent", "high", "normal", "low")),
        ("fairness (Jain, 1 = fair)", lambda m: f"{m.fairness_jain:.3f}"),
        ("engine ticks", lambda m: str(m.ticks)),
    ]
    head = "| metric | " + " | ".join(POLICIES) + " |"
    lines = [head, "|---|" + "---:|" * len(POLICIES)]
    for name, fn in rows:
        lines.append(f"| {name} | " + " | ".join(fn(metrics[p]) for p in POLICIES) + " |")
    return "\n".join(lines)


def ratios(metrics: dict[str, ReplayMetrics]) -> str:
    p = metrics["priority"]
    out = ["| priority vs | utilisation (window) | idle-held GPU-h | urgent p95 wait "
           "| makespan |", "|---|---:|---:|---:|---:|"]
    for base in ("fifo-exclusive", "first-fit"):
        b = metrics[base]

        def r(x: float, y: float) -> str:
            return f"{x / y:.3g}x" if y and not math.isnan(x / y) else "-"

        out.append(f"| {base} | {r(p.utilisation_window, b.utilisation_window)} | "
                   f"{r(p.idle_held_gpu_hours, b.idle_held_gpu_hours)} | "
                   f"{r(_p95(p, 'urgent'), _p95(b, 'urgent'))} | "
                   f"{r(p.makespan_s, b.makespan_s)} |")
    return "\n".join(out)


def plot(metrics: dict[str, ReplayMetrics], path: Path, title: str) -> Path:
    """Hourly utilisation per policy; PNG through matplotlib, else an SVG drawn here."""
    try:
        import matplotlib as mpl

        mpl.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return _svg(metrics, path.with_suffix(".svg"), title)
    fig, ax = plt.subplots(figsize=(11, 4), dpi=110)
    for p in POLICIES:
        hourly = metrics[p].utilisation_hourly
        ax.plot([h / 24 for h in range(len(hourly))], [100 * u for u in hourly],
                label=f"{p} ({metrics[p].utilisation_window:.0%} over the week)",
                linewidth=1.2)
    window_days = metrics["priority"].window_s / 86400
    ax.axvline(window_days, color="grey", linestyle=":", linewidth=1)
    ax.set_xlabel("day (trace starts Monday 00:00)")
    ax.set_ylabel("GPU utilisation, % (hourly)")
    ax.set_ylim(0, 105)
    ax.set_title(title)
    ax.legend(loc="lower left", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def _svg(metrics: dict[str, ReplayMetrics], path: Path, title: str) -> Path:
    width, height, pad = 1000, 320, 40
    colours = ("#1f77b4", "#ff7f0e", "#2ca02c")
    hours = max(len(m.utilisation_hourly) for m in metrics.values())
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}">',
             f'<text x="{pad}" y="20" font-size="14">{title}</text>']
    for i, p in enumerate(POLICIES):
        pts = " ".join(
            f"{pad + (width - 2 * pad) * h / hours:.1f},"
            f"{height - pad - (height - 2 * pad) * u:.1f}"
            for h, u in enumerate(metrics[p].utilisation_hourly))
        parts.append(f'<polyline fill="none" stroke="{colours[i]}" points="{pts}"/>')
        parts.append(f'<text x="{pad + 250 * i}" y="{height - 10}" fill="{colours[i]}" '
                     f'font-size="12">{p}</text>')
    parts.append("</svg>")
    path.write_text("\n".join(parts), encoding="utf-8")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=TRACES / "lab-week.jsonl")
    ap.add_argument("--tick", type=float, default=60.0, help="engine tick, seconds")
    ap.add_argument("--write-traces", action="store_true")
    ap.add_argument("--out", default="replay-week", help="result file stem in bench/results")
    ap.add_argument("--notebooks-as-fraction", type=float, metavar="F",
                    help="what-if: submit every interactive job as this fraction of a GPU")
    args = ap.parse_args()
    if args.write_traces:
        write_traces()
        return 0
    try:
        trace = load_trace(args.trace)
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_USAGE
    if args.notebooks_as_fraction:
        trace = Trace(header=trace.header, jobs=tuple(
            j.model_copy(update={"gpu_fraction": args.notebooks_as_fraction})
            if j.interactive else j for j in trace.jobs))
        print(f"what-if: interactive jobs submitted as {args.notebooks_as_fraction:g} GPU")
    h = trace.header
    print(f"trace {args.trace.name}: {len(trace.jobs)} jobs, {h.gpus} x "
          f"{h.gpu_memory_bytes / 2**30:.0f} GiB GPUs, window {h.window_seconds / 86400:g} d, "
          f"demand {trace.demand_gpu_seconds() / 3600:.0f} GPU-h held "
          f"({trace.demand_gpu_seconds() / (h.gpus * h.window_seconds):.0%} of the window)")
    metrics: dict[str, ReplayMetrics] = {}
    walls: dict[str, float] = {}
    for p in POLICIES:
        run = replay(trace, p, tick_seconds=args.tick)
        metrics[p] = run.metrics
        walls[p] = run.wall_seconds
        print(f"  {p}: replayed in {run.wall_seconds:.1f} s wall ({run.metrics.ticks} ticks)")
    print()
    print(table(metrics))
    print()
    print(ratios(metrics))
    print()
    met = {}
    for name, check in TARGETS.items():
        met[name] = bool(check(metrics))
        print(f"  {'met   ' if met[name] else 'MISSED'} {name}")
    RESULTS.mkdir(exist_ok=True)
    out = {"trace": str(args.trace.relative_to(ROOT.parent)) if args.trace.is_absolute()
           and ROOT.parent in args.trace.parents else str(args.trace),
           "tick_seconds": args.tick, "targets": met,
           "wall_seconds": {p: round(w, 2) for p, w in walls.items()},
           "policies": {p: _clean(m.as_dict()) for p, m in metrics.items()}}
    (RESULTS / f"{args.out}.json").write_text(json.dumps(out, indent=1) + "\n",
                                             encoding="utf-8")
    img = plot(metrics, RESULTS / f"{args.out}-utilisation.png",
               f"{h.trace}: GPU utilisation per hour, {h.gpus} GPUs")
    print(f"\nwrote {RESULTS / (args.out + '.json')} and {img}")
    return 0


def _clean(d: object) -> object:
    """JSON without NaN (a wait class with no jobs)."""
    if isinstance(d, dict):
        return {k: _clean(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_clean(v) for v in d]
    if isinstance(d, float) and math.isnan(d):
        return None
    return d


if __name__ == "__main__":
    sys.exit(main())
