#!/usr/bin/env bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/epilog.d/gpu-audit-epilog.sh): remove the
# job-mapping file prolog.sh wrote, so the job's GPUs stop being attributed to it. Never
# fails (a failing Epilog drains the node); problems are logged.
# Environment: GPU_AUDIT_JOBMAP_DIR (default /run/gpu-audit/jobs).
set -uo pipefail

jobmap_dir=${GPU_AUDIT_JOBMAP_DIR:-/run/gpu-audit/jobs}
job_id=${SLURM_JOB_ID:-}

if [[ ! $job_id =~ ^[0-9]+$ ]]; then
  echo "gpu-audit-epilog: SLURM_JOB_ID is missing or not a number (${job_id:-unset})" >&2
  exit 0
fi
if ! rm -f "$jobmap_dir/slurm-$job_id.json" "$jobmap_dir/.slurm-$job_id.json.tmp"; then
  msg="job $job_id: cannot remove $jobmap_dir/slurm-$job_id.json"
  echo "gpu-audit-epilog: $msg" >&2
  if command -v logger >/dev/null 2>&1; then
    logger -t gpu-audit-epilog -- "$msg" 2>/dev/null || true
  fi
fi
exit 0
