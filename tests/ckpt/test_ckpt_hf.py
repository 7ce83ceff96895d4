"""Hugging Face Trainer: preempted at random steps with real signals, resumed, bit-identical.

examples/train_hf.py (a 2-layer BERT, hidden 32, built from a config; 60 steps of 16
samples, 16 steps per epoch) runs once uninterrupted and once as a chain of processes, each
sent SIGUSR1 or SIGTERM once it reports a randomly chosen step (one with the Trainer's own
enable_jit_checkpoint on: the callback's handler must decide). Each must exit 75 with a
sealed checkpoint-<N> at the next step; the final parameters must equal the uninterrupted
run's. A checkpoint torn after sealing is never resumed from.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest

from tests.ckpt.preemptrun import events as read_events
from tests.ckpt.preemptrun import final_hash, finish, run, run_and_preempt, start

pytest.importorskip("transformers")
pytest.importorskip("torch")

SEED = int(os.environ.get("CKPT_TEST_SEED", "20261201"))
SCRIPT = "train_hf.py"


def test_hf_trainer_preempted_at_random_steps_resumes_bit_identically(tmp_path: Path) -> None:
    rng = random.Random(SEED)
    ref_proc = start(SCRIPT, ["--output-dir", str(tmp_path / "ref"),
                              "--out", str(tmp_path / "ref.pt")], tmp_path / "ref.events")
    out = tmp_path / "ck"
    base = ["--output-dir", str(out), "--out", str(tmp_path / "ck.pt"), "--step-sleep", "0.03"]
    events = tmp_path / "ck.events"
    # mid-epoch targets (16 steps per epoch): the second is in a later epoch than the first
    first = rng.choice([s for s in range(3, 24) if s % 16 not in (15, 0)])
    second = rng.choice([s for s in range(first + 12, 50) if s % 16 not in (15, 0)])
    committed: list[int] = []
    for target, sig, extra in ((first, signal.SIGUSR1, []),
                               (second, signal.SIGTERM, ["--jit"])):
        seg = run_and_preempt(SCRIPT, base + extra, events, at_step=target, sig=sig)
        where = f"{sig.name} at step >= {target}"
        assert seg.rc == 75, f"{where}: rc {seg.rc}\n{seg.stderr[-3000:]}"
        kinds = [e["event"] for e in seg.events]
        assert "preempt_requested" in kinds and kinds[-1] == "preempt_exit", kinds
        commits = [e for e in seg.events if e["event"] == "checkpoint_committed"]
        step = commits[-1]["step"]
        assert isinstance(step, int) and step >= target
        assert commits[-1]["reason"] == "preempt"
        assert (out / f"checkpoint-{step}" / "gpu-audit-manifest.json").is_file()
        if committed:
            assert f"resuming from {out}/checkpoint-{committed[-1]}" in seg.stdout
        committed.append(step)

    seen = len(read_events(events))
    last = run(SCRIPT, base, events)
    ref = finish(ref_proc, tmp_path / "ref.events")
    assert ref.rc == 0, ref.stderr[-3000:]
    assert last.rc == 0, last.stderr[-3000:]
    assert f"resuming from {out}/checkpoint-{committed[-1]}" in last.stdout
    assert final_hash(last.stdout) == final_hash(ref.stdout)
    assert any(s % 16 for s in committed), committed

    mine = last.events[seen:]
    metrics = [e for e in mine if e["event"] == "metrics"]
    assert metrics[-1]["step"] == 60 and metrics[-1]["total_steps"] == 60
    assert any(isinstance(e.get("loss"), float) for e in metrics)
    assert any(isinstance(e.get("steps_per_second"), float) for e in metrics)
    env = [e for e in mine if e["event"] == "environment"]
    assert len(env) == 1 and env[0]["transformers"] and env[0]["torch"]
    resumed = [e for e in mine if e["event"] == "resumed"]
    assert resumed and resumed[0]["step"] == committed[-1]


def test_resume_path_skips_torn_unsealed_and_anomaly_checkpoints(tmp_path: Path) -> None:
    from gpu_audit_ckpt.transformers import PreemptionCallback, seal

    def make(step: int, reason: str = "preempt") -> Path:
        d = tmp_path / f"checkpoint-{step}"
        (d / "sub").mkdir(parents=True)
        (d / "model.safetensors").write_bytes(os.urandom(4096))
        (d / "sub" / "rng_state.pth").write_bytes(b"rng")
        seal(d, step, reason)
        return d

    assert PreemptionCallback.resume_path(tmp_path / "none") is None
    make(10)
    make(20)
    torn = make(30)
    make(40, "anomaly")
    (tmp_path / "checkpoint-50").mkdir()  # the Trainer was killed before anything sealed it
    with open(torn / "model.safetensors", "r+b") as fh:  # one flipped byte
        fh.seek(100)
        b = fh.read(1)
        fh.seek(100)
        fh.write(bytes([b[0] ^ 1]))
    assert PreemptionCallback.resume_path(tmp_path) == str(tmp_path / "checkpoint-20")
    (tmp_path / "checkpoint-20" / "extra.bin").write_bytes(b"x")  # a file nobody sealed
    assert PreemptionCallback.resume_path(tmp_path) == str(tmp_path / "checkpoint-10")


def test_logged_loss_spike_takes_a_sealed_anomaly_checkpoint(tmp_path: Path) -> None:
    """A spike in the loss the Trainer logs: the callback asks for a save at that step, it is
    sealed with reason `anomaly`, training goes on, and resume_path never picks it."""
    import json

    import torch
    from transformers import Trainer, TrainingArguments

    from gpu_audit_ckpt.transformers import PreemptionCallback

    class Spiky(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)
            self.calls = 0

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            self.calls += 1
            loss = torch.nn.functional.mse_loss(self.lin(x).squeeze(-1), labels) + 1.0
            return {"loss": loss * 1000 if self.calls == 15 else loss}

    g = torch.Generator().manual_seed(0)
    rows = [{"x": torch.randn(4, generator=g), "labels": torch.randn((), generator=g)}
            for _ in range(64)]
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=20, per_device_train_batch_size=2,
        learning_rate=0.0, logging_steps=1, save_strategy="no", use_cpu=True, report_to="none",
        disable_tqdm=True,
    )
    trainer = Trainer(model=Spiky(), args=args, train_dataset=rows,
                      callbacks=[PreemptionCallback(events_file=tmp_path / "ev")])
    trainer.train()
    assert trainer.state.global_step == 20
    ev = [json.loads(line) for line in (tmp_path / "ev").read_text().splitlines()]
    assert [(e["step"], e["kind"]) for e in ev if e["event"] == "anomaly"] == [(15, "loss_spike")]
    commits = [e for e in ev if e["event"] == "checkpoint_committed"]
    assert [(e["step"], e["reason"]) for e in commits] == [(15, "anomaly")]
    seal_file = tmp_path / "out" / "checkpoint-15" / "gpu-audit-manifest.json"
    sealed = json.loads(seal_file.read_text())
    assert sealed["reason"] == "anomaly" and sealed["files"]
    assert PreemptionCallback.resume_path(tmp_path / "out") is None
