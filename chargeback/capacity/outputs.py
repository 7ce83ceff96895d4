"""The capacity report's files: capacity.csv, capacity.json, summary.txt (one screen,
the finance sentence first), capacity.html with its charts inline, and each chart as
SVG and PNG (the PNG rendered from the SVG by headless Chromium when it is installed;
without it the report says the PNGs are missing rather than failing).

This module decides nothing about the numbers: it writes what `compute.build` made.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import math
import re
import shutil
import subprocess
import tempfile
import textwrap
from collections.abc import Sequence
from dataclasses import asdict
from html import escape
from pathlib import Path

from chargeback.capacity.compute import when
from chargeback.capacity.model import ALL, Capacity, ModelMonth
from chargeback.charts import BLUE, GREY, ORANGE, SKY, VERMILLION, Series, stacked_days
from gpu_audit.atomicfile import replace_file

COLUMNS = ("month", "gpu_model", "hours", "installed_gpus", "installed_gpu_hours",
           "down_gpu_hours", "allocated_gpu_hours", "busy_gpu_hours", "held_idle_gpu_hours",
           "free_gpu_hours", "allocated_gpus_mean", "allocated_gpus_p95",
           "allocated_gpus_p99", "hours_at_90pct_allocated", "allocated_pct",
           "allocated_pct_p95", "busy_pct", "held_idle_pct", "down_pct")
_FONT = 'font-family="system-ui, sans-serif"'


# the CSV columns of each figure a source may not know
_UNKNOWN_COLUMNS = {"busy": ("busy_gpu_hours", "busy_pct"),
                    "held_idle": ("held_idle_gpu_hours", "held_idle_pct"),
                    "down": ("down_gpu_hours", "down_pct")}


def _csv_row(r: ModelMonth, not_known: Sequence[str] = ()) -> list[str]:
    def f(v: float) -> str:
        return f"{v:.4f}".rstrip("0").rstrip(".") or "0"
    row = [r.month, r.model, f(r.hours), f(r.installed_gpus), f(r.installed_gpu_hours),
           f(r.down_gpu_hours), f(r.allocated_gpu_hours), f(r.busy_gpu_hours),
           f(r.held_idle_gpu_hours), f(r.free_gpu_hours), f(r.allocated_gpus_mean),
           f(r.allocated_gpus_p95), f(r.allocated_gpus_p99), f(r.hours_at_90pct),
           f(r.allocated_pct), f(r.allocated_pct_p95), f(r.busy_pct), f(r.held_idle_pct),
           f(r.down_pct)]
    blank = {c for k in not_known for c in _UNKNOWN_COLUMNS.get(k, ())}
    return ["" if c in blank else v for c, v in zip(COLUMNS, row, strict=True)]


def to_csv(cap: Capacity) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(COLUMNS)
    for r in cap.rows:
        w.writerow(_csv_row(r, cap.not_known))
    return buf.getvalue()


def to_json(cap: Capacity) -> dict[str, object]:
    out = asdict(cap)
    out["start"] = cap.start.isoformat()
    out["end"] = cap.end.isoformat()
    return out


def summary(cap: Capacity, *, width: int = 100) -> str:
    """One screen: the sentence, the period's figures per model, waits, forecast."""
    lines = [*textwrap.wrap(cap.sentence, width), ""]
    lines += textwrap.wrap(f"capacity {cap.start.isoformat()} .. {cap.end.isoformat()} "
                           f"from {cap.source}, {cap.bin_seconds / 3600:g}-hour bins; "
                           f"{cap.basis}", width)
    lines.append(f"{'GPU model':<28} {'GPUs':>7} {'alloc %':>8} {'p95 %':>6} "
                 f"{'busy %':>7} {'idle %':>7} {'down %':>7} {'h>=90%':>8} {'free GPU-h':>11}")
    for r in cap.rows:
        if r.month != "period":
            continue
        name = r.model if len(r.model) <= 28 else r.model[:27] + "\u2026"

        def pct(v: float, what: str) -> str:
            return "n/k" if what in cap.not_known else f"{v:.1f}"
        lines.append(f"{name:<28} {r.installed_gpus:>7,.1f} {r.allocated_pct:>8.1f} "
                     f"{r.allocated_pct_p95:>6.1f} {pct(r.busy_pct, 'busy'):>7} "
                     f"{pct(r.held_idle_pct, 'held_idle'):>7} {pct(r.down_pct, 'down'):>7} "
                     f"{r.hours_at_90pct:>8,.0f} {r.free_gpu_hours:>11,.0f}")
    w = cap.waits
    if w.known:
        lines += textwrap.wrap(
            f"waits ({', '.join(w.sources)}): {w.jobs} job(s), {w.never_started} still "
            f"waiting at the end; {w.queued_gpu_hours:,.1f} GPU-h queued, p50 "
            f"{w.p50_wait_h:.2f} h, p95 {w.p95_wait_h:.2f} h; {w.while_idle_gpu_hours:,.1f} "
            f"GPU-h ({100 * w.while_idle_share:.0f} %) while GPUs were held idle", width)
    else:
        lines += textwrap.wrap(w.note, width)
    lines += textwrap.wrap("forecast: " + cap.forecast.message, width)
    hours = cap.forecast.hour_effect
    if hours:
        top = max(range(24), key=lambda h: hours[h])
        low = min(range(24), key=lambda h: hours[h])
        lines.append(f"hour of day (UTC): allocation peaks at {top:02d}:00 "
                     f"({hours[top]:+,.1f} GPUs against the day's mean), lowest at "
                     f"{low:02d}:00 ({hours[low]:+,.1f})")
    for x in cap.whatif:
        lines.append(f"replay {x.name:<14} {x.gpus:>4} GPUs: p95 wait {x.p95_wait_h:.2f} h, "
                     f"deadline jobs met {x.deadline_met}/{x.deadline_jobs}")
    if cap.whatif_note:
        lines += textwrap.wrap("what-if: " + cap.whatif_note, width)
    for n in cap.notes:
        lines += textwrap.wrap("note: " + n, width)
    return "\n".join(lines) + "\n"


def _nice_max(value: float) -> float:
    """The axis top: 1, 2, 2.5, 5 or 10 times a power of ten, at least `value`."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(step * power for step in (1.0, 2.0, 2.5, 5.0, 10.0) if step * power >= value)


def _axis_y(v: float) -> str:
    return f"{v:,.0f}" if v >= 10 else (f"{v:.2f}".rstrip("0").rstrip(".") or "0")


def line_chart(title: str, xs: list[str], series: list[tuple[str, str, list[float]]],
               band: tuple[list[float], list[float]] | None = None, *, unit: str = "GPUs",
               width: int = 900, height: int = 260, split: int | None = None) -> str:
    """Lines over a shared x axis (labels xs); `band`: a shaded (low, high) interval;
    `split`: the index where data ends and the forecast begins (a dashed rule)."""
    left, right, top, bottom = 60, 12, 22, 46
    pw, ph = width - left - right, height - top - bottom
    vals = [v for _, _, ys in series for v in ys]
    if band is not None:
        vals += band[1]
    ymax = _nice_max(max(vals, default=1.0) * 1.02)
    n = max(len(xs), 2)

    def px(i: int) -> float:
        return left + pw * i / (n - 1)

    def py(v: float) -> float:
        return top + ph - ph * max(0.0, v) / ymax

    parts = [f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{escape(title)}" {_FONT} font-size="11">',
             f"<title>{escape(title)}</title>"]
    for k in range(5):
        v = ymax * k / 4
        y = py(v)
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{y:.1f}" y2="{y:.1f}" '
                     'stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="#444">'
                     f"{_axis_y(v)}</text>")
    parts.append(f'<text x="{left - 6}" y="12" text-anchor="end" fill="#444">{unit}</text>')
    if not xs:
        parts.append(f'<text x="{left + 8}" y="{top + ph // 2}" fill="#555">no data</text>')
    if band is not None and xs:
        lo, hi = band
        pts = [f"{px(i):.1f},{py(v):.1f}" for i, v in enumerate(hi)]
        pts += [f"{px(i):.1f},{py(v):.1f}" for i, v in reversed(list(enumerate(lo)))]
        parts.append(f'<polygon points="{" ".join(pts)}" fill="{SKY}" fill-opacity="0.3" '
                     'stroke="none"><title>90 % prediction interval</title></polygon>')
    if split is not None and 0 < split < len(xs):
        x = px(split)
        parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{top}" y2="{top + ph}" '
                     'stroke="#444" stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{x + 4:.1f}" y="{top + 10}" fill="#444">forecast</text>')
    for name, color, ys in series:
        line = " ".join(f"{px(i):.1f},{py(v):.1f}" for i, v in enumerate(ys))
        parts.append(f'<polyline class="line" points="{line}" fill="none" stroke="{color}" '
                     f'stroke-width="1.6"><title>{escape(name)}</title></polyline>')
    step = max(1, len(xs) // 8)
    short = bool(xs) and xs[0][:10] == xs[-1][:10]  # one day: the hours
    for i in range(0, len(xs), step):
        label = xs[i][11:16] if short else xs[i][:10]
        anchor = "end" if px(i) > width - right - 30 else "middle"
        parts.append(f'<text x="{px(i):.1f}" y="{top + ph + 14}" text-anchor="{anchor}" '
                     f'fill="#444">{escape(label)}</text>')
    lx = float(left)
    for name, color, _ in series:
        parts.append(f'<rect x="{lx:.1f}" y="{height - 16}" width="10" height="10" '
                     f'fill="{color}"/>')
        parts.append(f'<text x="{lx + 14:.1f}" y="{height - 7}">{escape(name)}</text>')
        lx += 24 + 6.5 * len(name)
    parts.append("</svg>")
    return "".join(parts)


def charts(cap: Capacity) -> dict[str, str]:
    """name -> SVG: GPU-hours per day by state; allocated GPUs per bin against
    installed; the forecast."""
    # mean GPUs in each state per day (per week on long periods): a partial week or a
    # day with missing bins is then not drawn as a drop in GPU-hours
    acc: dict[str, list[float]] = {}
    per = "day"
    for at, inst, down, alloc, busy, _idle in cap.series:
        key = at[:10]
        if (cap.end - cap.start).days > 62:
            day = dt.date.fromisoformat(key)
            key = (day - dt.timedelta(days=day.weekday())).isoformat()
            per = "week (from its Monday)"
        a = acc.setdefault(key, [0.0] * 5)
        a[0] += max(0.0, busy)
        a[1] += max(0.0, alloc - busy)
        a[2] += max(0.0, inst - down - alloc)
        a[3] += down
        a[4] += 1
    names = sorted(acc)
    out = {"states": stacked_days(
        f"Mean GPUs per {per}: busy, allocated but not busy, free, down", names,
        [Series("busy", BLUE), Series("allocated, not busy", ORANGE),
         Series("free", GREY), Series("down", VERMILLION)],
        [[acc[d][k] / acc[d][4] for d in names] for k in range(4)], "GPUs")}
    xs = [s[0] for s in cap.series]
    out["allocated"] = line_chart(
        f"Allocated GPUs per {cap.bin_seconds / 3600:g}-hour bin against installed", xs,
        [("installed", "#222222", [s[1] for s in cap.series]),
         ("allocated", ORANGE, [s[3] for s in cap.series]),
         ("busy", BLUE, [s[4] for s in cap.series])])
    fc = cap.forecast
    if fc.ok and fc.line:
        xs2 = [p[0] for p in fc.line]
        # the data as a trailing 7-day mean (the trend is a weekly level: one weekday
        # sampled every 7th day would sit above or below it)
        days_ = [d for d, _, _ in cap.daily]
        vals_ = [a for _, a, _ in cap.daily]
        week = {d: sum(vals_[max(0, i - 6):i + 1]) / len(vals_[max(0, i - 6):i + 1])
                for i, d in enumerate(days_)}
        last = days_[-1] if days_ else ""
        split = next((i for i, x in enumerate(xs2) if x > last), None)
        out["forecast"] = line_chart(
            "Allocated GPUs (7-day mean), the fitted trend and its 90 % interval", xs2,
            [("allocated, 7-day mean", ORANGE,
              [week.get(x, p[1]) if x <= last else p[1] for x, p in zip(xs2, fc.line,
                                                                        strict=True)]),
             ("trend", BLUE, [p[1] for p in fc.line]),
             ("installed", "#222222", [fc.capacity_gpus] * len(xs2))],
            band=([p[2] for p in fc.line], [p[3] for p in fc.line]), split=split)
    return out


def _gpu_h(value: float) -> str:
    """GPU-hours for a table cell: whole hours from 100 on, else one decimal."""
    return f"{value:,.0f}" if value >= 100 or value == 0 else f"{value:,.1f}"


def _table(cap: Capacity, period: bool) -> str:
    head = ("Month", "GPU model", "GPUs", "Installed GPU-h", "Down GPU-h", "Allocated GPU-h",
            "Busy GPU-h", "Held idle GPU-h", "Free GPU-h", "Allocated %", "p95 allocated GPUs",
            "p99 allocated GPUs", "Hours at \u2265 90 %")
    rows = []
    for r in cap.rows:
        if (r.month == "period") != period:
            continue
        strong = r.model == ALL
        def g(v: float, what: str = "") -> str:
            return "not known" if what in cap.not_known else _gpu_h(v)
        cells = (r.month, r.model, f"{r.installed_gpus:,.1f}", g(r.installed_gpu_hours),
                 g(r.down_gpu_hours, "down"), g(r.allocated_gpu_hours),
                 g(r.busy_gpu_hours, "busy"), g(r.held_idle_gpu_hours, "held_idle"),
                 g(r.free_gpu_hours), f"{r.allocated_pct:.1f}",
                 f"{r.allocated_gpus_p95:,.1f}", f"{r.allocated_gpus_p99:,.1f}",
                 f"{r.hours_at_90pct:,.0f}")
        tds = "".join(f"<td>{escape(c)}</td>" for c in cells)
        rows.append(f'<tr{" class=total" if strong else ""}>{tds}</tr>')
    ths = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f"<table><thead><tr>{ths}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def html(cap: Capacity, svgs: dict[str, str], pngs: list[str], png_why: str = "") -> str:
    w = cap.waits
    if w.known:
        waits = (f"<p>{w.jobs:,} job(s) waited ({', '.join(w.sources)}); still waiting at "
                 f"the period's end: {w.never_started:,} (their wait so far counts). "
                 f"Queued demand: <b>{w.queued_gpu_hours:,.1f} GPU-hours</b> "
                 f"(GPUs asked for \u00d7 time waited). Wait p50 {w.p50_wait_h:.2f} h, p95 "
                 f"<b>{w.p95_wait_h:.2f} h</b>. Of the queued GPU-hours, "
                 f"{w.while_idle_gpu_hours:,.1f} ({100 * w.while_idle_share:.0f} %) waited "
                 "while GPUs were held idle (per bin, the smaller of GPUs queued and GPUs "
                 "held idle).</p>")
    else:
        waits = f"<p>{escape(w.note)}</p>"
    whatif: str = ""
    if cap.whatif:
        trs = "".join(f"<tr><td>{escape(x.name)}</td><td>{x.gpus}</td>"
                      f"<td>{x.p95_wait_h:.2f}</td><td>{x.deadline_met}/{x.deadline_jobs}"
                      "</td></tr>" for x in cap.whatif)
        whatif = ("<table><thead><tr><th>Replay</th><th>GPUs</th><th>p95 wait (h)</th>"
                  f"<th>Deadline jobs met</th></tr></thead><tbody>{trs}</tbody></table>")
    whatif += f"<p class=note>{escape(cap.whatif_note)}</p>" if cap.whatif_note else ""
    notes = "".join(f"<li>{escape(n)}</li>" for n in cap.notes)
    figs = "".join(f'<figure>{svg}</figure>' for svg in svgs.values())
    png_note = ("PNG copies: " + ", ".join(escape(p) for p in pngs) if pngs else
                f"PNG copies not written ({escape(png_why)}); the charts are the chart-*.svg "
                "files")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>GPU capacity {when(cap.start, cap.end)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 24px; color: #111; max-width: 1200px; }}
.sentence {{ font-size: 18px; line-height: 1.45; border-left: 4px solid #0072B2;
  padding: 8px 14px; background: #f3f7fb; }}
table {{ border-collapse: collapse; font-size: 12px; margin: 8px 0; }}
th, td {{ border: 1px solid #ccc; padding: 3px 6px; text-align: right; }}
th:nth-child(-n+2), td:nth-child(-n+2) {{ text-align: left; }}
tr.total td {{ font-weight: 600; background: #fafafa; }}
td {{ white-space: nowrap; }}
.note {{ color: #444; font-size: 13px; }}
figure {{ margin: 10px 0; }}
</style></head><body>
<h1>GPU capacity: {when(cap.start, cap.end)}</h1>
<p class="sentence">{escape(cap.sentence)}</p>
<p class="note">Source: {escape(cap.source)}, {cap.bin_seconds / 3600:g}-hour bins.
{escape(cap.basis)}. Percentages are of installed GPU-hours (up + down).
Definitions: docs/CAPACITY.md.</p>
<h2>The period, per GPU model</h2>
{_table(cap, True)}
<h2>Per month and GPU model</h2>
{_table(cap, False)}
<h2>Charts</h2>
{figs}
<p class="note">{png_note}</p>
<h2>Demand that waited</h2>
{waits}
<h2>Trend and forecast</h2>
<p>{escape(cap.forecast.message[:1].upper() + cap.forecast.message[1:])}</p>
<h2>What-if (a replay, not a promise)</h2>
{whatif or "<p>No replay was run.</p>"}
{"<h2>Notes</h2><ul>" + notes + "</ul>" if notes else ""}
</body></html>
"""


def svg_to_png(svg: Path, png: Path) -> bool:
    """Render one SVG to PNG with headless Chromium; False when there is none or it
    fails (the caller says so)."""
    exe = next((shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")
                if shutil.which(n)), None)
    if exe is None:
        return False
    text = svg.read_text()
    m = re.search(r'width="(\d+)" height="(\d+)"', text)
    size = f"{m.group(1)},{m.group(2)}" if m else "900,300"
    with tempfile.TemporaryDirectory(prefix="capacity-chromium-") as profile:
        page = Path(profile) / "page.html"
        page.write_text("<!doctype html><html><body style='margin:0;background:#fff'>"
                        f"{text}</body></html>")
        try:
            subprocess.run([exe, "--headless", "--no-sandbox", "--disable-gpu",
                            "--hide-scrollbars", f"--user-data-dir={profile}/p",
                            "--host-resolver-rules=MAP * ~NOTFOUND",
                            f"--window-size={size}", f"--screenshot={png}", page.as_uri()],
                           check=True, capture_output=True, timeout=90)
        except (OSError, subprocess.SubprocessError):
            return False
    return png.is_file()


def write_outputs(cap: Capacity, out: Path, *, png: bool = True) -> list[str]:
    """Write every file into `out`; returns their names."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    replace_file(out / "capacity.csv", to_csv(cap).encode())
    replace_file(out / "capacity.json",
                 json.dumps(to_json(cap), indent=2, sort_keys=True).encode() + b"\n")
    replace_file(out / "summary.txt", summary(cap).encode())
    written += ["capacity.csv", "capacity.json", "summary.txt"]
    svgs = charts(cap)
    pngs: list[str] = []
    for name, svg in svgs.items():
        replace_file(out / f"chart-{name}.svg", svg.encode())
        written.append(f"chart-{name}.svg")
        if png and svg_to_png(out / f"chart-{name}.svg", out / f"chart-{name}.png"):
            pngs.append(f"chart-{name}.png")
    written += pngs
    why = ("--no-png" if not png else "no Chromium on this machine, or it failed"
           if len(pngs) < len(svgs) else "")
    replace_file(out / "capacity.html", html(cap, svgs, pngs, why).encode())
    written.append("capacity.html")
    return written
