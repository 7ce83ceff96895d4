"""The process families' one-pass rendering (exporter.exposition.processes): a process
alone under its label set is written from its own sample, by the same rules as a sum
of several (NaN/Inf left out as not measured, ratios capped at 1, the formatter's
digits), and whole-percent ratios come from a table that is the formatter's own output."""

from __future__ import annotations

import dataclasses
import math

from exporter.exposition.processes import _RATIO_TEXT
from exporter.exposition.render import RenderOptions, render_snapshot
from exporter.exposition.textformat import fmt_value
from gpu_audit.model.attribution import AttributedProcess, Attribution
from gpu_audit.model.samples import ProcessSample
from tests.exporter.exposition.snapshots import UUID0, small_snapshot

FAMILIES = ("gpu_process_memory_used_bytes", "gpu_process_sm_utilization_ratio",
            "gpu_process_memory_utilization_ratio", "gpu_process_encoder_utilization_ratio",
            "gpu_process_decoder_utilization_ratio", "gpu_processes")


def _lines(procs: list[ProcessSample], owners: list[Attribution]) -> dict[str, list[str]]:
    snap = small_snapshot()
    aps = tuple(AttributedProcess(UUID0, p, a) for p, a in zip(procs, owners, strict=True))
    body = render_snapshot(dataclasses.replace(snap, processes={UUID0: aps}),
                           RenderOptions()).body.decode()
    out: dict[str, list[str]] = {f: [] for f in FAMILIES}
    for line in body.splitlines():
        name = line.split("{", 1)[0]
        if name in out:
            out[name].append(line.rsplit(" ", 1)[1])
    return out


def test_ratio_table_is_the_formatters_output() -> None:
    """Every whole percent below 1 in the table reads as fmt_value writes it."""
    assert len(_RATIO_TEXT) == 100
    for value, text in _RATIO_TEXT.items():
        assert value < 1.0 and text == fmt_value(value)


def test_a_process_alone_follows_the_summing_rules() -> None:
    """A lone process with NaN memory, an infinite and a NaN ratio, a ratio above 1 and
    a fraction gives exactly the lines its sum with an all-None twin of another identity
    would: the measured values only, capped at 1, count 1."""
    alone = ProcessSample(7, "train", None, "compute", math.nan, math.inf, math.nan, 1.5,
                          0.123456789)
    lines = _lines([alone], [Attribution(user="alice", sources={"user": "owner"})])
    assert lines == {
        "gpu_process_memory_used_bytes": [],
        "gpu_process_sm_utilization_ratio": [],
        "gpu_process_memory_utilization_ratio": [],
        "gpu_process_encoder_utilization_ratio": ["1"],
        "gpu_process_decoder_utilization_ratio": ["0.123456789"],
        "gpu_processes": ["1"],
    }
    # the same process summed with a second one of its identity that measured nothing
    twin = ProcessSample(8, "train", None, "compute", None)
    same_owner = Attribution(user="alice", sources={"user": "owner"})
    summed = _lines([alone, twin], [same_owner, same_owner])
    assert summed == {**lines, "gpu_processes": ["2"]}


def test_a_process_alone_writes_integer_and_float_memory_and_table_ratios() -> None:
    """Integer memory is written as is, float memory (a simulator's) as the formatter
    writes it; whole-percent ratios as their table text, 0 as "0"."""
    a = ProcessSample(7, "a", None, "compute", 1 << 40, 0.07, 0.0, 0.99, 1.0)
    b = ProcessSample(8, "b", None, "compute", 2.5e9, 0.5)
    lines = _lines([a, b], [Attribution(user="u1", sources={"user": "owner"}),
                            Attribution(user="u2", sources={"user": "owner"})])
    assert lines["gpu_process_memory_used_bytes"] == [str(1 << 40), "2500000000"]
    assert lines["gpu_process_sm_utilization_ratio"] == ["0.07", "0.5"]
    assert lines["gpu_process_memory_utilization_ratio"] == ["0"]
    assert lines["gpu_process_encoder_utilization_ratio"] == ["0.99"]
    assert lines["gpu_process_decoder_utilization_ratio"] == ["1"]
