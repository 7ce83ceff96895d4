"""Job-side checkpoint helper for training scripts (standard library only).

Imported inside a user's training environment; it must never import gpu_audit or any
other part of gpu-audit, nor any third-party package except numpy/torch when the training
script already loaded them. docs/CHECKPOINT.md is the manual.
"""

from gpu_audit_ckpt.anomaly import Anomaly, LossMonitor
from gpu_audit_ckpt.checkpointer import Checkpointer, Resumed
from gpu_audit_ckpt.constants import (
    ENV_CHECKPOINT_DIR,
    ENV_EVENTS_FILE,
    ENV_PREEMPT_GRACE_SECONDS,
    ENV_PREEMPT_SIGNAL,
    EXIT_PREEMPTED,
)
from gpu_audit_ckpt.events import EventLog
from gpu_audit_ckpt.preempt import PreemptFlag, install
from gpu_audit_ckpt.store import InvalidCheckpoint, Manifest, latest, verify

__all__ = [
    "ENV_CHECKPOINT_DIR",
    "ENV_EVENTS_FILE",
    "ENV_PREEMPT_GRACE_SECONDS",
    "ENV_PREEMPT_SIGNAL",
    "EXIT_PREEMPTED",
    "Anomaly",
    "Checkpointer",
    "EventLog",
    "InvalidCheckpoint",
    "LossMonitor",
    "Manifest",
    "PreemptFlag",
    "Resumed",
    "install",
    "latest",
    "verify",
]
