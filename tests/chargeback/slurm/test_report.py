"""The per-job GPU report: notes, text, and the AdminComment form (chargeback/slurm/report.py)."""

from __future__ import annotations

from chargeback.slurm.report import (
    RunReport,
    admin_comment,
    notes,
    parse_admin_comment,
    render_text,
)

BUSY = {"gpu_seconds": 3600.0, "busy_gpu_seconds": 3000.0, "idle_held_gpu_seconds": 0.0,
        "energy_joules": 1e6, "peak_memory_bytes": 60 * 1024**3,
        "memory_total_bytes": 80 * 1024**3, "processes": 1, "samples": 720}


def run(**usage: float) -> RunReport:
    return RunReport("42", "n1", gpus=("GPU-1",), start_time=0.0, end_time=3600.0,
                     usage={**BUSY, **usage})


def test_admin_comment_survives_what_sacctmgr_does_to_it() -> None:
    """sacctmgr 22.05 lower-cases an AdminComment (and turns quotes into backticks): the
    stored form has neither case nor quotes to lose, and reads back whole."""
    reports = [run(), RunReport("42", "n2", attempt=1, user='o"brien', gpus=("GPU-2",),
                                start_time=5.0, end_time=9.0)]
    text = admin_comment(reports)
    assert text == text.lower() and '"' not in text and "'" not in text
    assert parse_admin_comment(text.lower()) == reports
    assert parse_admin_comment("JS1:somebody-elses") is None
    assert parse_admin_comment(text[:-7]) is None  # damaged: no report, no exception


def test_notes_say_what_to_change() -> None:
    """A busy job that fills its GPU gets no note; unused GPUs, idle GPUs, low busy share
    and a tiny memory footprint each get theirs."""
    assert notes(run()) == []
    assert "No process used the 1 GPU(s)" in notes(run(gpu_seconds=0))[0]
    assert "sat idle" in notes(run(idle_held_gpu_seconds=3000))[0]
    assert "busy only 6%" in notes(run(busy_gpu_seconds=200))[0]
    assert "held the GPUs only 28%" in notes(run(gpu_seconds=1000, busy_gpu_seconds=900))[0]
    assert "MIG slice" in notes(run(peak_memory_bytes=2 * 1024**3))[0]


def test_a_record_round_trips_to_a_report() -> None:
    """The job object of a run's record reads back into the same report."""
    r = run()
    rec = {"event": "job_finished", "host": "n1", "simulated": False, "job": r.job_fields()}
    assert RunReport.from_record(rec) == r
    assert RunReport.from_record({"event": "job_started", "job": r.job_fields()}) is None
    assert RunReport.from_record({"event": "job_finished", "job": {"id": "1"}}) is None


def test_progress_environment_and_software_are_shown_and_kept() -> None:
    """A run's progress, environment and its processes' software survive the record, the
    JSON file and AdminComment, and the text says them; a run without them says nothing
    of them (unknown is absent, never 0)."""
    from chargeback.software import SoftwareUsage

    sw = SoftwareUsage()
    sw.add({"kind": "event", "event": "process_start", "host": "n1",
            "process": {"pid": 7, "start_time_ticks": 3},
            "software": {"loaded": ["cudart", "torch"], "libraries": {"cudart": "12.4.127"}}})
    r = run()
    r.progress = {"step": 600, "total_steps": 1000, "fraction": 0.6, "loss": 0.25,
                  "steps_per_second": 2.0, "remaining_seconds": 200.0}
    r.environment = {"python": "3.12.3", "torch": "2.6.0", "cuda": "12.4"}
    r.software = sw.of_processes([("n1", 7, 3), ("n1", 8, 0)])
    assert r.software == [{"loaded": ["cudart", "torch"], "libraries": {"cudart": "12.4.127"}}]
    text = render_text([r])
    assert "Progress: step 600 of 1000 (60.0%), loss 0.25, 2 steps/s" in text
    assert "Remaining at the end of this run: about 00:03:20" in text
    assert "Ran (as the job reported): python 3.12.3, torch 2.6.0, cuda 12.4" in text
    assert "GPU processes ran (as the exporter saw): cudart 12.4.127, torch" in text
    rec = {"event": "job_finished", "host": "n1", "job": r.job_fields()}
    assert RunReport.from_record(rec) == r
    assert RunReport.from_json(r.to_json()) == r
    assert parse_admin_comment(admin_comment([r])) == [r]
    plain = render_text([run()])
    assert "Progress" not in plain and "Ran " not in plain
    assert not {"progress", "environment", "software"} & set(run().job_fields())
