"""The Slurm bill's arithmetic (chargeback/slurm/bill.py) and sacct's parsing
(chargeback/sources/slurm.py) on fixed inputs; tests/slurm/test_chargeback.py runs them
against the real cluster and real sacct."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from chargeback.rates import Rates
from chargeback.slurm.bill import build_slurm_bill, note_unstarted, render_csv
from chargeback.slurm.report import RunReport
from chargeback.sources.slurm import (
    SacctData,
    SacctRun,
    gpus_of,
    read_sacct,
    read_unstarted,
)
from gpu_audit import slurmcmd

START = datetime(2026, 11, 1, tzinfo=UTC)
END = datetime(2026, 11, 2, tzinfo=UTC)
T0 = START.timestamp()
RATES = Rates("EUR", {"default": 1.0, "NVIDIA H100": 3.0}, 0.25)


def run_record(job: str, start: float, end: float, gpus: list[str], *,
               account: str = "physics", partition: str = "gpu", user: str = "alice",
               host: str = "n1") -> dict[str, Any]:
    r = RunReport(job, host, user=user, account=account, partition=partition,
                  gpus=tuple(gpus), start_time=start, end_time=end, time_source="slurm")
    return {"stream": "slurm", "event": "job_finished", "kind": "event", "host": host,
            "job": r.job_fields()}


def gpu_record(uuid: str, name: str) -> dict[str, Any]:
    return {"kind": "gpu", "time_ns": int((T0 + 10) * 1e9), "host": "n1",
            "gpu": {"uuid": uuid, "name": name}, "values": {"utilization_ratio": 0.5}}


def test_runs_are_cut_to_the_period_priced_by_model_and_grouped() -> None:
    """A run across the period's start counts from the start; its GPUs are priced by their
    model; rows are (account, partition, user) with the runs counted."""
    records = [gpu_record("G1", "NVIDIA H100"), gpu_record("G2", "NVIDIA A100"),
               run_record("1", T0 - 3600, T0 + 3600, ["G1"]),
               run_record("2", T0 + 100, T0 + 1900, ["G1", "G2"]),
               run_record("3", T0 + 100, T0 + 460, ["G2"], account="vision", user="bob")]
    bill = build_slurm_bill(records, START, END, RATES, None)
    rows = {(r.account, r.partition, r.user): r for r in bill.rows}
    p = rows[("physics", "gpu", "alice")]
    assert (p.runs, p.allocated_gpu_seconds) == (2, 3600 + 2 * 1800)
    assert p.gpu_cost == 1.0 * 3.0 + 0.5 * 3.0 + 0.5 * 1.0
    assert rows[("vision", "gpu", "bob")].allocated_gpu_seconds == 360
    assert bill.total.runs == 3 and not bill.compared
    assert render_csv(bill).decode().splitlines()[-1].split(",")[2] == "total"


def test_reconciliation_lists_runs_on_one_side_only() -> None:
    """Against sacct: the same run (starts within 2 s) matches; a run Slurm accounted that
    the trail lacks, and a record Slurm has no run for, are listed; differences per row."""
    records = [run_record("1", T0 + 100, T0 + 1100, ["G1"]),
               run_record("9", T0 + 500, T0 + 600, ["G1"])]
    sacct = SacctData(runs=[
        SacctRun("1", "alice", "physics", "gpu", 1, T0 + 101, T0 + 1100, "COMPLETED", "n1"),
        SacctRun("2", "alice", "physics", "gpu", 2, T0 + 100, T0 + 200, "COMPLETED", "n2")],
        command=["sacct"], output_sha256="x")
    bill = build_slurm_bill(records, START, END, RATES, sacct)
    (row,) = bill.rows
    assert (row.allocated_gpu_seconds, row.sacct_gpu_seconds) == (1100, 999 + 200)
    assert row.runs == 2 and row.sacct_runs == 2
    assert bill.missing_from_trail == ["job 2 (run from 2026-11-01T00:01:40Z)"]
    assert bill.not_in_sacct == ["job 9 (run from 2026-11-01T00:08:20Z)"]


def test_sacct_output_is_read_as_slurm_prints_it() -> None:
    """-P rows: GPUs from AllocTRES's untyped gres/gpu, times in local time cut to the
    period, a running job up to the period's end, runs without GPUs skipped."""
    assert gpus_of("billing=1,cpu=1,gres/gpu=2,node=1") == 2
    assert gpus_of("cpu=1,gres/gpu:a100=4,gres/gpu=4,node=1") == 4
    assert gpus_of("cpu=4,node=1") == 0
    t = slurmcmd.slurm_time
    text = "\n".join([
        f"7|alice|physics|gpu|cpu=1,gres/gpu=2,node=1|{t(T0 + 10)}|{t(T0 + 70)}|COMPLETED|n1",
        f"8|bob|vision|gpu|cpu=1,gres/gpu=1,node=1|{t(T0 + 20)}|Unknown|RUNNING|n2",
        f"9|bob|vision|cpu|cpu=1,node=1|{t(T0 + 20)}|{t(T0 + 30)}|COMPLETED|n2", ""])
    calls: list[list[str]] = []

    def fake(name: str, args: Any) -> str:
        calls.append([name, *args])
        return text

    data = read_sacct(START, END, run=fake)
    assert [(r.job_id, r.gpus, r.gpu_seconds) for r in data.runs] == [
        ("7", 2, 120.0), ("8", 1, END.timestamp() - (T0 + 20))]
    assert data.skipped == 1 and data.command == calls[0]
    assert {"-X", "-D", "--truncate", "-a"} <= set(calls[0])


def test_a_run_sacct_recorded_without_a_start_is_named_not_miscounted() -> None:
    """Slurm 22.05 records a run preempted and requeued before its start reached slurmdbd
    with Start "None" (seen on the real cluster): that row is no "run without GPUs"; the
    bill counts it apart, says in a note that sacct bills it 0 GPU-seconds, and the
    trail's run of that job says why sacct does not have it."""
    t = slurmcmd.slurm_time
    text = "\n".join([
        f"1|bob|vision|low|cpu=1,gres/gpu=2,node=1|None|{t(T0 + 46)}|REQUEUED|n1",
        f"1|bob|vision|low|cpu=1,gres/gpu=2,node=1|{t(T0 + 61)}|{t(T0 + 67)}|COMPLETED|n1",
        "2|bob|vision|low|cpu=1,gres/gpu=1,node=1|None|None|PENDING|None",
        f"3|bob|vision|cpu|cpu=1,node=1|None|{t(T0 + 30)}|CANCELLED|n2", ""])
    data = read_sacct(START, END, run=lambda _name, _args: text)
    assert [(r.job_id, r.start) for r in data.runs] == [("1", T0 + 61)]
    assert data.skipped == 1 and data.unstarted == [("1", T0 + 46)]
    records = [run_record("1", T0 + 44, T0 + 46, ["G1", "G2"], account="vision",
                          partition="low", user="bob"),
               run_record("1", T0 + 61, T0 + 67, ["G1", "G2"], account="vision",
                          partition="low", user="bob")]
    bill = build_slurm_bill(records, START, END, RATES, data)
    assert bill.missing_from_trail == []
    assert bill.not_in_sacct == [
        "job 1 (run from 2026-11-01T00:00:44Z; sacct has a run of it without a start time)"]
    assert any("no start time" in n and "job 1 (ended 2026-11-01T00:00:46Z)" in n
               for n in bill.notes), bill.notes


def test_runs_sacct_lacks_are_asked_for_by_job_id_and_explained() -> None:
    """A time-windowed sacct does not list a run whose start Slurm cleared, so the bill
    asks sacct for the jobs of the runs it lacks by id (at any time) and explains them."""
    t = slurmcmd.slurm_time
    text = "\n".join([
        f"1|bob|vision|low|cpu=1,gres/gpu=2,node=1|None|{t(T0 + 46)}|REQUEUED|n1",
        f"1|bob|vision|low|cpu=1,gres/gpu=2,node=1|{t(T0 + 61)}|{t(T0 + 67)}|COMPLETED|n1",
        ""])
    calls: list[list[str]] = []

    def fake(name: str, args: Any) -> str:
        calls.append([name, *args])
        return text

    unstarted, command = read_unstarted(["1", "1", "x; rm -rf /"], run=fake)
    assert unstarted == [("1", T0 + 46)] and command == calls[0]
    assert calls[0][calls[0].index("-j") + 1] == "1" and "-S" not in calls[0]
    assert read_unstarted([], run=fake) == ([], []) and len(calls) == 1
    window = SacctData(runs=[SacctRun("1", "bob", "vision", "low", 2, T0 + 61, T0 + 67,
                                      "COMPLETED", "n1")], command=["sacct"])
    records = [run_record("1", T0 + 44, T0 + 46, ["G1", "G2"]),
               run_record("1", T0 + 61, T0 + 67, ["G1", "G2"])]
    bill = build_slurm_bill(records, START, END, RATES, window)
    assert bill.not_in_sacct == ["job 1 (run from 2026-11-01T00:00:44Z)"]
    note_unstarted(bill, unstarted, command)
    assert bill.not_in_sacct == [
        "job 1 (run from 2026-11-01T00:00:44Z; sacct has a run of it without a start time)"]
    assert bill.inputs["sacct"]["runs_without_start"] == 1
    assert bill.inputs["sacct"]["runs_without_start_command"] == command
