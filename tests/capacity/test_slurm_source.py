"""`--source slurm`'s figures from sacct and `scontrol show node` output as the real
tools print it (recorded from the test cluster of tests/slurm, Slurm 22.05), through the
runner seam chargeback's read_sacct tests use; tests/slurm/test_capacity.py runs it
against the real daemons."""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from chargeback.capacity.compute import build, sentence
from chargeback.capacity.outputs import to_csv
from chargeback.capacity.slurm import NOT_KNOWN, node_gpus, parse_nodes
from chargeback.sources.slurm import SacctError
from gpu_audit_app.capacity.main import read_slurm

START = dt.datetime(2026, 11, 3, tzinfo=dt.UTC)
END = START + dt.timedelta(hours=3)
HERE = Path(__file__).parent / "slurm"


def _local(hours: float) -> str:
    return (START + dt.timedelta(hours=hours)).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


Runner = Callable[[str, Sequence[str]], str]


def _runner(nodes: str, sacct: str) -> tuple[list[tuple[str, Sequence[str]]], Runner]:
    calls: list[tuple[str, Sequence[str]]] = []

    def run(name: str, args: Sequence[str]) -> str:
        calls.append((name, args))
        return {"scontrol": nodes, "sacct": sacct}[name]

    return calls, run


def _nodes() -> str:
    return (HERE / "scontrol-show-node.txt").read_text()


def test_gres_strings() -> None:
    assert node_gpus("gpu:2") == (2, "")
    assert node_gpus("gpu:a100:4(S:0-1)") == (4, "a100")
    assert node_gpus("gpu:a100:2,gpu:v100:1,shard:8") == (3, "a100")
    assert node_gpus("(null)") == (0, "")


def test_nodes_as_scontrol_prints_them() -> None:
    nodes = parse_nodes(_nodes())
    assert [(n.name, n.gpus, n.down) for n in nodes] == [("n1", 2, False), ("n2", 2, True)]


def test_allocation_per_bin_and_what_is_not_known() -> None:
    sacct = "\n".join([
        # 2 GPUs from 00:30 to 02:00; 1 GPU from 01:00, still running (End Unknown)
        f"11|alice|physics|low|billing=2,cpu=2,gres/gpu=2,mem=1G,node=1|{_local(0.5)}|"
        f"{_local(2)}|COMPLETED|n1",
        f"12|bob|vision|low|billing=1,cpu=1,gres/gpu=1,mem=1G,node=1|{_local(1)}|Unknown|"
        "RUNNING|n2",
        f"13|bob|vision|low|billing=1,cpu=1,mem=1G,node=1|{_local(0)}|{_local(1)}|"
        "COMPLETED|n2",  # no GPU
    ]) + "\n"
    calls, run = _runner(_nodes(), sacct)
    # "now" is 2.5 h in: the last bin is half known
    bins, notes = read_slurm(START, END, 3600.0, START.timestamp() + 2.5 * 3600, run)
    assert [c[0] for c in calls] == ["scontrol", "sacct"]
    assert [b.seconds for b in bins] == [3600.0, 3600.0, 1800.0]
    figs = [next(iter(b.models.values())) for b in bins if b.models is not None]
    assert [f.installed / 3600 for f in figs] == pytest.approx([4, 4, 2])
    assert [f.allocated / 3600 for f in figs] == pytest.approx([1, 3, 1])
    assert all(f.busy == f.held_idle == f.down == 0 for f in figs)
    assert any("n2" in n and "DRAIN" in n and "2 of 4 GPU(s)" in n for n in notes), notes
    cap = build(START, END, "slurm", 3600.0, bins, "allocated: sacct", [], [], 183,
                notes=notes, not_known=NOT_KNOWN)
    assert "busy, held-idle, down time not known from slurm" in sentence(cap)
    assert "0 % busy" not in cap.sentence and "% down" not in cap.sentence
    head, *rows = to_csv(cap).splitlines()
    cols = head.split(",")
    period = next(r.split(",") for r in rows if r.startswith("period,all models"))
    got = dict(zip(cols, period, strict=True))
    assert got["allocated_gpu_hours"] == "5"
    assert got["busy_gpu_hours"] == got["held_idle_gpu_hours"] == got["down_gpu_hours"] == ""
    assert got["busy_pct"] == got["held_idle_pct"] == got["down_pct"] == ""


def test_no_gpu_nodes_or_failing_tools_are_clear_errors() -> None:
    _, run = _runner("NodeName=c1 Arch=x86_64 Gres=(null) State=IDLE\n", "")
    with pytest.raises(SacctError, match="no node with GPUs"):
        read_slurm(START, END, 3600.0, END.timestamp(), run)
