"""A small Lightning model on CPU, preemptible mid-epoch and exactly resumable.

A two-layer MLP with dropout, Adam and a per-step LR schedule, a shuffled training
DataLoader driven by its own torch.Generator, validation twice per epoch. PreemptionCheckpoint
turns SIGUSR1/SIGTERM into a checkpoint at the next step and exit code 75; running the same
command again resumes from it and ends with the same parameters as an uninterrupted run.

    python examples/train_lightning.py --epochs 3 --checkpoint-dir /tmp/ckl --out /tmp/l.pt
"""

from __future__ import annotations

import argparse
import hashlib
import os
import signal
import sys
import time
from typing import Any

import gpu_audit_ckpt

# First, before the seconds torch and Lightning take to import: from here on a preemption
# signal only sets the flag the callback reads.
gpu_audit_ckpt.install()

import lightning.pytorch as pl  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch.plugins.environments import SLURMEnvironment  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from gpu_audit_ckpt.lightning import PreemptionCheckpoint  # noqa: E402


def make_data(n: int, dim: int, classes: int, seed: int) -> TensorDataset:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    teacher = torch.randn(dim, classes, generator=g)
    y = (x @ teacher + 0.5 * torch.randn(n, classes, generator=g)).argmax(dim=1)
    return TensorDataset(x, y)


class MLP(pl.LightningModule):
    def __init__(self, dim: int, hidden: int, classes: int, lr: float, *, step_sleep: float,
                 signal_at_step: int | None = None, late_sigterm_at_step: int | None = None,
                 ) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(0.2), nn.Linear(hidden, hidden),
            nn.ReLU(), nn.Dropout(0.2), nn.Linear(hidden, classes),
        )
        self.lr = lr
        self.step_sleep = step_sleep
        self.signal_at_step = signal_at_step
        self.late_sigterm_at_step = late_sigterm_at_step
        self.loss_fn = nn.CrossEntropyLoss()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = self.loss_fn(self.net(x), y)
        self.log("train_loss", loss)
        if self.step_sleep:
            time.sleep(self.step_sleep)  # stands in for a slower model in tests
        if self.signal_at_step == self.global_step + 1:  # tests: a real signal, exact step
            os.kill(os.getpid(), signal.SIGUSR1)
        return loss

    def on_fit_start(self) -> None:
        # which cluster environment Lightning chose (tests check SLURMEnvironment is in use)
        connector = getattr(self.trainer, "_accelerator_connector", None)
        env = getattr(connector, "cluster_environment", None)
        print(f"cluster environment {type(env).__name__}", flush=True)

    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None:
        # tests: SIGTERM after the callbacks' hooks ran, where Lightning's own SIGTERM
        # handler (if it were still installed) would end the run with exit 1 at this batch
        if self.late_sigterm_at_step == self.global_step:
            os.kill(os.getpid(), signal.SIGTERM)

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        self.log("val_loss", self.loss_fn(self.net(x), y))

    def configure_optimizers(self) -> Any:
        opt = torch.optim.Adam(self.parameters(), lr=self.lr)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.7)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--out", required=True, help="final model state dict (torch.save)")
    ap.add_argument("--every-steps", type=int, default=None, help="periodic checkpoints")
    ap.add_argument("--samples", type=int, default=640)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--signal-at-step", type=int, default=None,
                    help="tests: send ourselves SIGUSR1 during this step")
    ap.add_argument("--late-sigterm-at-step", type=int, default=None,
                    help="tests: send ourselves SIGTERM after the callbacks saw this step")
    ap.add_argument("--report-every", type=int, default=None,
                    help="progress report cadence in steps (default: Lightning's logging's)")
    ap.add_argument("--slurm", action="store_true",
                    help="run under Lightning's SLURMEnvironment(auto_requeue=False)")
    ap.add_argument("--no-callback", action="store_true", help="baseline for bench/")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)  # same reduction order on every run
    torch.use_deterministic_algorithms(True)
    pl.seed_everything(args.seed, verbose=False)
    dim, classes = 16, 4
    train = make_data(args.samples, dim, classes, args.seed)
    val = make_data(128, dim, classes, args.seed + 100)
    g = torch.Generator().manual_seed(args.seed + 2)
    loader = DataLoader(train, batch_size=args.batch_size, shuffle=True, generator=g,
                        num_workers=0)
    val_loader = DataLoader(val, batch_size=64, num_workers=0)
    model = MLP(dim, args.hidden, classes, 3e-3, step_sleep=args.step_sleep,
                signal_at_step=args.signal_at_step,
                late_sigterm_at_step=args.late_sigterm_at_step)

    callbacks: list[pl.Callback] = []
    ckpt_path = None
    if not args.no_callback:
        cb = PreemptionCheckpoint(args.checkpoint_dir, generators={"loader": g},
                                  every_n_steps=args.every_steps,
                                  report_every_n_steps=args.report_every)
        callbacks.append(cb)
        ckpt_path = cb.resume_path()
        if ckpt_path is not None:
            print(f"resuming from {ckpt_path}", flush=True)
    plugins: list[Any] = []
    if args.slurm:
        # Lightning's own requeue stays off: the callback checkpoints and exits 75, and the
        # batch script requeues (deploy/slurm/requeue-on-preempt.sh).
        plugins.append(SLURMEnvironment(auto_requeue=False))
    trainer = pl.Trainer(
        accelerator="cpu", devices=1, plugins=plugins, max_epochs=args.epochs, callbacks=callbacks,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, num_sanity_val_steps=1, val_check_interval=0.5,
        deterministic=True,
    )
    trainer.fit(model, train_dataloaders=loader, val_dataloaders=val_loader,
                ckpt_path=ckpt_path)
    torch.save(model.state_dict(), args.out)
    print(f"params sha256 {params_sha256(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
