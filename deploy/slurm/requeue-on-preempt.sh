#!/usr/bin/env bash
# Job-step wrapper for the checkpoint protocol under Slurm:
#   srun deploy/slurm/requeue-on-preempt.sh python train.py ...
# runs the command; SIGUSR1 or SIGTERM reaching this wrapper is passed on to it (the
# gpu_audit_ckpt handler only sets its flag, so a second copy of the signal is harmless).
# When the command exits with 75 (gpu_audit_ckpt.EXIT_PREEMPTED: a checkpoint was
# committed after a preemption request), the job is requeued with `scontrol requeue`, so
# it resumes from that checkpoint; Slurm requeues by itself only on preemption or node
# failure, not when the time limit's --signal made the job stop. Exit status: the
# command's.
# Environment: GPU_AUDIT_EXIT_PREEMPTED (default 75), SCONTROL (default scontrol),
# GPU_AUDIT_SLURM_EVENTS_DIR (default /run/gpu-audit/slurm-events).
set -uo pipefail

if [[ $# -eq 0 ]]; then
  echo "usage: requeue-on-preempt.sh COMMAND [ARGS...]" >&2
  exit 2
fi
preempted=${GPU_AUDIT_EXIT_PREEMPTED:-75}

# The helper's report channel: the events file the prolog made for this job on this node
# (the epilog puts the run's progress and environment in its report), unless the job
# chose its own.
events="${GPU_AUDIT_SLURM_EVENTS_DIR:-/run/gpu-audit/slurm-events}/${SLURM_JOB_ID:-none}.jsonl"
if [[ -z ${GPU_AUDIT_EVENTS_FILE:-} && -f $events && -w $events ]]; then
  export GPU_AUDIT_EVENTS_FILE=$events
fi

"$@" &
child=$!
signalled=0
# shellcheck disable=SC2317  # invoked by the traps below, which shellcheck cannot follow
forward() {
  signalled=1
  kill -s "$1" "$child" 2>/dev/null || true
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM

# A trapped signal interrupts `wait` (status 128+n) while the command still runs: wait
# again. 127 on a later round means the earlier round had already collected the status.
rc=0
again=0
while :; do
  signalled=0
  wait "$child"
  status=$?
  if [[ $again -eq 1 && $status -eq 127 ]]; then
    break
  fi
  rc=$status
  if [[ $signalled -eq 1 ]]; then
    again=1
    continue
  fi
  break
done

if [[ $rc -eq $preempted ]]; then
  if [[ -n ${SLURM_JOB_ID:-} ]]; then
    echo "requeue-on-preempt: checkpointed after a preemption request; requeueing job $SLURM_JOB_ID" >&2
    if ! said=$("${SCONTROL:-scontrol}" requeue "$SLURM_JOB_ID" 2>&1); then
      if [[ $said == *"pending execution"* ]]; then
        # preemption (PreemptMode=REQUEUE) or `scontrol requeue` by an admin or the health
        # check already put it back in the queue
        echo "requeue-on-preempt: job $SLURM_JOB_ID is already back in the queue" >&2
      else
        echo "requeue-on-preempt: scontrol requeue $SLURM_JOB_ID failed: $said" >&2
      fi
    fi
  else
    echo "requeue-on-preempt: exit $rc (preempted) outside a Slurm job: nothing to requeue" >&2
  fi
fi
exit "$rc"
