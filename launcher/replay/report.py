"""A replay's report: the metrics table per policy, the targets the launcher is held to
(issue 24), and a plot of GPU utilisation per hour, written to a directory as
`report.md`, `metrics.json` and `utilisation.svg`.

The plot is SVG drawn here (no plotting library: the command runs where only the
launcher is installed, and the file is the same on every machine). A target is
checked only when its policies were replayed; a missed one says by how much.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

from gpu_audit.atomicfile import replace_file
from launcher.replay.metrics import DeadlineFigure, ReplayMetrics

Metrics = Mapping[str, ReplayMetrics]
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#7f7f7f", "#9467bd", "#8c564b")


def p95(m: ReplayMetrics, level: str = "urgent") -> float:
    w = m.wait.get(level)
    return w.p95_s if w is not None else math.nan


@dataclass(frozen=True)
class Target:
    """One claim: `value` of the priority policy against `bound` (from the metrics),
    met when `ok`."""

    name: str
    needs: tuple[str, ...]
    value: Callable[[Metrics], float]
    bound: Callable[[Metrics], float]
    higher_is_better: bool
    fmt: Callable[[float], str]

    def check(self, m: Metrics) -> tuple[bool, float, float] | None:
        if any(p not in m for p in self.needs):
            return None
        v, b = self.value(m), self.bound(m)
        if math.isnan(v) or math.isnan(b):
            return None
        strict = not self.higher_is_better and "<=" not in self.name  # "< 10 min"
        return verdict(v, b, self.higher_is_better, self.fmt, strict), v, b


def verdict(v: float, b: float, higher_is_better: bool, fmt: Callable[[float], str],
            strict: bool = False) -> bool:
    """Met or not, as a reader of the printed figures would judge: two values that
    print the same are equal (no "57.5 % vs 57.5 %: missed"). `strict` (a `<` bound):
    equal in print is not under it."""
    if fmt(v) == fmt(b):
        return not strict
    return v >= b if higher_is_better else v < b


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _min(x: float) -> str:
    return f"{x / 60:.1f} min"


def _gpuh(x: float) -> str:
    return f"{x:.1f} GPU-h"


def _x(x: float) -> str:
    return f"{x:.2f}x"


TARGETS: tuple[Target, ...] = (
    Target("utilisation >= 2.5x hand-launched", ("priority", "hand-launched"),
           lambda m: m["priority"].utilisation_window / m["hand-launched"].utilisation_window
           if m["hand-launched"].utilisation_window else math.nan,
           lambda m: 2.5, True, _x),
    Target("utilisation >= 97 % of the demand ceiling", ("priority",),
           lambda m: m["priority"].ceiling_share, lambda m: 0.97, True, _pct),
    Target("night completion >= 98 %", ("priority",),
           lambda m: m["priority"].night_completion, lambda m: 0.98, True, _pct),
    Target("deadline trainings met >= 98 % of the jointly feasible", ("priority",),
           lambda m: m["priority"].deadline_long.share_of_joint, lambda m: 0.98, True, _pct),
    Target("deadline short jobs met >= 98 % of the jointly feasible", ("priority",),
           lambda m: m["priority"].deadline_short.share_of_joint, lambda m: 0.98, True,
           _pct),
    Target("overnight trainings met >= 98 % of the jointly feasible", ("priority",),
           lambda m: m["priority"].overnight.share_of_joint, lambda m: 0.98, True, _pct),
    Target("urgent p95 wait < 10 min", ("priority",),
           lambda m: p95(m["priority"]), lambda m: 600.0, False, _min),
    Target("idle-held GPU-hours <= 0.5x first-fit's", ("priority", "first-fit"),
           lambda m: m["priority"].idle_held_gpu_hours,
           lambda m: 0.5 * m["first-fit"].idle_held_gpu_hours + 1e-9, False, _gpuh),
    Target("preemption loss < 2 % of delivered", ("priority",),
           lambda m: m["priority"].preemption_loss_ratio, lambda m: 0.02, False, _pct),
)

# the metrics the priority policy must be at least as good as the baselines on
COMPARED: tuple[tuple[str, Callable[[ReplayMetrics], float], bool, Callable[[float], str]],
                ...] = (
    ("utilisation", lambda m: m.utilisation_window, True, _pct),
    ("share of the demand ceiling", lambda m: m.ceiling_share, True, _pct),
    ("night completion", lambda m: m.night_completion, True, _pct),
    ("deadline trainings met", lambda m: m.deadline_long.share_of_joint, True, _pct),
    ("deadline short jobs met", lambda m: m.deadline_short.share_of_joint, True, _pct),
    ("overnight trainings met", lambda m: m.overnight.share_of_joint, True, _pct),
    ("urgent p95 wait", p95, False, _min),
    ("idle-held GPU-hours", lambda m: m.idle_held_gpu_hours, False, _gpuh),
    ("preemption loss", lambda m: m.preemption_loss_ratio, False, _pct),
)


def _wait(m: ReplayMetrics, level: str) -> str:
    w = m.wait.get(level)
    return "-" if w is None else f"{w.mean_s / 60:.1f} / {w.p95_s / 60:.1f}"


def _figure(f: DeadlineFigure) -> str:
    if not f.jobs:
        return "-"
    return f"{f.met} / {f.jointly} = {_pct(f.share_of_joint)} ({f.alone}, {f.jobs})"


DEFINITIONS = """\
## Definitions (docs/REPLAY.md, "Metrics")

- **deadline jobs met**: jobs with a deadline (their own, or the site's evening default)
  that finished by it; *trainings* run an hour or more, *short jobs* less (kept apart: a
  10-minute debug run is not a night's training). Read against the **jointly feasible
  ceiling**: the most of them that could ALL meet their deadlines together on an
  otherwise empty node (fluid area test, earliest deadline first); "alone" counts those
  that could each make it by themselves.
- **overnight trainings**: trainings (>= 1 h) submitted 15:00-09:00 in the owner's time,
  any day of the week, due the next 09:00, whatever deadline they had.
- **night completion** (kept for comparison with earlier reports): jobs submitted
  17:00-09:00 that could each end by 09:00 alone, share that did.
- **utilisation / demand ceiling**: busy GPU-time in the window against the most the
  jobs allow at best (fluid bound).
- **urgent p95 wait**: 95th percentile of first start - arrival of urgent jobs.
- A verdict compares the figures as printed: values that print the same are equal.
"""


def table(metrics: Metrics) -> str:
    """The metrics per policy, as a Markdown table."""
    policies = list(metrics)
    any_m = next(iter(metrics.values()))
    levels = [lvl for lvl in ("urgent", "high", "normal", "low") if lvl in any_m.wait] + \
        sorted(set(any_m.wait) - {"urgent", "high", "normal", "low"})
    rows: list[tuple[str, Callable[[ReplayMetrics], str]]] = [
        ("GPU utilisation, window", lambda m: _pct(m.utilisation_window)),
        ("demand ceiling (any policy at best)", lambda m: _pct(m.demand_ceiling)),
        ("utilisation / demand ceiling", lambda m: _pct(m.ceiling_share)),
        ("GPU utilisation, until the last job", lambda m: _pct(m.utilisation_overall)),
        ("deadline trainings met / jointly feasible (alone, all)",
         lambda m: _figure(m.deadline_long)),
        ("deadline short jobs met / jointly feasible (alone, all)",
         lambda m: _figure(m.deadline_short)),
        ("overnight trainings met / jointly feasible (alone, all)",
         lambda m: _figure(m.overnight)),
        ("night completion (could / did)", lambda m: (
            f"{_pct(m.night_completion)} ({m.night_could} / {m.night_did})"
            if m.night_could else "-")),
        ("idle-held GPU-hours", lambda m: f"{m.idle_held_gpu_hours:.1f}"),
        ("busy / delivered GPU-hours", lambda m: f"{m.busy_gpu_hours:.0f} / "
         f"{m.delivered_gpu_hours:.0f}"),
        ("lost to preemption, GPU-h", lambda m: f"{m.lost_preemption_gpu_hours:.2f} "
         f"({_pct(m.preemption_loss_ratio)})"),
        ("lost to failures, GPU-h", lambda m: f"{m.lost_failure_gpu_hours:.2f}"),
        ("preemptions", lambda m: str(m.preemptions)),
        ("makespan, h", lambda m: f"{m.makespan_s / 3600:.1f}"),
        ("jobs finished / failed / unfinished",
         lambda m: f"{m.jobs_finished} / {m.jobs_failed} / {m.jobs_unfinished}"),
        *((f"wait {lvl}, mean / p95 min", (lambda m, lvl=lvl: _wait(m, lvl)))
          for lvl in levels),
        ("fairness (Jain over users' GPU-h / fair share)", lambda m: f"{m.fairness_jain:.3f}"),
        ("engine ticks", lambda m: str(m.ticks)),
    ]
    lines = ["| metric | " + " | ".join(policies) + " |",
             "|---|" + "---:|" * len(policies)]
    lines += [f"| {name} | " + " | ".join(fn(metrics[p]) for p in policies) + " |"
              for name, fn in rows]
    return "\n".join(lines)


def targets(metrics: Metrics) -> list[dict[str, Any]]:
    """Each target that could be checked: met or not, the value, the bound, and the
    priority policy against the baselines on every compared metric."""
    out: list[dict[str, Any]] = []
    for t in TARGETS:
        got = t.check(metrics)
        if got is None:
            continue
        ok, v, b = got
        out.append({"target": t.name, "met": ok, "value": t.fmt(v), "bound": t.fmt(b),
                    "by": None if ok else t.fmt(abs(v - b))})
    if "priority" not in metrics:
        return out
    pri = metrics["priority"]
    for base in ("first-fit", "fifo-exclusive"):
        if base not in metrics:
            continue
        worse = []
        for name, fn, higher, fmt in COMPARED:
            a, b = fn(pri), fn(metrics[base])
            if math.isnan(a) or math.isnan(b):
                continue
            if fmt(a) != fmt(b) and ((a < b) if higher else (a > b)):
                worse.append(f"{name} {fmt(a)} vs {fmt(b)}")
        out.append({"target": f"priority at least as good as {base} on every one",
                    "met": not worse, "value": "; ".join(worse) or "yes",
                    "bound": "", "by": "; ".join(worse) or None})
    return out


def targets_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| target | priority | met |", "|---|---|---|"]
    for row in rows:
        value = row["value"] if not row["bound"] else f"{row['value']} (bound {row['bound']})"
        lines.append(f"| {row['target']} | {value} | "
                     f"{'met' if row['met'] else '**missed**'} |")
    return "\n".join(lines)


def svg(metrics: Metrics, title: str) -> str:
    """Hourly GPU utilisation per policy, with the window's end marked."""
    width, height, left, right, top, bottom = 1000, 360, 56, 16, 36, 64
    hours = max(len(m.utilisation_hourly) for m in metrics.values()) or 1
    window_h = next(iter(metrics.values())).window_s / 3600
    w, h = width - left - right, height - top - bottom

    def xy(hour: float, u: float) -> str:
        return f"{left + w * hour / hours:.1f},{top + h * (1 - min(1.0, u)):.1f}"

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="22" font-size="14">{escape(title)}</text>']
    for pct in (0, 25, 50, 75, 100):
        y = top + h * (1 - pct / 100)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + w}" y2="{y:.1f}" '
                     'stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{pct} %</text>')
    for day in range(int(hours // 24) + 1):
        x = left + w * day * 24 / hours
        parts.append(f'<text x="{x:.1f}" y="{top + h + 16}" text-anchor="middle">d{day}'
                     '</text>')
    wx = left + w * window_h / hours
    parts.append(f'<line x1="{wx:.1f}" y1="{top}" x2="{wx:.1f}" y2="{top + h}" '
                 'stroke="#444" stroke-dasharray="4 3"/>')
    for i, (policy, m) in enumerate(metrics.items()):
        colour = COLOURS[i % len(COLOURS)]
        pts = " ".join(xy(k + 0.5, u) for k, u in enumerate(m.utilisation_hourly))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.3" '
                     f'points="{pts}"/>')
        parts.append(f'<text x="{left + 230 * i}" y="{height - 14}" fill="{colour}">'
                     f'{escape(policy)}: {_pct(m.utilisation_window)} of the window</text>')
    parts.append(f'<text x="{left + w / 2:.0f}" y="{top + h + 32}" text-anchor="middle">'
                 'day of the trace (dashed: end of its window); GPU utilisation per hour'
                 '</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def clean(d: object) -> object:
    """JSON without NaN (a wait class with no jobs, no night jobs)."""
    if isinstance(d, dict):
        return {k: clean(v) for k, v in d.items()}
    if isinstance(d, list):
        return [clean(v) for v in d]
    if isinstance(d, float) and math.isnan(d):
        return None
    return d


def write_report(directory: Path, metrics: Metrics, *, title: str,
                 extra: Mapping[str, Any] | None = None) -> list[Path]:
    """report.md, metrics.json and utilisation.svg in `directory` (made if missing);
    returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    checked = targets(metrics)
    md = "\n\n".join([f"# {title}", DEFINITIONS, "## Metrics", table(metrics), "## Targets",
                      targets_table(checked),
                      "![GPU utilisation per hour](utilisation.svg)"]) + "\n"
    doc = {**(extra or {}), "targets": checked,
           "policies": {p: m.as_dict() for p, m in metrics.items()}}
    out = [directory / "report.md", directory / "metrics.json", directory / "utilisation.svg"]
    replace_file(out[0], md.encode())
    replace_file(out[1], (json.dumps(clean(doc), indent=1) + "\n").encode())
    replace_file(out[2], svg(metrics, title).encode())
    return out
