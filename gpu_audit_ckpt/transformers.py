"""Hugging Face Trainer integration: a checkpoint at the next step on preemption, exit 75.

    from gpu_audit_ckpt.transformers import PreemptionCallback

    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[PreemptionCallback()])
    trainer.train(resume_from_checkpoint=PreemptionCallback.resume_path(args.output_dir))

SIGUSR1 or SIGTERM (or $GPU_AUDIT_PREEMPT_SIGNAL) sets a flag; at the next `on_step_end` the
callback asks the Trainer for a save (`control.should_save`), and when the Trainer has
written `checkpoint-<step>` (its own format: model, optimizer, scheduler, RNG states,
trainer state) `on_save` fsyncs every file, seals the directory with a manifest
(`gpu-audit-manifest.json`: each file's size and SHA-256, written last, atomically) and
exits with code 75. Every checkpoint the Trainer saves while the callback is present is
sealed the same way; `resume_path()` names the newest one whose manifest verifies, so a
checkpoint torn by a kill mid-save is never resumed from. Exactness on resume is the
Trainer's own (it skips the trained batches and restores RNGs when `ignore_data_skip` is
False, the default).

Signals: the Trainer installs a SIGTERM handler only with `enable_jit_checkpoint=True`
(it then saves a few seconds after SIGTERM, from whichever hook comes next). This callback
takes SIGTERM over when the Trainer is built and again when training begins, so one
handler decides; leave `enable_jit_checkpoint` off with it (docs/CHECKPOINT.md).

Imports nothing transformers does not import itself.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from gpu_audit_ckpt.checkpointer import Checkpointer
from gpu_audit_ckpt.constants import ENV_EVENTS_FILE
from gpu_audit_ckpt.events import EventLog
from gpu_audit_ckpt.store import FORMAT, FORMAT_VERSION, fsync_dir

SEAL = "gpu-audit-manifest.json"
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
_CHUNK = 1 << 20
# Progress is reported at every logging step and at least this often in between.
REPORT_MAX_SECONDS = 30.0


def _files(directory: Path) -> list[Path]:
    return sorted(
        p for p in directory.rglob("*")
        if p.is_file() and p.name != SEAL and not p.name.startswith(SEAL)
    )


def _hash_file(path: Path, *, fsync: bool) -> tuple[str, int]:
    h = hashlib.sha256()
    size = 0
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            h.update(chunk)
            size += len(chunk)
        if fsync:  # the Trainer does not fsync what it writes
            os.fsync(fh.fileno())
    return h.hexdigest(), size


def seal(directory: Path, step: int, reason: str) -> int:
    """Fsync every file of a Trainer checkpoint and commit its manifest; returns the bytes."""
    entries: dict[str, dict[str, Any]] = {}
    for path in _files(directory):
        digest, size = _hash_file(path, fsync=True)
        entries[path.relative_to(directory).as_posix()] = {"sha256": digest, "size": size}
    for sub in sorted({p.parent for p in directory.rglob("*") if p.is_file()}):
        fsync_dir(sub)
    body = {"format": FORMAT, "version": FORMAT_VERSION, "step": step, "reason": reason,
            "files": entries}
    canon = json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    doc = dict(body, manifest_sha256=hashlib.sha256(canon).hexdigest())
    tmp = directory / (SEAL + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(json.dumps(doc, sort_keys=True, indent=1).encode() + b"\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.rename(tmp, directory / SEAL)
    fsync_dir(directory)
    return sum(int(e["size"]) for e in entries.values())


def verify_sealed(directory: Path) -> dict[str, Any]:
    """The manifest of a sealed checkpoint after hashing every file; ValueError says why not."""
    try:
        doc = json.loads((directory / SEAL).read_bytes())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{directory.name}: no readable {SEAL} ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise ValueError(f"{directory.name}: {SEAL} is not a gpu-audit-ckpt manifest")
    claimed = doc.pop("manifest_sha256", None)
    canon = json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
    if claimed != hashlib.sha256(canon).hexdigest():
        raise ValueError(f"{directory.name}: {SEAL} does not match its own hash")
    problems = []
    files = doc.get("files", {})
    for name, entry in files.items():
        try:
            digest, size = _hash_file(directory / name, fsync=False)
        except OSError as exc:
            problems.append(f"{name}: {exc.strerror}")
            continue
        if size != entry.get("size") or digest != entry.get("sha256"):
            problems.append(f"{name}: size or SHA-256 differs from the manifest")
    extra = {p.relative_to(directory).as_posix() for p in _files(directory)} - files.keys()
    if extra:
        problems.append(f"files not in the manifest: {sorted(extra)}")
    if problems:
        raise ValueError(f"{directory.name}: " + "; ".join(problems))
    return doc


class PreemptionCallback(TrainerCallback):
    """Preemption (exit 75), anomaly checkpoints, progress and environment reports."""

    def __init__(
        self,
        *,
        spike_factor: float = 10.0,
        spike_window: int = 50,
        checkpoint_on_anomaly: bool = True,
        events_file: str | Path | None = None,
        signals: Iterable[str | int] | None = None,
    ) -> None:
        self._spike = (spike_factor, spike_window, checkpoint_on_anomaly)
        self._events_file = events_file
        self._make(".")  # bad settings fail here, when the script starts, not at train time
        self._signals = list(signals) if signals is not None else None
        self.checkpointer: Checkpointer | None = None
        self._report_due = 0.0

    @staticmethod
    def resume_path(output_dir: str | Path) -> str | None:
        """The newest sealed `checkpoint-<N>` under output_dir that verifies, or None.

        Anomaly checkpoints are never resumed from; torn or unsealed ones are skipped.
        """
        found: list[tuple[int, Path]] = []
        try:
            for entry in os.scandir(output_dir):
                m = _CHECKPOINT.match(entry.name)
                if m and entry.is_dir(follow_symlinks=False):
                    found.append((int(m.group(1)), Path(entry.path)))
        except FileNotFoundError:
            return None
        events = EventLog(os.environ.get(ENV_EVENTS_FILE))
        skipped: list[str] = []
        for step, path in sorted(found, reverse=True):
            try:
                doc = verify_sealed(path)
            except ValueError as exc:
                skipped.append(str(exc))
                continue
            if doc.get("reason") != "anomaly":
                events.emit("resumed", step=step, path=str(path), cursor=step, skipped=skipped)
                events.close()
                return str(path)
        if skipped:
            events.emit("resume_skipped", skipped=skipped)
            events.close()
        return None

    # ---- hooks -----------------------------------------------------------------------

    def _make(self, directory: str) -> Checkpointer:
        factor, window, on_anomaly = self._spike
        return Checkpointer(directory, spike_factor=factor, spike_window=window,
                            checkpoint_on_anomaly=on_anomaly, events_file=self._events_file)

    def _ck(self, args: Any) -> Checkpointer:
        if self.checkpointer is None:
            self.checkpointer = self._make(str(args.output_dir))
        return self.checkpointer

    def on_init_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Early: a preemption while the model and data load only sets the flag.
        self._ck(args).flag.install(self._signals)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ck = self._ck(args)
        ck.flag.install(self._signals)  # after anything else that took SIGTERM
        if state.is_world_process_zero:
            ck.report_environment()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ck = self._ck(args)
        step = state.global_step
        now = time.monotonic()
        if state.is_world_process_zero and not control.should_log and now >= self._report_due:
            # Logging steps are reported from on_log, with their loss; in between, progress
            # at least every REPORT_MAX_SECONDS (an ETA even when logging is rare).
            self._report_due = now + REPORT_MAX_SECONDS
            ck.report(step, total_steps=state.max_steps or None, epoch=state.epoch)
        if ck.flag.requested:
            ck.should_checkpoint(step)  # acknowledges the request (preempt_requested event)
            control.should_save = True
            control.should_training_stop = True
        elif ck.anomaly_pending:
            control.should_save = True

    def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any,
               ) -> None:
        if not state.is_world_process_zero or not logs or "loss" not in logs:
            return
        ck = self._ck(args)
        extra = {k: v for k, v in logs.items()
                 if k in ("learning_rate", "grad_norm") and isinstance(v, int | float)}
        self._report_due = time.monotonic() + REPORT_MAX_SECONDS
        ck.report(state.global_step, loss=logs["loss"], total_steps=state.max_steps or None,
                  epoch=state.epoch, **extra)
        if ck.anomaly_pending:
            control.should_save = True

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        ck = self._ck(args)
        step = state.global_step
        reason = ck.reason_now()
        if state.is_world_process_zero:
            path = Path(args.output_dir) / f"checkpoint-{step}"
            if path.is_dir():
                started = ck._clock()
                size = seal(path, step, reason)
                ck.events.emit(
                    "checkpoint_committed", step=step, path=str(path), reason=reason,
                    bytes=size, duration_s=ck._clock() - started,
                    signal_time=ck.flag.signal_time if reason == "preempt" else None,
                )
                ck.last_saved_step = step
                if reason == "anomaly":
                    ck.clear_anomaly()
        if ck.flag.requested:
            ck.exit_preempted()
