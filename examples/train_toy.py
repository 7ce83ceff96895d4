"""A tiny pure-Python training loop (standard library + gpu_audit_ckpt only): linear
regression by SGD with a seeded `random`, preemptible and exactly resumable.

    PYTHONPATH=. python3 examples/train_toy.py --steps 400 --out /tmp/w.json

It needs nothing but Python, so it runs under any account on a node (the launcher's tests
and README use it); examples/train_numpy.py is the realistic one.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from gpu_audit_ckpt import Checkpointer


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, required=True)
    ap.add_argument("--out", required=True, help="final weights (JSON)")
    ap.add_argument("--checkpoint-dir", default=None, help="default: $GPU_AUDIT_CHECKPOINT_DIR")
    ap.add_argument("--every-steps", type=int, default=100)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    args = ap.parse_args(argv)

    truth = [0.5, -1.25, 2.0, 0.75]
    random.seed(1234)
    w = [0.0] * len(truth)
    ckpt = Checkpointer(args.checkpoint_dir, every_steps=args.every_steps)
    ckpt.install()
    step = 0
    resumed = ckpt.restore()
    if resumed is not None:
        w, step = list(resumed.state["w"]), int(resumed.cursor)
        print(f"resumed from step {step}", flush=True)
    while step < args.steps:
        x = [random.gauss(0.0, 1.0) for _ in truth]
        y = sum(a * b for a, b in zip(truth, x, strict=True)) + random.gauss(0.0, 0.1)
        err = sum(a * b for a, b in zip(w, x, strict=True)) - y
        w = [wi - 0.01 * err * xi for wi, xi in zip(w, x, strict=True)]
        step += 1
        ckpt.report(step, loss=err * err)
        if ckpt.should_checkpoint(step):
            ckpt.save(step, {"w": w}, cursor=step)
            if ckpt.preempt_requested:
                print(f"preempted: checkpoint at step {step} committed", flush=True)
                ckpt.exit_preempted()
        if args.step_sleep:
            time.sleep(args.step_sleep)
    with open(args.out, "w", encoding="utf-8") as fh:
        json.dump(w, fh)
    print(f"done: {step} steps, w = {[round(v, 4) for v in w]}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
