"""A replay's report: definitions first, the metrics table per policy, the targets the
launcher is held to, and a figure (utilisation per hour per policy, then a panel per
metric where policies differ), written to a directory as `report.md`, `metrics.json`
and `utilisation.svg`.

The figure is SVG drawn here (no plotting library: the command runs where only the
launcher is installed, and the file is the same on every machine). A target is
checked only when its policies were replayed; a missed one says by how much; a verdict
compares values as printed. It never reruns a replay or reads anything but metrics.
"""

from __future__ import annotations

import datetime as dt
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


FIGURES = ("deadline_long", "deadline_short", "overnight")


def lift_ceilings(metrics: Metrics) -> None:
    """The jointly feasible ceiling is an estimate (a greedy fluid test: it cannot
    split a 4-GPU job onto fewer GPUs, nor find every largest set); a policy that met
    more proves more were feasible, so each ceiling is raised to the most any replayed
    policy met, in place."""
    for key in FIGURES:
        best = max(getattr(m, key).met for m in metrics.values())
        for m in metrics.values():
            f: DeadlineFigure = getattr(m, key)
            f.jointly = max(f.jointly, best)


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
  otherwise empty node (fluid area test, earliest deadline first, raised to the most any
  replayed policy met: the test is an estimate); "alone" counts those that could each
  make it by themselves.
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
    lift_ceilings(metrics)
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
    lift_ceilings(metrics)
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


WEEKDAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
NIGHT = (17, 9)  # lab-local hours of the night shading, as in the night metrics


def _bars(parts: list[str], x0: float, y0: float, w: float,  # noqa: PLR0917 - a drawing helper
          h: float, title: str, rows: list[tuple[str, str, float, float | None]],
          unit_max: float, fmt: Callable[[float], str], bound: float | None = None,
          bound_label: str = "") -> None:
    """One horizontal bar panel: (policy, colour, value, ceiling or None) per row, the
    ceiling drawn as a dark tick, an optional target line."""
    parts.append(f'<text x="{x0}" y="{y0 - 8}" font-size="13" font-weight="bold">'
                 f'{escape(title)}</text>')
    row_h = h / max(1, len(rows))
    scale = (w - 190) / unit_max if unit_max > 0 else 0.0
    for i, (label, colour, value, ceil) in enumerate(rows):
        y = y0 + i * row_h
        parts.append(f'<text x="{x0}" y="{y + row_h * 0.62:.1f}">{escape(label)}</text>')
        bw = max(0.0, min(unit_max, value)) * scale if not math.isnan(value) else 0.0
        parts.append(f'<rect x="{x0 + 110}" y="{y + 3:.1f}" width="{bw:.1f}" '
                     f'height="{row_h - 6:.1f}" fill="{colour}"/>')
        text = fmt(value) if not math.isnan(value) else "-"
        end = bw  # the label goes past the ceiling tick when the bar reaches it
        if ceil is not None and not math.isnan(ceil) and ceil * scale - bw < 24:
            end = max(bw, min(unit_max, ceil) * scale)
        parts.append(f'<text x="{x0 + 114 + end:.1f}" y="{y + row_h * 0.62:.1f}" '
                     f'font-size="11">{escape(text)}</text>')
        if ceil is not None and not math.isnan(ceil):
            cx = x0 + 110 + min(unit_max, ceil) * scale
            parts.append(f'<line x1="{cx:.1f}" y1="{y + 1:.1f}" x2="{cx:.1f}" '
                         f'y2="{y + row_h - 1:.1f}" stroke="black" stroke-width="2.5"/>')
    if bound is not None:
        bx = x0 + 110 + min(unit_max, bound) * scale
        parts.append(f'<line x1="{bx:.1f}" y1="{y0 - 2}" x2="{bx:.1f}" y2="{y0 + h:.1f}" '
                     'stroke="#d62728" stroke-dasharray="5 3"/>')
        parts.append(f'<text x="{bx + 3:.1f}" y="{y0 + h + 12:.1f}" fill="#d62728" '
                     f'font-size="11">{escape(bound_label)}</text>')


def svg(metrics: Metrics, title: str, start: dt.date | None = None) -> str:
    """The report's figure: GPU utilisation per hour per policy (weekday names, nights
    shaded, the demand ceiling as a line, one small panel per policy so lines never
    hide each other), then a panel per metric where policies differ: deadline jobs met
    against the jointly feasible ceiling, overnight trainings, urgent p95 wait against
    its target. `start`: the trace's day 0 (its weekday names the days)."""
    lift_ceilings(metrics)
    policies = list(metrics)
    width, left, right = 1100, 112, 24
    strip = 70  # height of one policy's utilisation strip
    top = 48
    util_h = strip * len(policies)
    bars_top = top + util_h + 70
    panel_h = 24 * len(policies)
    height = bars_top + 3 * (panel_h + 56) + 20
    hours = max(len(m.utilisation_hourly) for m in metrics.values()) or 1
    any_m = next(iter(metrics.values()))
    window_h = any_m.window_s / 3600
    w = width - left - right
    day0 = start.weekday() if start is not None else None
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="12">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{left}" y="24" font-size="16" font-weight="bold">{escape(title)}'
             '</text>',
             f'<text x="{left}" y="40" font-size="11" fill="#555">GPU utilisation per hour '
             '(grey: night 17:00-09:00 lab time; dashed: the demand ceiling, the most the '
             'jobs allow on average over the window)</text>']
    for day in range(int(hours // 24) + 1):  # night shading and day names
        a = max(0.0, float(day * 24 - (24 - NIGHT[0])))
        b = min(float(hours), float(day * 24 + NIGHT[1]))
        if b > a:
            parts.append(f'<rect x="{left + w * a / hours:.1f}" y="{top}" '
                         f'width="{w * (b - a) / hours:.1f}" height="{util_h}" '
                         'fill="#eeeeee"/>')
        x = left + w * (day * 24 + 12) / hours
        if day * 24 < hours:
            name = WEEKDAYS[(day0 + day) % 7] if day0 is not None else f"day {day}"
            parts.append(f'<text x="{x:.1f}" y="{top + util_h + 16}" '
                         f'text-anchor="middle">{name}</text>')
    wx = left + w * window_h / hours
    parts.append(f'<line x1="{wx:.1f}" y1="{top}" x2="{wx:.1f}" y2="{top + util_h}" '
                 'stroke="#444" stroke-dasharray="2 2"/>')
    parts.append(f'<text x="{wx + 3:.1f}" y="{top + util_h + 30}" font-size="11">'
                 'end of the window</text>')
    for i, (policy, m) in enumerate(metrics.items()):
        colour = COLOURS[i % len(COLOURS)]
        y0 = top + i * strip
        parts.append(f'<line x1="{left}" y1="{y0 + strip:.1f}" x2="{left + w}" '
                     f'y2="{y0 + strip:.1f}" stroke="#bbb"/>')

        def xy(hour: float, u: float, y0: float = y0) -> str:
            return f"{left + w * hour / hours:.1f},{y0 + 6 + (strip - 10) * (1 - min(1.0, u)):.1f}"

        pts = " ".join(xy(k + 0.5, u) for k, u in enumerate(m.utilisation_hourly))
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.4" '
                     f'points="{pts}"/>')
        cy = y0 + 6 + (strip - 10) * (1 - m.demand_ceiling)
        parts.append(f'<line x1="{left}" y1="{cy:.1f}" x2="{wx:.1f}" y2="{cy:.1f}" '
                     'stroke="black" stroke-dasharray="6 3" stroke-width="1"/>')
        parts.append(f'<text x="{left - 6}" y="{y0 + 18}" text-anchor="end" '
                     f'fill="{colour}" font-weight="bold">{escape(policy[:16])}</text>')
        parts.append(f'<text x="{left - 6}" y="{y0 + 32}" text-anchor="end" '
                     f'font-size="10">{_pct(m.utilisation_window)}</text>')
        parts.append(f'<text x="{left - 6}" y="{y0 + 44}" text-anchor="end" '
                     f'font-size="10">of {_pct(m.demand_ceiling)}</text>')
    colours = {p: COLOURS[i % len(COLOURS)] for i, p in enumerate(policies)}
    pw = (width - left - right) / 2 - 10
    timed = any(m.deadline_long.jobs or m.deadline_short.jobs for m in metrics.values())
    key = "deadline_long" if timed else "overnight"
    label = ("Deadline trainings met (black tick: jointly feasible ceiling)" if timed
             else "Overnight trainings met (black tick: jointly feasible ceiling)")
    top_n = max(1, *(getattr(m, key).jobs for m in metrics.values()))
    _bars(parts, left, bars_top, pw, panel_h, label,
          [(p, colours[p], float(getattr(m, key).met), float(getattr(m, key).jointly))
           for p, m in metrics.items()], float(top_n), lambda v: f"{v:.0f}")
    second = "deadline_short" if timed else "overnight"
    second_label = ("Deadline short jobs met (black tick: ceiling)" if timed else
                    "Overnight trainings met, share of the ceiling")
    if timed:
        top_s = max(1, *(m.deadline_short.jobs for m in metrics.values()))
        _bars(parts, left + pw + 20, bars_top, pw, panel_h, second_label,
              [(p, colours[p], float(getattr(m, second).met),
                float(getattr(m, second).jointly)) for p, m in metrics.items()],
              float(top_s), lambda v: f"{v:.0f}")
    else:
        _bars(parts, left + pw + 20, bars_top, pw, panel_h, second_label,
              [(p, colours[p], m.overnight.share_of_joint, 1.0) for p, m in metrics.items()],
              1.0, _pct, 0.98, "target 98 %")
    y2 = bars_top + panel_h + 56
    waits = {p: p95(m) / 60 for p, m in metrics.items()}
    finite = [v for v in waits.values() if not math.isnan(v)]
    cap = max(20.0, min(max(finite, default=20.0), 240.0))
    _bars(parts, left, y2, pw, panel_h, f"Urgent p95 wait, minutes (axis cut at {cap:.0f})",
          [(p, colours[p], waits[p], None) for p in policies], cap,
          lambda v: f"{v:.1f} min", 10.0, "target 10 min")
    _bars(parts, left + pw + 20, y2, pw, panel_h, "Utilisation, share of the demand ceiling",
          [(p, colours[p], m.ceiling_share, 1.0) for p, m in metrics.items()], 1.0, _pct,
          0.99, "99 %")
    y3 = y2 + panel_h + 56
    if timed:
        _bars(parts, left, y3, pw, panel_h, "Overnight trainings met (black tick: ceiling)",
              [(p, colours[p], float(m.overnight.met), float(m.overnight.jointly))
               for p, m in metrics.items()],
              float(max(1, *(m.overnight.jobs for m in metrics.values()))),
              lambda v: f"{v:.0f}")
    else:
        _bars(parts, left, y3, pw, panel_h, "Night completion (jobs submitted 17:00-09:00)",
              [(p, colours[p], m.night_completion, 1.0) for p, m in metrics.items()], 1.0,
              _pct)
    _bars(parts, left + pw + 20, y3, pw, panel_h, "Idle-held GPU-hours (lower is better)",
          [(p, colours[p], m.idle_held_gpu_hours, None) for p, m in metrics.items()],
          max(1.0, *(m.idle_held_gpu_hours for m in metrics.values())),
          lambda v: f"{v:.0f} GPU-h")
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
                 extra: Mapping[str, Any] | None = None,
                 start: dt.date | None = None) -> list[Path]:
    """report.md, metrics.json and utilisation.svg in `directory` (made if missing);
    returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    lift_ceilings(metrics)
    checked = targets(metrics)
    md = "\n\n".join([f"# {title}", DEFINITIONS, "## Metrics", table(metrics), "## Targets",
                      targets_table(checked),
                      "![Utilisation per hour, deadline jobs met, urgent wait]"
                      "(utilisation.svg)"]) + "\n"
    doc = {**(extra or {}), "targets": checked,
           "policies": {p: m.as_dict() for p, m in metrics.items()}}
    out = [directory / "report.md", directory / "metrics.json", directory / "utilisation.svg"]
    replace_file(out[0], md.encode())
    replace_file(out[1], (json.dumps(clean(doc), indent=1) + "\n").encode())
    replace_file(out[2], svg(metrics, title, start).encode())
    return out
