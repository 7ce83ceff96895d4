"""The loop-facing behaviour: the preemption flag, when to checkpoint, anomalies, events."""

from __future__ import annotations

import json
import math
import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from gpu_audit_ckpt import EXIT_PREEMPTED, Checkpointer, LossMonitor
from gpu_audit_ckpt.preempt import grace_from_env, parse_signal, signals_from_env


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _events(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def ckpt(tmp_path: Path) -> Iterator[Checkpointer]:
    c = Checkpointer(tmp_path / "ck", events_file=tmp_path / "events.jsonl", every_steps=10)
    yield c
    c.flag.uninstall()


def test_signal_only_sets_flag_and_deadline(ckpt: Checkpointer, tmp_path: Path) -> None:
    """A real SIGUSR1: the flag and deadline are set, nothing is written until the loop asks."""
    ckpt.install(["USR1"], grace=45)
    os.kill(os.getpid(), signal.SIGUSR1)
    assert ckpt.preempt_requested
    assert ckpt.deadline is not None and ckpt.flag.signal_time is not None
    assert ckpt.deadline == pytest.approx(ckpt.flag.signal_time + 45)
    assert not (tmp_path / "events.jsonl").exists()
    assert ckpt.should_checkpoint(3)
    (ev,) = _events(tmp_path / "events.jsonl")
    assert ev["event"] == "preempt_requested" and ev["signal"] == "SIGUSR1" and ev["step"] == 3


def test_preempt_save_then_exit_75(ckpt: Checkpointer, tmp_path: Path) -> None:
    ckpt.install(["USR1"])
    os.kill(os.getpid(), signal.SIGUSR1)
    assert ckpt.should_checkpoint(5)
    ckpt.save(5, {"w": np.ones(2)})
    assert not ckpt.should_checkpoint(5)  # already saved at this step
    with pytest.raises(SystemExit) as exc:
        ckpt.exit_preempted()
    assert exc.value.code == EXIT_PREEMPTED == 75
    kinds = [(e["event"], e.get("reason")) for e in _events(tmp_path / "events.jsonl")]
    assert kinds == [("preempt_requested", None), ("checkpoint_committed", "preempt"),
                     ("preempt_exit", None)]


def test_preemption_settings_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPU_AUDIT_PREEMPT_SIGNAL", "usr2, SIGTERM,10")
    assert signals_from_env() == [signal.SIGUSR2, signal.SIGTERM, signal.SIGUSR1]
    monkeypatch.setenv("GPU_AUDIT_PREEMPT_GRACE_SECONDS", "120")
    assert grace_from_env() == 120.0
    monkeypatch.delenv("GPU_AUDIT_PREEMPT_SIGNAL")
    assert signals_from_env() == [signal.SIGUSR1, signal.SIGTERM]
    monkeypatch.setenv("GPU_AUDIT_PREEMPT_SIGNAL", "USR9,HUP")
    with pytest.raises(ValueError, match="USR9"):
        signals_from_env()
    for bad in ("soon", "-3", "inf", "nan"):
        monkeypatch.setenv("GPU_AUDIT_PREEMPT_GRACE_SECONDS", bad)
        with pytest.raises(ValueError, match="GPU_AUDIT_PREEMPT_GRACE_SECONDS"):
            grace_from_env()
    assert parse_signal("term") == signal.SIGTERM


def test_periodic_by_steps_and_by_time(tmp_path: Path) -> None:
    clock = Clock()
    c = Checkpointer(tmp_path, every_steps=4, every_seconds=60, clock=clock)
    assert [s for s in range(1, 13) if c.should_checkpoint(s)] == [4, 8, 12]
    clock.t += 61
    assert c.should_checkpoint(5)
    c.save(5, {"w": np.zeros(1)})
    assert not c.should_checkpoint(6)
    clock.t += 61
    assert c.should_checkpoint(6)


def test_bad_settings_are_all_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPU_AUDIT_CHECKPOINT_DIR", raising=False)
    with pytest.raises(ValueError) as exc:
        Checkpointer(keep_last=0, every_steps=0, every_seconds=-1, spike_factor=0.5)
    msg = str(exc.value)
    for part in ("GPU_AUDIT_CHECKPOINT_DIR", "keep_last", "every_steps", "every_seconds",
                 "spike_factor"):
        assert part in msg
    monkeypatch.setenv("GPU_AUDIT_CHECKPOINT_DIR", str(tmp_path))
    assert Checkpointer().directory == tmp_path


def test_loss_monitor_nan_and_spike() -> None:
    m = LossMonitor(spike_factor=5, window=20, min_history=5)
    assert [m.observe(i, 1.0 + 0.01 * i) for i in range(5)] == [None] * 5
    spike = m.observe(5, 9.0)
    assert spike is not None and spike.kind == "loss_spike" and spike.first_in_streak
    assert m.observe(6, 4.0) is None  # below 5 x median
    nan = m.observe(7, math.nan)
    assert nan is not None and nan.kind == "nonfinite_loss" and nan.first_in_streak
    inf = m.observe(8, math.inf)
    assert inf is not None and not inf.first_in_streak


def test_anomaly_checkpoint_is_kept_apart_and_not_resumed(
    ckpt: Checkpointer, tmp_path: Path
) -> None:
    """A NaN loss: one anomaly event, an anomaly-<N> checkpoint; resume still uses step-<N>."""
    ckpt.save(10, {"w": np.full(2, 10.0)})
    for s in range(11, 14):
        ckpt.report(s, loss=1.0)
    assert ckpt.report(14, loss=math.nan) is not None
    assert ckpt.report(15, loss=math.nan) is not None  # same streak: no second event
    assert ckpt.should_checkpoint(15)
    m = ckpt.save(15, {"w": np.full(2, math.nan)})
    assert m.path.name == "anomaly-15" and m.reason == "anomaly"
    assert not ckpt.should_checkpoint(16)
    evs = _events(tmp_path / "events.jsonl")
    anomalies = [e for e in evs if e["event"] == "anomaly"]
    assert len(anomalies) == 1 and anomalies[0]["kind"] == "nonfinite_loss"
    assert anomalies[0]["loss"] == "nan"  # strict JSON: non-finite numbers as strings
    resumed = Checkpointer(tmp_path / "ck").restore()
    assert resumed is not None and resumed.step == 10
    assert Checkpointer(tmp_path / "ck").restore(prefix="anomaly").step == 15  # type: ignore[union-attr]


def test_restore_puts_every_rng_back(tmp_path: Path) -> None:
    gen = np.random.default_rng(7)
    c = Checkpointer(tmp_path, generators={"data": gen})
    random.seed(1)
    np.random.seed(2)
    c.save(1, {"w": np.zeros(1)})
    expected = (random.random(), np.random.random(), gen.random())
    Checkpointer(tmp_path, generators={"data": gen}).restore()
    assert (random.random(), np.random.random(), gen.random()) == expected


def test_events_are_one_json_object_per_line(ckpt: Checkpointer, tmp_path: Path) -> None:
    ckpt.report(1, loss=np.float32(0.25), acc=np.float64(0.5), note="warmup")
    env, ev = _events(tmp_path / "events.jsonl")  # the first report sends the environment
    assert env["event"] == "environment" and env["numpy"] == np.__version__
    assert ev["event"] == "metrics" and ev["step"] == 1
    assert ev["loss"] == 0.25 and ev["acc"] == 0.5 and ev["note"] == "warmup"
    assert isinstance(ev["time"], float) and ev["pid"] == os.getpid()


def test_retention_after_periodic_saves_but_not_on_the_preemption_path(tmp_path: Path) -> None:
    c = Checkpointer(tmp_path, keep_last=2)
    for s in (1, 2, 3):
        c.save(s, {"w": np.zeros(1)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2", "step-3"]
    c.flag.request("test")
    c.save(4, {"w": np.zeros(1)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-2", "step-3", "step-4"]
    Checkpointer(tmp_path, keep_last=2).save(5, {"w": np.zeros(1)})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-4", "step-5"]


def test_process_wide_install_is_shared_by_later_checkpointers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """install() before the slow imports: a signal then is seen by the Checkpointer made later."""
    from gpu_audit_ckpt import install, preempt

    monkeypatch.setattr(preempt, "_installed", None)
    flag = install(["USR2"], grace=5)
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        c = Checkpointer(tmp_path)
        assert c.flag is flag and c.preempt_requested and c.should_checkpoint(1)
    finally:
        flag.uninstall()
