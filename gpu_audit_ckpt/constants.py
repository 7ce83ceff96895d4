"""The helper's contract with whatever runs the job: the exit code and environment names.

The launcher keeps its own copy of these values (launcher/constants.py); the helper may not
import it (it runs in a user's training environment), so a launcher test compares the two.
"""

from __future__ import annotations

# A job that committed a checkpoint after a preemption signal exits with this code
# (EX_TEMPFAIL in sysexits.h, "try again later"): neither success nor failure, requeue me.
EXIT_PREEMPTED = 75

# The signal (a name such as "SIGUSR1" or "USR1", several comma-separated) that asks the job
# to checkpoint and exit. Unset: SIGUSR1 and SIGTERM (Slurm --signal=USR1@N, Kubernetes).
ENV_PREEMPT_SIGNAL = "GPU_AUDIT_PREEMPT_SIGNAL"
# Seconds from that signal until the job is killed; the helper's deadline is signal + grace.
ENV_PREEMPT_GRACE_SECONDS = "GPU_AUDIT_PREEMPT_GRACE_SECONDS"
# The checkpoint directory when the training script does not name one.
ENV_CHECKPOINT_DIR = "GPU_AUDIT_CHECKPOINT_DIR"
# A file the helper appends JSON lines to (checkpoint_committed, metrics, anomaly,
# preempt_requested, resumed, preempt_exit); docs/CHECKPOINT.md describes each line.
ENV_EVENTS_FILE = "GPU_AUDIT_EVENTS_FILE"

DEFAULT_PREEMPT_SIGNALS = ("SIGUSR1", "SIGTERM")
# Kubernetes' default terminationGracePeriodSeconds: the deadline when nobody names one.
DEFAULT_GRACE_SECONDS = 30.0
