"""Preempted several times at random steps with real signals, resumed, and bit-identical.

Each test runs an example training script once uninterrupted, then again as a chain of
processes: each is sent a real signal (SIGUSR1 as the launcher and Slurm send, SIGTERM as
Kubernetes sends, SIGUSR2 named through GPU_AUDIT_PREEMPT_SIGNAL) once it reports a randomly
chosen step, must commit a checkpoint and exit 75, and the next resumes from it. The final
parameters must equal the uninterrupted run's byte for byte.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest

from tests.ckpt.preemptrun import SIGNALS, final_hash, finish, run, run_and_preempt, start

SEED = int(os.environ.get("CKPT_TEST_SEED", "20261201"))


def _preempt_chain(
    script: str, steps: int, tmp: Path, *, out: str, step_sleep: float, preemptions: int
) -> None:
    rng = random.Random(SEED)
    ref_proc = start(script, ["--steps", str(steps), "--checkpoint-dir", str(tmp / "ref"),
                              "--out", str(tmp / f"ref.{out}")], tmp / "ref.events")

    args = ["--steps", str(steps), "--checkpoint-dir", str(tmp / "ck"), "--out",
            str(tmp / f"ck.{out}"), "--every-steps", "40", "--step-sleep", str(step_sleep)]
    targets = sorted(rng.sample(range(1, steps - 120), preemptions))
    committed: list[int] = []
    for i, target in enumerate(targets):
        name = rng.choice(["USR1", "TERM"]) if i != 1 else "USR2"
        env = {"GPU_AUDIT_PREEMPT_SIGNAL": "SIGUSR2"} if name == "USR2" else None
        seg = run_and_preempt(script, args, tmp / "ck.events", at_step=target,
                              sig=SIGNALS[name], env=env)
        where = f"segment {i} (SIG{name} at step >= {target})"
        assert seg.rc == 75, f"{where}: rc {seg.rc}\n{seg.stderr}"
        kinds = [e["event"] for e in seg.events]
        assert "preempt_requested" in kinds and kinds[-1] == "preempt_exit", kinds
        commits = [e for e in seg.events if e["event"] == "checkpoint_committed"]
        step = commits[-1]["step"]
        assert isinstance(step, int)
        assert step >= target
        if committed:
            resumed = [e for e in seg.events if e["event"] == "resumed"]
            assert resumed, f"{where}: no resumed event"
            assert resumed[0]["step"] == committed[-1], f"{where}: resumed elsewhere"
        committed.append(step)

    last = run(script, args, tmp / "ck.events")
    ref = finish(ref_proc, tmp / "ref.events")
    assert ref.rc == 0, ref.stderr
    assert last.rc == 0, last.stderr
    assert f"resumed from step {committed[-1]}" in last.stdout
    assert final_hash(last.stdout) == final_hash(ref.stdout)
    assert len(set(committed)) == preemptions, committed


def test_numpy_training_preempted_at_random_steps_ends_bit_identical(tmp_path: Path) -> None:
    """The NumPy example, preempted 4 times (USR1/TERM/USR2), ends with identical params."""
    import numpy as np

    _preempt_chain("train_numpy.py", 500, tmp_path, out="npz", step_sleep=0.003, preemptions=4)
    a, b = np.load(tmp_path / "ref.npz"), np.load(tmp_path / "ck.npz")
    assert sorted(a.files) == sorted(b.files)
    for k in a.files:
        assert a[k].tobytes() == b[k].tobytes(), k


@pytest.mark.slow  # four fresh interpreters importing torch: ~15 s on 2 idle cores
def test_torch_cpu_training_preempted_at_random_steps_ends_bit_identical(tmp_path: Path) -> None:
    """The PyTorch CPU example (Adam, dropout, LR schedule) preempted 3 times: identical."""
    torch = pytest.importorskip(
        "torch", reason="torch is not in the [test] extra; scripts/setup --test installs it"
    )
    _preempt_chain("train_torch_cpu.py", 300, tmp_path, out="pt", step_sleep=0.005, preemptions=3)
    a = torch.load(tmp_path / "ref.pt", weights_only=True)
    b = torch.load(tmp_path / "ck.pt", weights_only=True)
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
