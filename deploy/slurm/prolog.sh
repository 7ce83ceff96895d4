#!/usr/bin/env bash
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/prolog.d/gpu-audit-prolog.sh, run as root by
# slurmd on each node of the job): write the gpu-audit job-mapping file for this job, so
# the exporter attributes every process on the job's GPUs to it (docs/ATTRIBUTION.md,
# "The job-mapping directory", format version 1).
#
# The GPUs come from SLURM_JOB_GPUS (the gres indices slurmd allocated on this node),
# else CUDA_VISIBLE_DEVICES; entries that are already GPU-/MIG- UUIDs are kept, indices
# are turned into UUIDs with `nvidia-smi --query-gpu=index,uuid`. Index = nvidia-smi's
# index: keep gres.conf's File=/dev/nvidiaN order the same as nvidia-smi's (PCI bus order,
# CUDA_DEVICE_ORDER=PCI_BUS_ID), as Slurm's AutoDetect=nvml does.
#
# A failing Prolog drains the node, so this script never fails the job: every problem is
# logged (syslog via logger, and stderr) and it exits 0 without writing a file.
#
# Environment: GPU_AUDIT_JOBMAP_DIR (default /run/gpu-audit/jobs, the exporter's
# attribution.jobmap_dir), GPU_AUDIT_NVIDIA_SMI (default nvidia-smi),
# GPU_AUDIT_SLURM_EVENTS_DIR (default /run/gpu-audit/slurm-events: the job's events file).
set -uo pipefail

jobmap_dir=${GPU_AUDIT_JOBMAP_DIR:-/run/gpu-audit/jobs}
nvidia_smi=${GPU_AUDIT_NVIDIA_SMI:-nvidia-smi}

say() {
  echo "gpu-audit-prolog: $*" >&2
  if command -v logger >/dev/null 2>&1; then
    logger -t gpu-audit-prolog -- "$*" 2>/dev/null || true
  fi
}

# A JSON string: backslash and quote escaped, control characters dropped.
json_str() {
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=$(printf '%s' "$s" | tr -d '\000-\037\177')
  printf '"%s"' "$s"
}

main() {
  local job_id=${SLURM_JOB_ID:-}
  if [[ ! $job_id =~ ^[0-9]+$ ]]; then
    say "SLURM_JOB_ID is missing or not a number (${job_id:-unset}); no job-mapping file written"
    return 0
  fi
  local user=${SLURM_JOB_USER:-} account=${SLURM_JOB_ACCOUNT:-}
  local partition=${SLURM_JOB_PARTITION:-} restarts=${SLURM_JOB_RESTART_COUNT:-}
  local devices=${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-}}
  if [[ -z $devices || $devices == "NoDevFiles" ]]; then
    return 0  # a job without GPUs on this node: nothing to attribute
  fi

  local -a wanted=() uuids=()
  IFS=',' read -r -a wanted <<<"$devices"
  local table="" dev idx uuid found
  for dev in "${wanted[@]}"; do
    dev=${dev// /}
    if [[ $dev =~ ^(GPU|MIG)- ]]; then
      uuids+=("$dev")
      continue
    fi
    if [[ ! $dev =~ ^[0-9]+$ ]]; then
      say "job $job_id: GPU '$dev' is neither an index nor a UUID; no job-mapping file written"
      return 0
    fi
    if [[ -z $table ]]; then
      if ! table=$("$nvidia_smi" --query-gpu=index,uuid --format=csv,noheader 2>&1); then
        say "job $job_id: $nvidia_smi failed: $table; no job-mapping file written"
        return 0
      fi
    fi
    found=""
    while IFS=', ' read -r idx uuid; do
      if [[ $idx == "$dev" ]]; then
        found=$uuid
        break
      fi
    done <<<"$table"
    if [[ -z $found ]]; then
      say "job $job_id: GPU index $dev not reported by $nvidia_smi; no job-mapping file written"
      return 0
    fi
    uuids+=("$found")
  done

  local gpus="" u
  for u in "${uuids[@]}"; do
    gpus+="${gpus:+, }$(json_str "$u")"
  done
  local doc
  doc="{\"version\": 1, \"job_id\": $(json_str "$job_id"), \"slurm_job_id\": $(json_str "$job_id")"
  if [[ -n $user ]]; then
    doc+=", \"user\": $(json_str "$user"), \"slurm_user\": $(json_str "$user")"
  fi
  if [[ -n $account ]]; then
    doc+=", \"account\": $(json_str "$account")"
  fi
  if [[ -n $partition ]]; then
    doc+=", \"partition\": $(json_str "$partition")"
  fi
  # which run of a requeued job this is: the epilog's own count has moved on by then
  if [[ $restarts =~ ^[0-9]+$ ]]; then
    doc+=", \"restart_count\": $restarts"
  fi
  doc+=", \"gpus\": [$gpus], \"start_time\": $(date +%s), \"end_time\": null}"

  # Written beside its final name, then renamed: the exporter never reads a half file
  # (it skips names starting with a dot).
  local final="$jobmap_dir/slurm-$job_id.json" tmp="$jobmap_dir/.slurm-$job_id.json.tmp"
  if ! (umask 022 && mkdir -p "$jobmap_dir") 2>/dev/null; then
    say "job $job_id: cannot create $jobmap_dir; no job-mapping file written"
    return 0
  fi
  if ! (umask 022 && printf '%s\n' "$doc" >"$tmp") 2>/dev/null || ! mv -f "$tmp" "$final"; then
    rm -f "$tmp"
    say "job $job_id: cannot write $final; no job-mapping file written"
    return 0
  fi
  events_file "$job_id"
}

# The job's events file (gpu_audit_ckpt's report channel): made empty, owned by the job's
# user and readable by it alone, in a root-owned directory, so the epilog finds this
# run's progress and environment at a path it knows (docs/SLURM.md); the job step wrapper
# (requeue-on-preempt.sh) points GPU_AUDIT_EVENTS_FILE at it. Removed first: a file or
# link left there is never written through.
events_file() {
  local job_id=$1 uid=${SLURM_JOB_UID:-}
  local dir=${GPU_AUDIT_SLURM_EVENTS_DIR:-/run/gpu-audit/slurm-events}
  if [[ ! $uid =~ ^[0-9]+$ ]]; then
    say "job $job_id: SLURM_JOB_UID is missing; no events file made"
    return 0
  fi
  local file="$dir/$job_id.jsonl"
  if ! (umask 022 && mkdir -p "$dir") 2>/dev/null || ! rm -f "$file" \
    || ! (set -o noclobber && umask 077 && : >"$file") 2>/dev/null || ! chown "$uid" "$file"; then
    rm -f "$file"
    say "job $job_id: cannot make its events file $file; its report will have no progress"
  fi
}

main "$@"
exit 0
