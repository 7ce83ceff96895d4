"""PyTorch Lightning integration: preemption checkpoints that resume bit-identically, mid-epoch.

    from gpu_audit_ckpt.lightning import PreemptionCheckpoint

    g = torch.Generator().manual_seed(0)
    loader = DataLoader(ds, batch_size=32, shuffle=True, generator=g)
    cb = PreemptionCheckpoint("ckpt/", generators={"loader": g})
    trainer = L.Trainer(max_epochs=3, callbacks=[cb])
    trainer.fit(model, train_dataloaders=loader, ckpt_path=cb.resume_path())

SIGUSR1 or SIGTERM (or $GPU_AUDIT_PREEMPT_SIGNAL) -> a checkpoint at the next optimizer-step
boundary, mid-epoch included, then SystemExit(75). The checkpoint is Lightning's own
(`trainer.save_checkpoint`, public) committed through the helper's atomic, SHA-256-verified
store; `resume_path()` names the newest one that verifies.

What exactness takes, and where this uses Lightning internals (docs/CHECKPOINT.md):
- Lightning restores its step counters but replays a plain DataLoader from batch 0. The
  callback rewinds each named loader generator to its state at the start of the interrupted
  epoch (before Lightning creates the loader's iterator) and, at `on_train_start`, draws and
  drops the batches already trained from the iterator Lightning made: `trainer.fit_loop.
  _data_fetcher.iterator` is the one private attribute used (a DataLoader with
  `state_dict`/`load_state_dict` is resumed by Lightning itself and nothing is skipped).
  Replaying through the iterator rather than the sampler keeps worker RNG streams exact.
- Global RNGs (Python, NumPy, torch CPU and CUDA) are put back right before the first
  resumed step (`on_train_batch_start`), not at load time: restoring them earlier would let
  Lightning's own work between load and the first step (validation fast-forward, the
  sanity check) draw from them.
- Validation must not move the training RNG stream (the validation loader draws its base
  seed from the global torch RNG, and a resumed run skips the validation it was interrupted
  before): the global RNG state at each step end is put back when validation ends.
- Lightning restores a checkpoint taken on an epoch's last batch with its epoch counters
  one behind (a later mid-epoch checkpoint then resumes at the wrong batch), so the callback
  checkpoints at the next step boundary instead: the first step of the next epoch.
- Lightning installs its own SIGTERM handler when fit starts (it would end the run with
  exit 1 at the next batch); the callback takes SIGTERM back at `on_train_start`.

Imports nothing Lightning does not import itself (a test compares sys.modules).
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import sys
import time
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import lightning.pytorch as pl
import torch

from gpu_audit_ckpt import state as _state
from gpu_audit_ckpt import store
from gpu_audit_ckpt.checkpointer import Checkpointer

CKPT_FILE = "lightning.ckpt"
LIGHTNING_VERSION = str(getattr(pl, "__version__", "0.0"))
STATE_VERSION = 1
# Lightning versions whose loop internals this was tested against (tests/ckpt and scripts/setup
# pin the same range); others warn once, since mid-epoch exactness leans on fit-loop details.
SUPPORTED_LIGHTNING = ((2, 6), (2, 7))  # [from, to): 2.6.x
# Progress is reported at least this often whatever the step cadence (an ETA for slow steps).
REPORT_MAX_SECONDS = 30.0
_NOT_RESUMABLE_WARNING = "You're resuming from a checkpoint that ended before the epoch ended"


def _lightning_version() -> tuple[int, int]:
    parts = LIGHTNING_VERSION.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return (0, 0)


def _snapshot() -> tuple[Any, ...]:
    """The global RNG states, raw (cheap: taken at every step end while validation exists)."""
    np = sys.modules.get("numpy")
    cuda = (
        torch.cuda.get_rng_state_all()
        if torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
        else None
    )
    return (random.getstate(), np.random.get_state() if np is not None else None,
            torch.get_rng_state(), cuda)


def _put_back(snap: tuple[Any, ...]) -> None:
    py, np_state, cpu, cuda = snap
    random.setstate(py)
    if np_state is not None:
        sys.modules["numpy"].random.set_state(np_state)
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state_all(cuda)


def _stateful(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None))


class PreemptionCheckpoint(pl.Callback):
    """Checkpoint on preemption (exit 75), on a training anomaly, and optionally periodically.

    `generators`: the torch.Generator objects the training DataLoaders shuffle with (e.g.
    `{"loader": g}`); each is rewound to its state at the start of the interrupted epoch on
    resume. Without one, a shuffled loader draws its order from the global RNG at a point
    that a mid-epoch resume cannot replay.
    """

    def __init__(
        self,
        dirpath: str | Path | None = None,
        *,
        generators: Mapping[str, Any] | None = None,
        every_n_steps: int | None = None,
        every_seconds: float | None = None,
        keep_last: int = 3,
        monitor: str | None = None,
        report_every_n_steps: int | None = None,
        spike_factor: float = 10.0,
        spike_window: int = 50,
        checkpoint_on_anomaly: bool = True,
        events_file: str | Path | None = None,
        signals: Iterable[str | int] | None = None,
    ) -> None:
        super().__init__()
        problems = [
            f"generators[{name!r}] is a {type(g).__name__}, not a torch.Generator"
            for name, g in (generators or {}).items()
            if not isinstance(g, torch.Generator)
        ]
        if report_every_n_steps is not None and report_every_n_steps < 1:
            problems.append(f"report_every_n_steps must be >= 1, not {report_every_n_steps}")
        if problems:
            raise ValueError("PreemptionCheckpoint: " + "; ".join(problems))
        self.checkpointer = Checkpointer(
            dirpath, keep_last=keep_last, every_steps=every_n_steps,
            every_seconds=every_seconds, spike_factor=spike_factor, spike_window=spike_window,
            checkpoint_on_anomaly=checkpoint_on_anomaly, events_file=events_file,
        )
        self.dirpath = self.checkpointer.directory
        self.generators: dict[str, torch.Generator] = dict(generators or {})
        self.monitor = monitor
        self.report_every_n_steps = report_every_n_steps
        self._signals = list(signals) if signals is not None else None
        self._epoch_start: dict[str, torch.Tensor] = {}
        self._resume: dict[str, Any] | None = None
        self._rng_at_step_end: tuple[Any, ...] | None = None
        self._isolate_validation = False
        self._snapshot_every_step = False
        self._snapshot_step = -1
        self._batches_done = 0
        self._at_epoch_end = False
        self._trained_since_capture = False
        self._last_step = -1
        self._total_steps: int | None = None
        self._global_zero = True
        self._n_batches = 1 << 62
        self._val_every: int | None = None
        self._val_by_total = False
        self._report_every = 1
        self._reported_step = 0
        self._report_due = 0.0
        self._installed = False

    # ---- what the script calls ------------------------------------------------------

    def resume_path(self) -> str | None:
        """The newest committed checkpoint that verifies (for `fit(ckpt_path=...)`), or None."""
        ck = self.checkpointer
        store.clean_stale(self.dirpath)  # before fit: no writer of ours is running
        manifest, skipped = store.latest(self.dirpath)
        if manifest is None or CKPT_FILE not in manifest.files:
            if skipped:
                ck.events.emit("resume_skipped", skipped=skipped)
            return None
        ck.last_saved_step = manifest.step
        ck.events.emit("resumed", step=manifest.step, path=str(manifest.path),
                       cursor=manifest.cursor, skipped=skipped)
        return str(manifest.path / CKPT_FILE)

    # ---- state in Lightning's checkpoint (public Callback API) ---------------------------

    def state_dict(self) -> dict[str, Any]:
        if self._at_epoch_end:  # the next epoch starts from the generators as they are now
            gens = {n: g.get_state() for n, g in self.generators.items()}
            done = 0
        else:
            gens = dict(self._epoch_start)
            done = self._batches_done
        return {
            "version": STATE_VERSION,
            "batches_done": done,
            "epoch_start_generators": gens,
            "rng": _state.capture_rng({}),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if state_dict.get("version") != STATE_VERSION:
            raise ValueError(
                f"PreemptionCheckpoint: checkpoint state version {state_dict.get('version')!r}"
                f" is not {STATE_VERSION}")
        saved = state_dict["epoch_start_generators"]
        missing = sorted(self.generators.keys() - saved.keys())
        extra = sorted(saved.keys() - self.generators.keys())
        if missing or extra:
            warnings.warn(
                f"gpu_audit_ckpt: generators saved {sorted(saved)} but given "
                f"{sorted(self.generators)}: the resumed data order may differ",
                RuntimeWarning, stacklevel=2)
        # Rewound now, before Lightning creates the loader's iterator (its base seed and the
        # sampler's permutation come from the generator): the interrupted epoch's order again.
        for name, g in self.generators.items():
            if name in saved:
                g.set_state(saved[name])
        self._epoch_start = {n: saved[n] for n in self.generators if n in saved}
        self._resume = state_dict
        if state_dict["batches_done"]:
            # We replay the loader ourselves; Lightning's advice to make it stateful is moot.
            warnings.filterwarnings("ignore", message=_NOT_RESUMABLE_WARNING)

    # ---- hooks ---------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        lo, hi = SUPPORTED_LIGHTNING
        if not lo <= _lightning_version() < hi:
            warnings.warn(
                f"gpu_audit_ckpt: Lightning {LIGHTNING_VERSION} is outside the tested "
                f"{lo[0]}.{lo[1]} <= v < {hi[0]}.{hi[1]}; mid-epoch resume may not be exact",
                RuntimeWarning, stacklevel=2)
        if trainer.is_global_zero:
            self.checkpointer.report_environment()
        self._take_signals()
        self._epoch_start = {n: g.get_state() for n, g in self.generators.items()}
        self._isolate_validation = (
            type(pl_module).validation_step is not pl.LightningModule.validation_step)

    def _take_signals(self) -> None:
        self.checkpointer.flag.install(self._signals)
        self._installed = True

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # Lightning replaced our SIGTERM handler when fit started: take it back.
        self._take_signals()
        self._last_step = trainer.global_step
        self._global_zero = trainer.is_global_zero
        self._epoch_facts(trainer)
        # Trainer(log_every_n_steps=...): set by its logger connector, not declared (hence getattr)
        logging_every = int(getattr(trainer, "log_every_n_steps", 50))
        self._report_every = self.report_every_n_steps or max(1, logging_every)
        self._reported_step, self._report_due = -(1 << 62), 0.0
        est = trainer.estimated_stepping_batches
        self._total_steps = int(est) if est != float("inf") else None
        resume = self._resume
        if resume is None or not resume["batches_done"]:
            return
        skip = int(resume["batches_done"])
        loop = trainer.fit_loop
        combined = loop._combined_loader
        if combined is not None and all(_stateful(dl) for dl in combined.flattened):
            return  # Lightning restored the loaders' own positions
        fetcher = loop._data_fetcher
        expected = loop.epoch_loop.batch_progress.current.ready
        if fetcher is None or fetcher.iterator is None or expected != skip:
            raise RuntimeError(
                f"gpu_audit_ckpt: cannot replay the interrupted epoch (Lightning "
                f"{LIGHTNING_VERSION} resumed at batch {expected}, the checkpoint says {skip})")
        buffered = getattr(fetcher, "batches", None)  # a prefetching fetcher's queue
        for _ in range(skip):
            if buffered:
                buffered.pop(0)
                with contextlib.suppress(StopIteration):
                    buffered.append(next(fetcher.iterator))
            else:
                next(fetcher.iterator)

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._resume is not None:
            # Right before the first resumed step: nothing Lightning does on the way here
            # (validation fast-forward, loader replay) can move the stream we restore.
            _state.restore_rng(self._resume["rng"], {})
            self._resume = None

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        # The next epoch's iterator is created after this hook: its starting generator state.
        # Not when no batch was trained since the last capture: a run resumed from an
        # epoch-end checkpoint finishes the old epoch here after it already created the new
        # epoch's iterator from the rewound generators, which now stand past that point.
        if self._trained_since_capture:
            self._epoch_start = {n: g.get_state() for n, g in self.generators.items()}
            self._trained_since_capture = False

    def _validation_may_follow(self, trainer: pl.Trainer, done: int) -> bool:
        """Whether validation can run after this batch (a snapshot costs tens of us, so it
        is taken only then); a superset of Lightning's own rule, corrected at run time."""
        every = self._val_every
        if every is None:
            return True  # time-based or unknown: every step
        if self._val_by_total:
            return (trainer.fit_loop.total_batch_idx + 1) % every == 0
        return done % every == 0

    @staticmethod
    def _another_epoch_follows(trainer: pl.Trainer, step: int) -> bool:
        epochs = trainer.max_epochs
        more = epochs is None or epochs < 0 or trainer.current_epoch + 1 < epochs
        return more and (trainer.max_steps < 0 or step < trainer.max_steps)

    def _epoch_facts(self, trainer: pl.Trainer) -> None:
        """What the per-step hook needs, read once per epoch (loaders may be reloaded)."""
        n = trainer.num_training_batches
        self._n_batches = int(n) if n != float("inf") else 1 << 62
        every = trainer.val_check_batch
        self._val_every = every if isinstance(every, int) and every >= 1 else None
        self._val_by_total = trainer.check_val_every_n_epoch is None

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._epoch_facts(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or not self._isolate_validation:
            return
        if self._rng_at_step_end is None or self._snapshot_step != trainer.global_step:
            # The rule above missed this validation: its draws cannot be undone now. Say so
            # and take the snapshot at every step from here on.
            if not self._snapshot_every_step:
                warnings.warn(
                    "gpu_audit_ckpt: a validation ran where none was expected; its RNG draws "
                    "are not isolated from training this once (snapshots at every step from "
                    "now on)", RuntimeWarning, stacklevel=2)
            self._snapshot_every_step = True
            self._rng_at_step_end = None

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or self._rng_at_step_end is None:
            return
        _put_back(self._rng_at_step_end)
        self._rng_at_step_end = None

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any,
        batch_idx: int,
    ) -> None:
        # Per step: a handful of attribute reads unless a report, a snapshot or a save is due
        # (bench/bench_ckpt_frameworks.py measures it against the 1 % budget).
        done = self._batches_done = batch_idx + 1
        self._trained_since_capture = True
        at_end = self._at_epoch_end = done >= self._n_batches
        step = trainer.global_step
        if self._isolate_validation and (
                at_end or self._snapshot_every_step or self._validation_may_follow(trainer, done)):
            self._rng_at_step_end = _snapshot()
            self._snapshot_step = step
        if step == self._last_step:
            return  # accumulating gradients: not a step boundary
        self._last_step = step
        ck = self.checkpointer
        now = time.monotonic()
        if self._global_zero and (
                step - self._reported_step >= self._report_every or now >= self._report_due):
            # At Lightning's logging cadence (or report_every_n_steps), and at least every
            # REPORT_MAX_SECONDS: reading the loss is a device sync on a GPU, and a line per
            # step of a fast model is noise for whoever reads the events file.
            self._reported_step, self._report_due = step, now + REPORT_MAX_SECONDS
            loss = self._loss(trainer, outputs)
            ck.report(step, loss=loss, total_steps=self._total_steps, epoch=trainer.current_epoch)
        if at_end and self._another_epoch_follows(trainer, step):
            # Never on an epoch's last batch while another epoch follows: Lightning restores
            # such a checkpoint with its epoch counters one behind, so the next mid-epoch
            # checkpoint would resume at the wrong batch. The next step boundary (the first
            # step of the next epoch) is taken instead.
            return
        if ck.should_checkpoint(step):
            self._save(trainer, step)
            if ck.preempt_requested:
                ck.exit_preempted()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit" and self._installed:
            self.checkpointer.flag.uninstall()
            self._installed = False

    # ---- helpers ---------------------------------------------------------------------------

    def _loss(self, trainer: pl.Trainer, outputs: Any) -> float | None:
        value: Any
        if self.monitor is not None:
            value = trainer.callback_metrics.get(self.monitor)
        elif isinstance(outputs, Mapping):
            value = outputs.get("loss")
        else:
            value = outputs
        if isinstance(value, torch.Tensor) and value.numel() == 1:
            return float(value.item())
        if isinstance(value, int | float):
            return float(value)
        return None

    def _save(self, trainer: pl.Trainer, step: int) -> None:
        ck = self.checkpointer
        staging = self.dirpath / f".tmp-lightning-{os.getpid()}-{secrets.token_hex(4)}.ckpt"

        def write(fh: IO[bytes]) -> None:
            # Lightning writes its own checkpoint (public API: strategy, CheckpointIO and
            # callbacks' state included); the store hashes it on its way into the commit.
            try:
                trainer.save_checkpoint(staging)
                with open(staging, "rb") as src:
                    shutil.copyfileobj(src, fh, 1 << 20)
            finally:
                staging.unlink(missing_ok=True)

        self.dirpath.mkdir(parents=True, exist_ok=True)
        if trainer.is_global_zero:
            ck.commit_files(step, {CKPT_FILE: write}, cursor=step,
                            meta={"epoch": trainer.current_epoch})
        else:  # every rank joins save_checkpoint's collectives; rank 0 alone commits
            trainer.save_checkpoint(staging)
