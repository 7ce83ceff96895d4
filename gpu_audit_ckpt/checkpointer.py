"""Checkpointer: the one object a training loop talks to.

    ckpt = Checkpointer("ckpt/", every_steps=100, generators={"data": rng})
    ckpt.install()                      # preemption signal -> flag + deadline, nothing more
    resumed = ckpt.restore()            # newest valid checkpoint: RNGs restored, state returned
    step = resumed.step if resumed else 0
    while step < total:
        loss = train_one_step(...); step += 1
        ckpt.report(step, loss=loss)    # telemetry + anomaly detection
        if ckpt.should_checkpoint(step):
            ckpt.save(step, {"model": ..., "optim": ...}, cursor=batch_index)
            if ckpt.preempt_requested:
                ckpt.exit_preempted()   # exit code 75: checkpointed, requeue me

One writer per checkpoint directory: in a multi-process job only rank 0 saves (every rank
must agree on the step first, e.g. with an all-reduce of the flag).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, SupportsFloat

from gpu_audit_ckpt import preempt as _preempt
from gpu_audit_ckpt import progress as _progress
from gpu_audit_ckpt import state as _state
from gpu_audit_ckpt import store
from gpu_audit_ckpt.anomaly import Anomaly, LossMonitor
from gpu_audit_ckpt.constants import ENV_CHECKPOINT_DIR, ENV_EVENTS_FILE, EXIT_PREEMPTED
from gpu_audit_ckpt.events import EventLog
from gpu_audit_ckpt.preempt import PreemptFlag


@dataclass(frozen=True, slots=True)
class Resumed:
    """What restore() found: the step to continue from, the data cursor and the user state."""

    step: int
    cursor: Any
    state: Any
    path: Path
    meta: Mapping[str, Any]
    skipped: list[str]  # newer checkpoint directories that did not verify, and why


class Checkpointer:
    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        keep_last: int = 3,
        every_steps: int | None = None,
        every_seconds: float | None = None,
        generators: Mapping[str, Any] | None = None,
        spike_factor: float = 10.0,
        spike_window: int = 50,
        checkpoint_on_anomaly: bool = True,
        events_file: str | Path | None = None,
        torch_weights_only: bool = True,
        clock: Callable[[], float] = time.time,
    ) -> None:
        problems = []
        where = directory if directory is not None else os.environ.get(ENV_CHECKPOINT_DIR)
        if not where:
            problems.append(f"no checkpoint directory: pass one or set {ENV_CHECKPOINT_DIR}")
        if keep_last < 1:
            problems.append(f"keep_last must be >= 1, not {keep_last}")
        if every_steps is not None and every_steps < 1:
            problems.append(f"every_steps must be >= 1, not {every_steps}")
        if every_seconds is not None and not every_seconds > 0:
            problems.append(f"every_seconds must be > 0, not {every_seconds}")
        try:
            self._monitor = LossMonitor(spike_factor, spike_window, min(10, spike_window))
        except ValueError as exc:
            problems.append(str(exc))
        if problems:
            raise ValueError("gpu_audit_ckpt.Checkpointer: " + "; ".join(problems))
        self.directory = Path(str(where))
        self.keep_last = keep_last
        self.every_steps = every_steps
        self.every_seconds = every_seconds
        self.generators = dict(generators or {})
        self.checkpoint_on_anomaly = checkpoint_on_anomaly
        self.torch_weights_only = torch_weights_only
        self._clock = clock
        self.events = EventLog(
            events_file if events_file is not None else os.environ.get(ENV_EVENTS_FILE), clock
        )
        # The process-wide flag when gpu_audit_ckpt.install() already ran, else our own.
        self.flag = _preempt.installed() or PreemptFlag(clock)
        self._acked = False
        self._anomaly: Anomaly | None = None
        self.last_saved_step: int | None = None
        self._last_save_time = clock()
        self.last_commit_seconds: float | None = None
        self._throughput = _progress.Throughput()
        self._environment_sent = False

    # ---- preemption ------------------------------------------------------------------

    def install(
        self, signals: Iterable[str | int] | None = None, grace: float | None = None
    ) -> None:
        """Make the preemption signal(s) set the flag (default: from the environment)."""
        self.flag.install(signals, grace)

    @property
    def preempt_requested(self) -> bool:
        return self.flag.requested

    @property
    def deadline(self) -> float | None:
        """Unix time after which the job will be killed, once a preemption was requested."""
        return self.flag.deadline

    def time_left(self) -> float | None:
        """Seconds until the deadline once a preemption was requested, else None."""
        return self.flag.time_left()

    def _ack(self, step: int | None) -> None:
        """The loop has seen the request: tell the launcher once (signal-to-ack latency)."""
        if not self._acked:
            self._acked = True
            self.events.emit(
                "preempt_requested", step=step, signal=self.flag.signal_name,
                signal_time=self.flag.signal_time, deadline=self.flag.deadline,
            )

    def exit_preempted(self) -> NoReturn:
        """Report and exit with EXIT_PREEMPTED (75); call after save() on preemption."""
        self._ack(self.last_saved_step)
        self.events.emit("preempt_exit", step=self.last_saved_step, code=EXIT_PREEMPTED)
        self.events.close()
        sys.stdout.flush()
        sys.stderr.flush()
        raise SystemExit(EXIT_PREEMPTED)

    # ---- the loop's questions --------------------------------------------------------

    def report(
        self,
        step: int,
        loss: SupportsFloat | None = None,
        *,
        total_steps: int | None = None,
        **metrics: Any,
    ) -> Anomaly | None:
        """Record a step's progress, loss and metrics (a "metrics" event); returns an anomaly.

        The event carries `steps_per_second` (over the last reports) and `total_steps`
        when given, so whoever runs the job can tell how far it is and when it will end.
        The first report also sends the job's software environment (an "environment" event).
        """
        if not self._environment_sent:
            self.report_environment()
        fields: dict[str, Any] = dict(metrics)
        if total_steps is not None:
            fields["total_steps"] = int(total_steps)
        rate = self._throughput.observe(self._clock(), step)
        if rate is not None:
            fields["steps_per_second"] = rate
        if loss is not None:
            fields["loss"] = float(loss)
        self.events.emit("metrics", step=step, **fields)
        if loss is None:
            return None
        return self.observe_loss(step, float(loss))

    def observe_loss(self, step: int, loss: float) -> Anomaly | None:
        """The anomaly check alone (report() calls it): an "anomaly" event, a checkpoint due."""
        anomaly = self._monitor.observe(step, loss)
        if anomaly is not None and anomaly.first_in_streak:
            self.events.emit(
                "anomaly", step=step, kind=anomaly.kind, loss=anomaly.loss,
                median=anomaly.median, spike_factor=self._monitor.spike_factor,
            )
            if self.checkpoint_on_anomaly:
                self._anomaly = anomaly
        return anomaly

    def report_environment(self, **extra: Any) -> dict[str, Any]:
        """Send the "environment" event (Python, torch, CUDA, cuDNN, NCCL...) once per process."""
        self._environment_sent = True
        doc = _progress.environment()
        doc.update(extra)
        return self.events.emit("environment", **doc)

    @property
    def anomaly_pending(self) -> bool:
        """An anomaly was seen and its checkpoint is not taken yet."""
        return self._anomaly is not None

    def clear_anomaly(self) -> None:
        """The pending anomaly's checkpoint was taken by someone else (a framework's save)."""
        self._anomaly = None

    def should_checkpoint(self, step: int) -> bool:
        """True at a step boundary where a checkpoint is due: preemption, anomaly or period."""
        if self.flag.requested:
            self._ack(step)
            return self.last_saved_step != step
        if self._anomaly is not None:
            return True
        if step == self.last_saved_step:
            return False
        if self.every_steps is not None and step > 0 and step % self.every_steps == 0:
            return True
        return (
            self.every_seconds is not None
            and self._clock() - self._last_save_time >= self.every_seconds
        )

    # ---- save and restore -------------------------------------------------------------

    def save(
        self,
        step: int,
        state: Any,
        *,
        cursor: Any = None,
        meta: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> store.Manifest:
        """Commit `state` plus every RNG as the checkpoint of `step` (steps completed).

        `cursor` is the data position to resume from (JSON: an int global batch index, or a
        dict); it defaults to `step`. A pending anomaly makes this an anomaly checkpoint
        (`anomaly-<step>`, never resumed from by default) unless a preemption is pending too.
        """
        files = _state.encode_state(state)
        files[_state.RNG_FILE] = _state.rng_writer(_state.capture_rng(self.generators))
        return self.commit_files(step, files, cursor=cursor, meta=meta, reason=reason)

    def reason_now(self) -> str:
        """Why a checkpoint taken now is taken: preempt, anomaly or periodic."""
        if self.flag.requested:
            return "preempt"
        if self._anomaly is not None:
            return "anomaly"
        return "periodic"

    def commit_files(
        self,
        step: int,
        files: Mapping[str, store.Writer],
        *,
        cursor: Any = None,
        meta: Mapping[str, Any] | None = None,
        reason: str | None = None,
    ) -> store.Manifest:
        """Commit files the caller writes itself (a framework's own checkpoint file) as the
        checkpoint of `step`, with the same protocol, events and retention as save()."""
        reason = reason or self.reason_now()
        prefix = "anomaly" if reason == "anomaly" else "step"
        started = self._clock()
        manifest = store.commit(
            self.directory, step, files,
            cursor=step if cursor is None else cursor, reason=reason, meta=meta, prefix=prefix,
        )
        done = self._clock()
        self.last_commit_seconds = done - started
        self.events.emit(
            "checkpoint_committed", step=step, path=str(manifest.path), reason=reason,
            bytes=manifest.size, duration_s=self.last_commit_seconds,
            signal_time=self.flag.signal_time if reason == "preempt" else None,
        )
        if reason != "preempt":  # the deadline is running: the next save prunes instead
            store.retain(self.directory, self.keep_last, prefix)
        if prefix == "anomaly":
            self._anomaly = None
        else:
            self.last_saved_step = step
            self._last_save_time = done
            self._anomaly = None if reason == "preempt" else self._anomaly
        return manifest

    def restore(self, *, prefix: str = "step") -> Resumed | None:
        """Load the newest checkpoint that verifies and put every RNG back; None if none.

        Removes the temporary directories a killed writer left (one writer per directory).
        """
        store.clean_stale(self.directory)
        manifest, skipped = store.latest(self.directory, prefix)
        if manifest is None:
            if skipped:
                self.events.emit("resume_skipped", skipped=skipped)
            return None
        state = None
        for name in _state.state_files(manifest.files):
            state = _state.decode_state(
                manifest.path, name, weights_only=self.torch_weights_only
            )
        if _state.RNG_FILE in manifest.files:
            rng = json.loads((manifest.path / _state.RNG_FILE).read_bytes())
            _state.restore_rng(rng, self.generators)
        self.last_saved_step = manifest.step
        self._last_save_time = self._clock()
        self.events.emit(
            "resumed", step=manifest.step, path=str(manifest.path), cursor=manifest.cursor,
            skipped=skipped,
        )
        return Resumed(manifest.step, manifest.cursor, state, manifest.path, manifest.meta, skipped)
