"""Exposition lines: families of sample lines, and what is kept of them between cycles.

`_Family` collects one family's lines; `LabelCache` keeps rendered label strings, line
starts and unchanged blocks of lines from one cycle to the next, so a cycle formats
values and little else (exporter.exposition.render, exporter.exposition.processes).

This module must never do I/O, read the clock, or emit NaN/Inf (fmt_value's rules).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from exporter.exposition import families as fam
from exporter.exposition.textformat import escape_label_value, fmt_value, header
from gpu_audit.model.fields import MetricDef

# family name -> its # HELP / # TYPE lines, for the families defined in code (the
# catalogue, families.py): a few dozen entries, one help text per name
_HEADERS: dict[str, str] = {}


class Family:
    """Samples of one family, emitted with its header only when non-empty."""

    __slots__ = ("_open", "head", "lines", "name")

    def __init__(self, name: str, type_: str, help_: str, head: str | None = None) -> None:
        """`head`: the family's # HELP / # TYPE lines when already known (see fixed())."""
        self.name = name
        self._open = name + "{"
        self.head = head if head is not None else header(name, type_, help_)
        self.lines: list[str] = []

    def add(self, labels: str, value: float | None) -> None:
        if value is None:
            return
        # The common cases inline (this runs once per series per cycle); fmt_value has
        # the same rules and handles everything else.
        if type(value) is float and value.is_integer() and -1e15 < value < 1e15:
            text: str | None = str(int(value))
        elif type(value) is int:
            text = str(value)
        else:
            text = fmt_value(value)
            if text is None:
                return
        if labels:
            self.lines.append(f"{self._open}{labels}}} {text}\n")
        else:
            self.lines.append(f"{self.name} {text}\n")


class LabelCache:
    """Rendered label strings and unchanged sample blocks kept from one cycle to the next.

    Identities and labelled fields are stable across cycles, so escaping and joining
    their label values again every cycle is wasted work; slow-tier fields (ECC, NVLink
    errors, retired pages) and the supported-fields view keep their values for many
    cycles, so their whole block of lines is reused while the values compare equal.
    Entries not used in a cycle are dropped at `rotate()`, so the cache never outgrows
    one exposition.
    """

    __slots__ = ("_blocks", "_new_blocks", "facts_last", "facts_now", "starts_last",
                 "starts_now", "texts_last", "texts_now")

    def __init__(self) -> None:
        # key -> rendered label string / line, this cycle's and the last: see get()
        self.texts_last: dict[tuple[object, ...], str] = {}
        self.texts_now: dict[tuple[object, ...], str] = {}
        # id(Attribution) -> what the process families worked out of it (their _Facts,
        # which holds the object, so its id stays its own), this cycle's and the last;
        # the resolver hands out the same Attribution for a process cycle after cycle
        self.facts_now: dict[int, Any] = {}
        self.facts_last: dict[int, Any] = {}
        # series identity -> the `name{labels} ` start of each of its lines, this cycle's
        # and the last: see starts(). Public for the one hot loop that inlines the lookup.
        self.starts_last: dict[tuple[object, ...], tuple[str, ...]] = {}
        self.starts_now: dict[tuple[object, ...], tuple[str, ...]] = {}
        self._blocks: dict[tuple[object, ...], tuple[object, list[str]]] = {}
        self._new_blocks: dict[tuple[object, ...], tuple[object, list[str]]] = {}

    def get(self, key: tuple[object, ...], build: Callable[[], str]) -> str:
        text = self.texts_now.get(key)
        if text is None:
            text = self.texts_last.get(key)
            if text is None:
                text = build()
            self.texts_now[key] = text
        return text

    def starts(self, key: tuple[object, ...]) -> tuple[str, ...] | None:
        """The cached `name{labels} ` starts of a series' lines (kept for the next cycle),
        or None: then build them and `keep_starts`. Only values are formatted each cycle."""
        hit = self.starts_now.get(key)
        if hit is None:
            hit = self.starts_last.get(key)
            if hit is not None:
                self.starts_now[key] = hit
        return hit

    def keep_starts(self, key: tuple[object, ...], starts: tuple[str, ...]) -> tuple[str, ...]:
        self.starts_now[key] = starts
        return starts

    def block(self, key: tuple[object, ...], values: object) -> list[str] | None:
        """The lines rendered last cycle for `key`, when its values are unchanged."""
        hit = self._blocks.get(key)
        if hit is not None and hit[0] == values:
            self._new_blocks[key] = hit
            return hit[1]
        return None

    def keep_block(self, key: tuple[object, ...], values: object, lines: list[str]) -> None:
        self._new_blocks[key] = (values, lines)

    def rotate(self) -> None:
        self.texts_last, self.texts_now = self.texts_now, {}
        self._blocks, self._new_blocks = self._new_blocks, {}
        self.starts_last, self.starts_now = self.starts_now, {}
        self.facts_last, self.facts_now = self.facts_now, {}


def fixed(f: fam.FamilyDef | MetricDef) -> Family:
    """An empty family of a definition fixed in code (families.py, the catalogue), its
    header escaped once per process rather than once per cycle."""
    head = _HEADERS.get(f.name)
    if head is None:
        head = _HEADERS[f.name] = header(f.name, f.type, f.full_help)
    return Family(f.name, f.type, "", head)


def label_value(value: str) -> str:
    return escape_label_value(value)


def join_labels(prefix: str, names: tuple[str, ...], values: tuple[str, ...]) -> str:
    return prefix + "".join(f',{n}="{label_value(v)}"' for n, v in zip(names, values, strict=True))


def num(v: float) -> str:
    """A finite sample value as fmt_value writes it. Only for values finite by
    construction: the process families drop NaN/Inf, and sums of finite byte counts and
    ratios stay finite."""
    if type(v) is int:
        return str(v)
    if v.is_integer() and -1e15 < v < 1e15:
        return str(int(v))
    return repr(float(v))
