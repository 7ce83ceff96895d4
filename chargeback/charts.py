"""Inline SVG charts for the chargeback report, drawn in Python.

Two shapes cover the report: horizontal bars (cost per department, user, project) and
stacked columns per day (fleet time, energy). The SVG is self-contained: no script, no
external font or stylesheet (a generic font family), colours that survive a black and
white printer's dithering (Okabe-Ito palette), and every text escaped, since labels are
user and project names from the audit trail. Each data mark is a `rect class="bar"` with
its value in `data-value`, so a test can find the marks in the rendered DOM.

This module never decides what to chart, only how.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

# Okabe-Ito: distinguishable with the common colour-vision deficiencies.
BLUE = "#0072B2"
ORANGE = "#E69F00"
GREEN = "#009E73"
VERMILLION = "#D55E00"
SKY = "#56B4E9"
GREY = "#999999"

_FONT = 'font-family="system-ui, sans-serif"'
LABEL_CHARS = 26


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    color: str


def _short(label: str, limit: int = LABEL_CHARS) -> str:
    return label if len(label) <= limit else label[: limit - 1] + "\u2026"


def _num(value: float) -> str:
    """A coordinate: two decimals at most, no trailing zeros (stable bytes)."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _nice_max(value: float) -> float:
    """The axis top: 1, 2, 2.5 or 5 times a power of ten, at least `value`."""
    if value <= 0:
        return 1.0
    power = 1.0
    while power * 10 <= value:
        power *= 10
    while power > value:
        power /= 10
    for step in (1.0, 2.0, 2.5, 5.0, 10.0):
        if step * power >= value:
            return step * power
    return 10 * power


def _fmt_axis(value: float) -> str:
    if value >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:,.1f}" if value >= 1 else f"{value:.2g}"


def hbars(title: str, items: Sequence[tuple[str, float, str]], *, color: str = BLUE,
          width: int = 620) -> str:
    """One bar per (label, value, value text), longest first as given."""
    row_h, label_w, value_w, top = 24, 190, 110, 8
    plot_w = width - label_w - value_w
    height = top * 2 + row_h * max(len(items), 1)
    top_value = max((value for _, value, _ in items), default=0.0)
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}" {_FONT} font-size="12">',
        f"<title>{escape(title)}</title>",
    ]
    if not items:
        parts.append(f'<text x="0" y="{top + 14}" fill="#555">no data</text>')
    for i, (label, value, text) in enumerate(items):
        y = top + i * row_h
        w = plot_w * value / top_value if top_value > 0 and value > 0 else 0.0
        parts.append(
            f'<text x="{label_w - 8}" y="{_num(y + 16)}" text-anchor="end">'
            f"<title>{escape(label)}</title>{escape(_short(label))}</text>"
        )
        parts.append(
            f'<rect class="bar" x="{label_w}" y="{_num(y + 4)}" width="{_num(w)}" '
            f'height="{row_h - 8}" fill="{color}" data-value="{_num(value)}">'
            f"<title>{escape(label)}: {escape(text)}</title></rect>"
        )
        parts.append(
            f'<text x="{_num(label_w + w + 6)}" y="{_num(y + 16)}">{escape(text)}</text>'
        )
    parts.append("</svg>")
    return "".join(parts)


def stacked_days(title: str, days: Sequence[str], series: Sequence[Series],
                 values: Sequence[Sequence[float]], unit: str, *,
                 width: int = 900, height: int = 230) -> str:
    """Columns per day, one stacked segment per series; values[i][d] for series i, day d."""
    left, right, top, bottom = 56, 10, 22, 44
    plot_w, plot_h = width - left - right, height - top - bottom
    totals = [sum(values[s][d] for s in range(len(series))) for d in range(len(days))]
    ymax = _nice_max(max(totals, default=0.0))
    parts = [
        f'<svg class="chart" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{escape(title)}" {_FONT} font-size="11">',
        f"<title>{escape(title)}</title>",
    ]
    for k in range(5):  # gridlines and the axis labels
        v = ymax * k / 4
        y = top + plot_h - plot_h * k / 4
        parts.append(f'<line x1="{left}" x2="{width - right}" y1="{_num(y)}" '
                     f'y2="{_num(y)}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{_num(y + 4)}" text-anchor="end" '
                     f'fill="#444">{escape(_fmt_axis(v))}</text>')
    parts.append(f'<text x="{left - 6}" y="12" text-anchor="end" fill="#444">'
                 f"{escape(unit)}</text>")
    if not days:
        parts.append(f'<text x="{left + 8}" y="{top + plot_h // 2}" fill="#555">'
                     "no per-day data</text>")
    slot = plot_w / max(len(days), 1)
    bar_w = max(slot * 0.78, 1.0)
    for d, day in enumerate(days):
        x = left + d * slot + (slot - bar_w) / 2
        y = top + plot_h
        for s, ser in enumerate(series):
            value = values[s][d]
            if value <= 0:
                continue
            h = plot_h * value / ymax
            y -= h
            parts.append(
                f'<rect class="bar" x="{_num(x)}" y="{_num(y)}" width="{_num(bar_w)}" '
                f'height="{_num(h)}" fill="{ser.color}" data-value="{_num(value)}">'
                f"<title>{escape(day)} {escape(ser.name)}: {value:,.1f} {escape(unit)}"
                "</title></rect>"
            )
        if len(days) <= 12 or d % max(len(days) // 10, 1) == 0 or d == len(days) - 1:
            parts.append(f'<text x="{_num(x + bar_w / 2)}" y="{top + plot_h + 14}" '
                         f'text-anchor="middle" fill="#444">{escape(day[5:])}</text>')
    lx: float = left
    for ser in series:  # the legend, under the axis
        parts.append(f'<rect x="{_num(lx)}" y="{height - 16}" width="10" height="10" '
                     f'fill="{ser.color}"/>')
        parts.append(f'<text x="{_num(lx + 14)}" y="{height - 7}">{escape(ser.name)}</text>')
        lx += 24 + 6.5 * len(ser.name)
    parts.append("</svg>")
    return "".join(parts)
