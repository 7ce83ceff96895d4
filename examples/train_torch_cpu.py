"""A small PyTorch MLP (Adam, dropout, step LR) on CPU, preemptible and exactly resumable.

Checkpointed: the model, optimizer and LR-scheduler state dicts, the current epoch's batch
order, torch's CPU generator (dropout draws from it), every CUDA generator where there is
one, and the torch.Generator that shuffles (passed to the Checkpointer by name). Batching is
DataLoader-free: a permutation per epoch, indexed by the global batch index, so the resume
cursor is one integer.

    python examples/train_torch_cpu.py --steps 300 --checkpoint-dir /tmp/ckpt --out /tmp/p.pt
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from typing import Any

import gpu_audit_ckpt

# First, before the seconds torch takes to import: from here on a preemption signal only
# sets the flag (the default action would kill the process and lose the work since the
# last checkpoint). Checkpointers created later share this flag.
gpu_audit_ckpt.install()

import torch  # noqa: E402
from torch import nn  # noqa: E402


def make_data(n: int, dim: int, classes: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    teacher = torch.randn(dim, classes, generator=g)
    y = (x @ teacher + 0.5 * torch.randn(n, classes, generator=g)).argmax(dim=1)
    return x, y


def params_sha256(model: nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(bytes(t.detach().contiguous().view(torch.uint8).flatten().tolist()))
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--out", required=True, help="final model state dict (torch.save)")
    ap.add_argument("--every-steps", type=int, default=50, help="periodic checkpoint interval")
    ap.add_argument("--keep-last", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-sleep", type=float, default=0.0,
                    help="seconds to sleep per step (stands in for a slower model in tests)")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)  # same reduction order on every run
    n, dim, hidden, classes = 1024, 16, 64, 4
    x, y = make_data(n, dim, classes, args.seed)
    torch.manual_seed(args.seed + 1)
    model = nn.Sequential(
        nn.Linear(dim, hidden), nn.ReLU(), nn.Dropout(0.2), nn.Linear(hidden, classes)
    )
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=100, gamma=0.5)
    shuffle = torch.Generator().manual_seed(args.seed + 2)
    perm = torch.arange(n)

    ckpt = gpu_audit_ckpt.Checkpointer(
        args.checkpoint_dir, every_steps=args.every_steps, keep_last=args.keep_last,
        generators={"shuffle": shuffle},
    )
    step = 0
    resumed = ckpt.restore()
    if resumed is not None:
        state: dict[str, Any] = resumed.state
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optim"])
        sched.load_state_dict(state["sched"])
        perm = state["perm"]
        step = int(resumed.cursor)
        print(f"resumed from step {step} ({resumed.path})", flush=True)

    per_epoch = n // args.batch_size
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    while step < args.steps:
        b = step % per_epoch
        if b == 0:
            perm = torch.randperm(n, generator=shuffle)
        idx = perm[b * args.batch_size : (b + 1) * args.batch_size]
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(model(x[idx]), y[idx])
        loss.backward()
        opt.step()
        sched.step()
        step += 1
        ckpt.report(step, loss=loss.item(), lr=sched.get_last_lr()[0])
        if ckpt.should_checkpoint(step):
            ckpt.save(
                step,
                {"model": model.state_dict(), "optim": opt.state_dict(),
                 "sched": sched.state_dict(), "perm": perm},
                cursor=step,
            )
            if ckpt.preempt_requested:
                print(f"preempted: checkpoint at step {step} committed", flush=True)
                ckpt.exit_preempted()
        if args.step_sleep:
            time.sleep(args.step_sleep)

    torch.save(model.state_dict(), args.out)
    print(f"params sha256 {params_sha256(model)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
