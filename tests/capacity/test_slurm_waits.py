"""Slurm pending times as waits: sacct's Eligible -> Start with ReqTRES's GPUs, through
the same runner seam chargeback's read_sacct tests use (the real cluster is
tests/slurm's)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import pytest

from chargeback.capacity.compute import waits_summary
from chargeback.sources.slurm import SacctError
from gpu_audit import slurmcmd
from gpu_audit_app.capacity.main import slurm_waits

START = dt.datetime(2026, 11, 3, tzinfo=dt.UTC)
END = START + dt.timedelta(hours=4)


def _local(hours: float) -> str:
    """A Slurm timestamp (local time, as sacct prints it) `hours` after START."""
    return (START + dt.timedelta(hours=hours)).astimezone().strftime("%Y-%m-%dT%H:%M:%S")


def test_pending_times_become_waits() -> None:
    seen: list[Sequence[str]] = []
    text = "\n".join([
        f"101|{_local(0)}|{_local(1)}|billing=4,cpu=4,gres/gpu=2,mem=8G,node=1|COMPLETED",
        f"102|{_local(1)}|Unknown|cpu=1,gres/gpu=1,mem=1G,node=1|PENDING",
        f"103|{_local(0)}|{_local(0.5)}|cpu=2,mem=1G,node=1|COMPLETED",  # no GPU: not ours
        "104|Unknown|Unknown|cpu=1,gres/gpu=1|PENDING",  # not eligible yet (held)
    ]) + "\n"

    def run(name: str, args: Sequence[str]) -> str:
        assert name == "sacct"
        seen.append(args)
        return text

    waits = slurm_waits(START, END, run=run)
    assert [(w.job, w.gpus, w.queued - START.timestamp(),
             None if w.started is None else w.started - START.timestamp())
            for w in waits] == [("101", 2.0, 0.0, 3600.0), ("102", 1.0, 3600.0, None)]
    assert "-D" in seen[0] and "JobIDRaw,Eligible,Start,ReqTRES,State" in seen[0]
    s = waits_summary(waits, ["slurm"], START, END, [])
    # 2 GPUs x 1 h + 1 GPU x 3 h (still pending at the end)
    assert s.queued_gpu_hours == pytest.approx(5.0)
    assert (s.jobs, s.never_started) == (2, 1)


def test_a_failing_sacct_is_a_sacct_error() -> None:
    def run(name: str, args: Sequence[str]) -> str:
        raise slurmcmd.SlurmCommandError("sacct: error: Problem talking to the database")

    with pytest.raises(SacctError, match="Problem talking to the database"):
        slurm_waits(START, END, run=run)
