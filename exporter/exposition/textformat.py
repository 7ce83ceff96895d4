"""Primitives of the Prometheus text exposition format 0.0.4: value formatting, escaping
and family headers.

Hand-rolled because the renderer runs once per sampling cycle over every GPU and
process, and building prometheus_client Metric objects for that costs several times
more (see bench/bench_scrape.py). Must never emit NaN or +/-Inf: a non-finite value is
"not measured" and the caller drops the sample.
"""

from __future__ import annotations

import math
import re

# Integral floats below this print as integers; above it a float's integer digits are
# noise, so the shortest round-trip repr (1.2e+16) is clearer.
_INT_LIMIT = 1e15


def fmt_value(value: float) -> str | None:
    """Text for a sample value, or None when the value is NaN/Inf (drop the sample)."""
    if isinstance(value, int):  # bool included: True -> "1"
        return str(int(value))
    if not math.isfinite(value):
        return None
    if value.is_integer() and -_INT_LIMIT < value < _INT_LIMIT:
        return str(int(value))
    return repr(float(value))


# Control characters other than the newline (escaped as \n): C0, DEL and C1. The text
# format would carry them, but a NUL or an ESC from a process name breaks dashboards and
# turns a terminal running `curl /metrics` into an escape-sequence target.
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f]")
REPLACEMENT = "\ufffd"


def escape_label_value(value: str) -> str:
    """Escape backslash, double quote and newline as the text format requires, and
    replace every other control character (C0, DEL, C1) with U+FFFD."""
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    if not value.isprintable():  # cheap test first: most values are printable
        value = _CONTROL.sub(REPLACEMENT, value)
    return value


def escape_help(text: str) -> str:
    """Escape backslash and newline in HELP text (quotes stay as they are)."""
    if "\\" in text or "\n" in text:
        text = text.replace("\\", "\\\\").replace("\n", "\\n")
    return text


def header(name: str, type_: str, help_: str) -> str:
    """The # HELP and # TYPE lines of one family."""
    return f"# HELP {name} {escape_help(help_)}\n# TYPE {name} {type_}\n"

