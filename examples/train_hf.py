"""A tiny BERT classifier with the Hugging Face Trainer on CPU, preemptible and exactly resumable.

The model is built from a config (2 layers, hidden size 32; nothing is downloaded) and
trained on random token sequences whose label is a function of the tokens. PreemptionCallback
turns SIGUSR1/SIGTERM into a checkpoint at the next step and exit code 75; running the same
command again resumes from it and ends with the same parameters as an uninterrupted run.

    python examples/train_hf.py --steps 60 --output-dir /tmp/hf --out /tmp/hf.pt
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
from typing import Any

import gpu_audit_ckpt

# First, before the seconds torch and transformers take to import.
gpu_audit_ckpt.install()

import torch  # noqa: E402
from torch.utils.data import Dataset  # noqa: E402
from transformers import (  # noqa: E402
    BertConfig,
    BertForSequenceClassification,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)

from gpu_audit_ckpt.transformers import PreemptionCallback  # noqa: E402

VOCAB, SEQ = 64, 16


class Tokens(Dataset[dict[str, torch.Tensor]]):
    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(1, VOCAB, (n, SEQ), generator=g)
        self.labels = (self.ids[:, :4].sum(dim=1) % 2).long()

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "attention_mask": torch.ones(SEQ, dtype=torch.long),
                "labels": self.labels[i]}


class Sleep(TrainerCallback):  # type: ignore[misc]
    """Stands in for a slower model in tests."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        time.sleep(self.seconds)


def params_sha256(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--output-dir", required=True, help="the Trainer's output_dir (checkpoints)")
    ap.add_argument("--out", required=True, help="final model state dict (torch.save)")
    ap.add_argument("--save-steps", type=int, default=1000, help="periodic Trainer checkpoints")
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-sleep", type=float, default=0.0)
    ap.add_argument("--jit", action="store_true",
                    help="also turn on the Trainer's enable_jit_checkpoint (the callback wins)")
    ap.add_argument("--no-callback", action="store_true", help="baseline for bench/")
    args = ap.parse_args(argv)

    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    config = BertConfig(
        vocab_size=VOCAB, hidden_size=args.hidden, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=2 * args.hidden, max_position_embeddings=SEQ, num_labels=2,
        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
    )
    torch.manual_seed(args.seed)
    model = BertForSequenceClassification(config)
    targs = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps,
        per_device_train_batch_size=args.batch_size,
        learning_rate=1e-3, lr_scheduler_type="linear", warmup_steps=5, logging_steps=5,
        save_strategy="steps", save_steps=args.save_steps, save_total_limit=3, seed=args.seed,
        data_seed=args.seed, use_cpu=True, report_to="none", dataloader_num_workers=0,
        disable_tqdm=True, full_determinism=True,
        **({"enable_jit_checkpoint": True} if args.jit else {}),
    )
    callbacks: list[Any] = []
    if not args.no_callback:
        callbacks.append(PreemptionCallback())
    if args.step_sleep:
        callbacks.append(Sleep(args.step_sleep))
    trainer = Trainer(model=model, args=targs, train_dataset=Tokens(args.samples, args.seed),
                      callbacks=callbacks)
    resume = None if args.no_callback else PreemptionCallback.resume_path(args.output_dir)
    if resume is not None:
        print(f"resuming from {resume}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    torch.save(model.state_dict(), args.out)
    print(f"params sha256 {params_sha256(model)}", flush=True)
    return 0


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    sys.exit(main())
