"""Lightning: preempted at chosen and random steps with real signals, resumed, bit-identical.

One chain of real processes (examples/train_lightning.py: 3 epochs of 20 steps, validation
twice per epoch) against an uninterrupted run of the same command:
- SIGUSR1 at step 10, mid-epoch where validation runs next (a resumed run skips that
  validation, so it must not have moved the training RNG stream);
- SIGUSR1 during step 20, the last of an epoch: the checkpoint is taken at step 21 (the
  callback never checkpoints on an epoch's last batch: Lightning would restore it with its
  epoch counters one behind), after the epoch-end validation, so the next epoch's data
  order and the training RNG stream must both survive it;
- SIGTERM sent after the callbacks saw step 33 (Lightning's own SIGTERM handler, were it
  still installed, would end the run at this batch without a checkpoint);
- SIGUSR1 from outside at a random step, under Lightning's SLURMEnvironment(auto_requeue=False);
then a run to the end. Each preempted run must exit 75 with a checkpoint at the next step;
the final parameters must equal the uninterrupted run's, SHA-256 for SHA-256.
"""

from __future__ import annotations

import os
import random
import signal
from pathlib import Path

import pytest

from tests.ckpt.preemptrun import events as read_events
from tests.ckpt.preemptrun import final_hash, finish, run, run_and_preempt, start

pytest.importorskip("lightning")
pytest.importorskip("torch")

SEED = int(os.environ.get("CKPT_TEST_SEED", "20261201"))
SCRIPT = "train_lightning.py"
SLURM_ENV = {
    "SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1",
    "SLURM_JOB_NAME": "train", "SLURM_NODELIST": "localhost", "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
}


def _commits(events: list[dict[str, object]]) -> list[int]:
    out = []
    for e in events:
        if e["event"] == "checkpoint_committed":
            assert isinstance(e["step"], int)
            out.append(e["step"])
    return out


def test_lightning_preempted_mid_epoch_and_at_epoch_end_resumes_bit_identically(
    tmp_path: Path,
) -> None:
    rng = random.Random(SEED)
    ref_proc = start(SCRIPT, ["--checkpoint-dir", str(tmp_path / "ref"),
                              "--out", str(tmp_path / "ref.pt")], tmp_path / "ref.events")
    base = ["--checkpoint-dir", str(tmp_path / "ck"), "--out", str(tmp_path / "ck.pt"),
            "--report-every", "1"]
    events = tmp_path / "ck.events"

    committed: list[int] = []
    for extra, want in (
        (["--signal-at-step", "10"], 10),
        (["--signal-at-step", "20"], 21),
        (["--late-sigterm-at-step", "33"], 34),
    ):
        seen = len(read_events(events))
        seg = run(SCRIPT, base + extra, events)
        mine = seg.events[seen:]
        assert seg.rc == 75, f"{extra}: rc {seg.rc}\n{seg.stderr[-3000:]}"
        assert _commits(mine)[-1] == want, (extra, _commits(mine))
        kinds = [e["event"] for e in mine]
        assert kinds[-1] == "preempt_exit" and "preempt_requested" in kinds, kinds
        if committed:
            assert f"resuming from {tmp_path / 'ck'}/step-{committed[-1]}/" in seg.stdout
        committed.append(want)

    target = rng.randrange(36, 52)
    seg = run_and_preempt(SCRIPT, [*base, "--slurm", "--step-sleep", "0.04"], events,
                          at_step=target, sig=signal.SIGUSR1, env=SLURM_ENV)
    assert seg.rc == 75, f"SIGUSR1 at step >= {target}: rc {seg.rc}\n{seg.stderr[-3000:]}"
    assert "cluster environment SLURMEnvironment" in seg.stdout
    step = _commits(seg.events)[-1]
    assert target <= step < 60
    committed.append(step)

    seen = len(read_events(events))
    last = run(SCRIPT, base, events)
    ref = finish(ref_proc, tmp_path / "ref.events")
    assert ref.rc == 0, ref.stderr[-3000:]
    assert last.rc == 0, last.stderr[-3000:]
    assert f"step-{committed[-1]}/lightning.ckpt" in last.stdout
    assert final_hash(last.stdout) == final_hash(ref.stdout)
    assert all(s % 20 for s in committed), committed  # all of them mid-epoch

    # Progress and environment through the events file, as the launcher reads it.
    metrics = [e for e in last.events[seen:] if e["event"] == "metrics"]
    assert metrics and metrics[-1]["step"] == 60 and metrics[-1]["total_steps"] == 60
    assert isinstance(metrics[-1]["loss"], float)
    assert isinstance(metrics[-1]["steps_per_second"], float)
    env = [e for e in last.events[seen:] if e["event"] == "environment"]
    assert len(env) == 1 and str(env[0]["torch"]).startswith("2.")
    assert env[0]["lightning"] and env[0]["python"]


def test_loss_spike_and_nan_take_anomaly_checkpoints(tmp_path: Path) -> None:
    """A spike in the loss Lightning logs, then a NaN: an anomaly-<N> checkpoint each, and
    training goes on (anomaly checkpoints are for inspection, never resumed from)."""
    import json

    import lightning.pytorch as pl
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from gpu_audit_ckpt.lightning import PreemptionCheckpoint

    class Spiky(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(4, 1)

        def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.lin(x), y) + 1.0
            self.log("train_loss", loss)
            step = self.global_step + 1
            return loss * 1000 if step == 15 else loss * torch.nan if step == 22 else loss

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.0)  # the loss stays put

    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(96, 4), torch.randn(96, 1))
    cb = PreemptionCheckpoint(tmp_path / "ck", events_file=tmp_path / "ev")
    trainer = pl.Trainer(accelerator="cpu", max_epochs=1, callbacks=[cb], logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, log_every_n_steps=1)
    trainer.fit(Spiky(), train_dataloaders=DataLoader(ds, batch_size=4),
                ckpt_path=cb.resume_path())
    assert trainer.global_step == 24
    ev = [json.loads(line) for line in (tmp_path / "ev").read_text().splitlines()]
    anomalies = [(e["step"], e["kind"]) for e in ev if e["event"] == "anomaly"]
    assert anomalies == [(15, "loss_spike"), (22, "nonfinite_loss")]
    for step in (15, 22):
        assert (tmp_path / "ck" / f"anomaly-{step}" / "lightning.ckpt").is_file()
    assert cb.resume_path() is None  # nothing but anomaly checkpoints: start afresh
