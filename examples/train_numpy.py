"""A small NumPy MLP classifier trained with SGD + momentum, preemptible and exactly resumable.

Every source of randomness is checkpointed, so a run preempted any number of times ends
with the same parameters, bit for bit, as one that never stopped:
- minibatch order: a per-epoch permutation from a seeded numpy Generator ("data");
- dropout masks: a second Generator ("dropout");
- input jitter: NumPy's global generator, switched on per step by Python's `random`.

    python examples/train_numpy.py --steps 600 --checkpoint-dir /tmp/ckpt --out /tmp/params.npz

Under the gpu-audit launcher, Slurm (--signal=USR1@120 --requeue) or Kubernetes, the
preemption signal makes it commit a checkpoint at the next step and exit with code 75;
run the same command again to resume.
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from typing import Any

import gpu_audit_ckpt

# First, before importing numpy: from here on a preemption signal only sets the flag.
gpu_audit_ckpt.install()

import numpy as np  # noqa: E402


def make_data(n: int, dim: int, seed: int) -> tuple[Any, Any]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, dim))
    teacher = rng.standard_normal(dim)
    y = (np.tanh(x @ teacher) + 0.3 * rng.standard_normal(n) > 0).astype(np.float64)
    return x, y


def init_params(dim: int, hidden: int, seed: int) -> dict[str, Any]:
    rng = np.random.default_rng(seed)
    return {
        "w1": rng.standard_normal((dim, hidden)) / np.sqrt(dim),
        "b1": np.zeros(hidden),
        "w2": rng.standard_normal(hidden) / np.sqrt(hidden),
        "b2": np.zeros(1),
    }


def params_sha256(params: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for name in sorted(params):
        h.update(name.encode())
        h.update(np.ascontiguousarray(params[name]).tobytes())
    return h.hexdigest()


def train_step(
    params: dict[str, Any], momentum: dict[str, Any], xb: Any, yb: Any,
    *, drop_rng: Any, lr: float, dropout: float,
) -> float:
    h = np.tanh(xb @ params["w1"] + params["b1"])
    mask = (drop_rng.random(h.shape) >= dropout) / (1.0 - dropout)
    hd = h * mask
    logits = hd @ params["w2"] + params["b2"][0]
    p = 1.0 / (1.0 + np.exp(-logits))
    eps = 1e-12
    loss = float(-np.mean(yb * np.log(p + eps) + (1 - yb) * np.log(1 - p + eps)))
    g_logits = (p - yb) / len(yb)
    grads = {"w2": hd.T @ g_logits, "b2": np.array([g_logits.sum()])}
    g_h = np.outer(g_logits, params["w2"]) * mask * (1 - h**2)
    grads["w1"] = xb.T @ g_h
    grads["b1"] = g_h.sum(axis=0)
    for k, g in grads.items():
        momentum[k] = 0.9 * momentum[k] + g
        params[k] = params[k] - lr * momentum[k]
    return loss


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--checkpoint-dir", required=True)
    ap.add_argument("--out", required=True, help="final parameters (.npz)")
    ap.add_argument("--every-steps", type=int, default=50, help="periodic checkpoint interval")
    ap.add_argument("--keep-last", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-sleep", type=float, default=0.0,
                    help="seconds to sleep per step (stands in for a slower model in tests)")
    args = ap.parse_args(argv)

    n, dim, hidden, dropout = 1024, 16, 32, 0.2
    x, y = make_data(n, dim, args.seed)
    data_rng = np.random.default_rng(args.seed + 1)
    drop_rng = np.random.default_rng(args.seed + 2)
    np.random.seed(args.seed + 3)
    random.seed(args.seed + 4)
    params = init_params(dim, hidden, args.seed + 5)
    momentum = {k: np.zeros_like(v) for k, v in params.items()}
    perm = np.arange(n)

    ckpt = gpu_audit_ckpt.Checkpointer(
        args.checkpoint_dir, every_steps=args.every_steps, keep_last=args.keep_last,
        generators={"data": data_rng, "dropout": drop_rng},
    )
    step = 0
    resumed = ckpt.restore()
    if resumed is not None:
        state = resumed.state
        params, momentum, perm = state["params"], state["momentum"], state["perm"]
        step = int(resumed.cursor)  # one batch per step: the global batch index is the step
        print(f"resumed from step {step} ({resumed.path})", flush=True)

    per_epoch = n // args.batch_size
    while step < args.steps:
        b = step % per_epoch
        if b == 0:
            perm = data_rng.permutation(n)
        idx = perm[b * args.batch_size : (b + 1) * args.batch_size]
        xb = x[idx]
        if random.random() < 0.5:  # noqa: S311 - training noise, checkpointed on purpose
            xb = xb + 0.05 * np.random.standard_normal(xb.shape)
        loss = train_step(
            params, momentum, xb, y[idx], drop_rng=drop_rng, lr=args.lr, dropout=dropout
        )
        step += 1
        ckpt.report(step, loss=loss, epoch=step // per_epoch)
        if ckpt.should_checkpoint(step):
            ckpt.save(step, {"params": params, "momentum": momentum, "perm": perm}, cursor=step)
            if ckpt.preempt_requested:
                print(f"preempted: checkpoint at step {step} committed", flush=True)
                ckpt.exit_preempted()
        if args.step_sleep:
            time.sleep(args.step_sleep)

    np.savez(args.out, **params)
    print(f"params sha256 {params_sha256(params)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
