#!/usr/bin/env bash
# sbatch with the gpu-audit checkpoint protocol switched on:
#   --signal=USR1@120  Slurm sends SIGUSR1 to the job's steps 120 s before the time limit;
#                      gpu_audit_ckpt only sets its flag, the training loop sees
#                      should_checkpoint() at the next step boundary, commits a checkpoint
#                      and exits;
#   --requeue          the job goes back to the queue after preemption or a node failure
#                      and resumes from its newest committed checkpoint;
#   --open-mode=append the requeued run appends to the same output files;
# and exports the helper's settings to the job (sbatch's default --export=ALL):
#   GPU_AUDIT_PREEMPT_SIGNAL=SIGUSR1,SIGTERM   (USR1 from --signal, TERM from preemption)
#   GPU_AUDIT_PREEMPT_GRACE_SECONDS=<lead>     the helper's deadline after the signal.
# Run the training step under requeue-on-preempt.sh so a job that checkpointed before its
# time limit is requeued:  srun requeue-on-preempt.sh python train.py
# Usage: sbatch-checkpoint.sh [sbatch options] script.sh [args]   (your options come after
# ours, so e.g. --signal=USR1@300 overrides the lead time).
# Environment: GPU_AUDIT_CKPT_LEAD_SECONDS (default 120), SBATCH (default sbatch).
set -euo pipefail

lead=${GPU_AUDIT_CKPT_LEAD_SECONDS:-120}
if [[ ! $lead =~ ^[0-9]+$ ]]; then
  echo "sbatch-checkpoint: GPU_AUDIT_CKPT_LEAD_SECONDS must be whole seconds, not '$lead'" >&2
  exit 2
fi
if [[ $# -eq 0 ]]; then
  echo "usage: sbatch-checkpoint.sh [sbatch options] script.sh [args]" >&2
  exit 2
fi
export GPU_AUDIT_PREEMPT_SIGNAL=${GPU_AUDIT_PREEMPT_SIGNAL:-SIGUSR1,SIGTERM}
export GPU_AUDIT_PREEMPT_GRACE_SECONDS=$lead
exec "${SBATCH:-sbatch}" "--signal=USR1@$lead" --requeue --open-mode=append "$@"
