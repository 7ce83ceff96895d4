#!/usr/bin/env bash
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/epilog.d/gpu-audit-epilog.sh, run as root by
# slurmd on each node of the job when it ends there): record the run and its GPU report
# with `gpu-audit slurm epilog` (docs/SLURM.md: the run's allocation and measured usage
# into the audit stream `slurm`, the report into the node's report directory and, with
# GPU_AUDIT_SLURM_ADMIN_COMMENT=1, the job's AdminComment), then remove the job-mapping
# file prolog.sh wrote, so the job's GPUs stop being attributed to it.
#
# Never fails (a failing Epilog drains the node): problems are logged (syslog via logger,
# and stderr).
#
# Environment: GPU_AUDIT_JOBMAP_DIR (default /run/gpu-audit/jobs), GPU_AUDIT_BIN (the
# gpu-audit command; default `gpu-audit` when on PATH, else no record is made),
# GPU_AUDIT_CONFIG (the node's gpu-audit configuration: where the exporter's spool and
# archive are), GPU_AUDIT_SLURM_DIR (default /var/lib/gpu-audit/slurm),
# GPU_AUDIT_SLURM_ADMIN_COMMENT (1: store the report in AdminComment),
# GPU_AUDIT_EPILOG_TIMEOUT (seconds, default 120).
set -uo pipefail

jobmap_dir=${GPU_AUDIT_JOBMAP_DIR:-/run/gpu-audit/jobs}
job_id=${SLURM_JOB_ID:-}

say() {
  echo "gpu-audit-epilog: $*" >&2
  if command -v logger >/dev/null 2>&1; then
    logger -t gpu-audit-epilog -- "$*" 2>/dev/null || true
  fi
}

if [[ ! $job_id =~ ^[0-9]+$ ]]; then
  say "SLURM_JOB_ID is missing or not a number (${job_id:-unset})"
  exit 0
fi

# The run's record and GPU report, while the job-mapping file still says which GPUs it had.
record_run() {
  local -a bin=()
  if [[ -n ${GPU_AUDIT_BIN:-} ]]; then
    read -r -a bin <<<"$GPU_AUDIT_BIN"
  elif command -v gpu-audit >/dev/null 2>&1; then
    bin=(gpu-audit)
  else
    return 0  # gpu-audit is not installed on this node: attribution only
  fi
  [[ -f $jobmap_dir/slurm-$job_id.json ]] || return 0  # no GPU on this node
  local -a args=(slurm epilog --jobmap-dir "$jobmap_dir")
  if [[ -n ${GPU_AUDIT_CONFIG:-} ]]; then
    args+=(--config "$GPU_AUDIT_CONFIG")
  fi
  if [[ ${GPU_AUDIT_SLURM_ADMIN_COMMENT:-0} == 1 ]]; then
    args+=(--admin-comment)
  fi
  local out rc
  out=$(timeout "${GPU_AUDIT_EPILOG_TIMEOUT:-120}" "${bin[@]}" "${args[@]}" 2>&1)
  rc=$?
  printf '%s\n' "$out"
  if [[ $rc -ne 0 ]]; then
    say "job $job_id: gpu-audit slurm epilog exited with $rc: ${out##*$'\n'}"
  fi
}
record_run

if ! rm -f "$jobmap_dir/slurm-$job_id.json" "$jobmap_dir/.slurm-$job_id.json.tmp"; then
  say "job $job_id: cannot remove $jobmap_dir/slurm-$job_id.json"
fi
# the run's events file (the prolog's; `gpu-audit slurm epilog` read it): gone too when
# gpu-audit is not installed here
rm -f "${GPU_AUDIT_SLURM_EVENTS_DIR:-/run/gpu-audit/slurm-events}/$job_id.jsonl"
exit 0
