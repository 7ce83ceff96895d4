"""The what-if replays the store's queue through the launcher's engine; bad input gets a
clear message and what can still be said."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpu_audit_app.capacity.replay import run_whatif, trace_from_store
from gpu_audit_app.cli import main
from launcher.spec import JobSpec
from launcher.store import Store
from tests.capacity.crafted import DAY, DAY_S, END, write_trail

pytestmark = pytest.mark.timeout(120)
HOUR = 3600.0


def _contended(path: Path) -> Path:
    """A 2-GPU node: an idle job (it checkpoints, so idle reclaim may preempt it) holds
    one GPU for 4 h from 20:00; four 1-hour training jobs arrive at 20:00 too."""
    store = Store(path)
    try:
        def job(name: str, runtime: float, util: float, ckpt: str | None = None) -> None:
            (i,) = store.add_jobs([JobSpec(name=name, command=["x"], gpus=1,
                                           gpu_memory_bytes=8 * 2**30,
                                           checkpoint_dir=ckpt)],
                                  20_001, "alice", DAY_S + 20 * HOUR)
            store.update(i, state="succeeded", allocated_gpu_seconds=runtime,
                         measured_gpu_seconds=runtime * util)

        job("idle", 4 * HOUR, 0.0, "/ckpt/idle")
        for k in range(4):
            job(f"train-{k}", HOUR, 0.95)
    finally:
        store.close()
    return path


def test_the_replay_rebuilds_the_queue_and_more_gpus_cut_the_wait(tmp_path: Path) -> None:
    db = _contended(tmp_path / "state.db")
    trace = trace_from_store(str(db), DAY, DAY.replace(day=4), node_gpus=2)
    assert trace is not None and trace.header.gpus == 2
    assert sorted(j.runtime for j in trace.jobs) == [HOUR] * 4 + [4 * HOUR]
    assert [j.util for j in trace.jobs if j.name == "job-1"] == [0.0]
    runs, note = run_whatif(None, [str(db)], [2], DAY, DAY.replace(day=4), node_gpus=2)
    by = {r.name: r for r in runs}
    assert list(by) == ["baseline", "idle reclaim", "+2 GPUs"]
    # baseline: the four trainings queue for one GPU: waits 0, 1, 2, 3 h (p95 3 h)
    assert by["baseline"].p95_wait_h == pytest.approx(3.0, abs=0.1)
    # four GPUs: three start at once, the fourth waits one hour
    assert by["+2 GPUs"].gpus == 4
    assert by["+2 GPUs"].p95_wait_h == pytest.approx(1.0, abs=0.1)
    assert by["idle reclaim"].p95_wait_h < by["baseline"].p95_wait_h
    assert by["baseline"].deadline_jobs == 5
    assert by["+2 GPUs"].deadline_met >= by["baseline"].deadline_met
    assert "not a promise" in note


def test_no_queue_says_so_and_the_rest_still_stands(tmp_path: Path) -> None:
    config = write_trail(tmp_path)
    out = tmp_path / "out"
    assert main(["capacity", "--config", str(config), "--from", DAY.isoformat(), "--to",
                 END.isoformat(), "--out", str(out), "--no-png"]) == 0
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["waits"]["known"] is False
    assert "queue waits not known: no queue was read" in doc["waits"]["note"]
    assert "queue waits are not known" in doc["sentence"]
    assert "averaged 67 % allocated" in doc["sentence"]
    assert doc["whatif"] == [] and doc["whatif_note"].startswith("no replay")


def test_a_period_without_data_is_refused_with_a_reason(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = write_trail(tmp_path)
    assert main(["capacity", "--config", str(config), "--from", "2026-10-01T00:00:00Z",
                 "--to", "2026-10-01T03:00:00Z", "--out", str(tmp_path / "o"),
                 "--no-png"]) == 1
    err = capsys.readouterr().err
    assert "no data for 2026-10-01T00:00:00+00:00 .. 2026-10-01T03:00:00+00:00" in err
    assert not (tmp_path / "o" / "capacity.csv").exists()


def test_bins_without_data_are_left_out_not_zero(tmp_path: Path) -> None:
    config = write_trail(tmp_path)
    out = tmp_path / "out"
    assert main(["capacity", "--config", str(config), "--from", "2026-11-02T22:00:00Z",
                 "--to", END.isoformat(), "--out", str(out), "--no-png", "--bin", "hour"]) == 0
    doc = json.loads((out / "capacity.json").read_text())
    assert doc["bins_missing"] == 2
    assert any("2 of 5 bin(s) had no data" in n for n in doc["notes"])
    assert "(with data for 3 of its 5 hours)" in doc["sentence"]
    site = next(r for r in doc["rows"] if r["month"] == "period" and r["model"] == "all models")
    assert site["hours"] == 3 and site["allocated_gpus_mean"] == pytest.approx(8 / 3)


def test_bad_arguments_name_every_problem(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["capacity", "--from", "2026-11-03T00:00:00Z", "--to", "2026-11-03T00:00:00Z",
               "--source", "prometheus", "--horizon-days", "0", "--node-gpus", "99",
               "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 2
    for text in ("the period is empty", "--prometheus-url URL is needed",
                 "--horizon-days 0", "--node-gpus 99"):
        assert text in err
    rc = main(["capacity", "--config", str(write_trail(tmp_path)), "--from",
               DAY.isoformat(), "--to", END.isoformat(), "--launcher-state",
               str(tmp_path / "nope.db"), "--out", str(tmp_path / "o")])
    assert rc == 2 and "nope.db: no such file" in capsys.readouterr().err


def test_a_store_that_is_not_one_is_named(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "state.db"
    bad.write_bytes(b"not a database" * 100)
    rc = main(["capacity", "--config", str(write_trail(tmp_path)), "--from",
               DAY.isoformat(), "--to", END.isoformat(), "--launcher-state", str(bad),
               "--out", str(tmp_path / "o"), "--no-png"])
    assert rc == 2 and "state.db: not a launcher store" in capsys.readouterr().err
