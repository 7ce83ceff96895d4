"""The launcher's contract with the job: exit codes and environment variable names.

The job-side helper (gpu_audit_ckpt) imports nothing of ours, so it carries its own copy
of these values; tests/launcher/test_constants.py keeps the two copies equal once the
helper defines them.
"""

from __future__ import annotations

# A job that committed a checkpoint after a preemption signal exits with this code (EX_TEMPFAIL
# in sysexits.h: "try again later"), so a preemption is never read as success or failure.
EXIT_PREEMPTED = 75
# The conventional exit code of a process killed by SIGKILL (128 + 9): the kernel's OOM killer
# and the launcher's own kill after the grace period both end a job this way.
EXIT_SIGKILL = 137

# Identity, set by the launcher in every job's environment (launcher/identity.py).
ENV_JOB_ID = "JOB_ID"
ENV_USER = "USER"
ENV_PROJECT = "PROJECT_NAME"
ENV_DEPARTMENT = "GPU_AUDIT_DEPARTMENT"
ENV_JOB_NAME = "GPU_AUDIT_JOB_NAME"
ENV_RUN_ATTEMPT = "RUN_ATTEMPT"
ENV_GPU_UUIDS = "GPU_AUDIT_GPU_UUIDS"  # comma-separated, in CUDA_VISIBLE_DEVICES order
ENV_CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
ENV_CUDA_DEVICE_ORDER = "CUDA_DEVICE_ORDER"

# The preemption protocol the helper reads: the signal that sets its flag (a name such as
# "SIGUSR1"), and the seconds it has from that signal to commit and exit (the deadline is
# signal time + grace; after it the launcher kills the process group).
ENV_PREEMPT_SIGNAL = "GPU_AUDIT_PREEMPT_SIGNAL"
ENV_PREEMPT_GRACE_SECONDS = "GPU_AUDIT_PREEMPT_GRACE_SECONDS"
ENV_CHECKPOINT_DIR = "GPU_AUDIT_CHECKPOINT_DIR"
# Where the helper appends its reports (JSON Lines: checkpoint committed, step/loss telemetry,
# anomalies) for the executor to read; set by the executor, not by the engine.
ENV_EVENTS_FILE = "GPU_AUDIT_EVENTS_FILE"
# The GPU memory the job was admitted with (bytes); a fractional job should cap itself there.
ENV_GPU_MEMORY_LIMIT = "GPU_AUDIT_GPU_MEMORY_LIMIT_BYTES"
# MPS limits, set only where an MPS daemon runs (config engine.mps).
ENV_MPS_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_MPS_MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
