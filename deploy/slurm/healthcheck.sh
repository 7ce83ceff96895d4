#!/usr/bin/env bash
# Slurm node health check for lost GPUs (slurm.conf: HealthCheckProgram=/etc/slurm/
# gpu-audit-healthcheck.sh, HealthCheckInterval=60; run as root by slurmd).
#
# Cheap while all is well: one read of this node's exporter /metrics, looking for a GPU
# with gpu_up 0. Only then does it run `gpu-audit slurm health`, which drains the node
# with the reason ("gpu-audit: GPU 0 (GPU-...) lost: XID 79") and requeues the jobs the
# job-mapping files say hold that GPU, so they resume from their checkpoints on another
# node (docs/SLURM.md). An exporter it cannot read changes nothing (no drain on a guess).
#
# Environment: GPU_AUDIT_EXPORTER_URL (default http://127.0.0.1:9945), GPU_AUDIT_BIN (the
# gpu-audit command; default `gpu-audit`), GPU_AUDIT_JOBMAP_DIR (default
# /run/gpu-audit/jobs), GPU_AUDIT_HEALTH_ARGS (extra arguments, e.g. --no-requeue).
set -uo pipefail

url=${GPU_AUDIT_EXPORTER_URL:-http://127.0.0.1:9945}

say() {
  echo "gpu-audit-healthcheck: $*" >&2
  if command -v logger >/dev/null 2>&1; then
    logger -t gpu-audit-healthcheck -- "$*" 2>/dev/null || true
  fi
}

if ! metrics=$(curl -fsS --max-time 10 "$url/metrics" 2>&1); then
  say "cannot read $url/metrics: ${metrics##*$'\n'}; node left as it is"
  exit 0
fi
# gpu_up{gpu="0",uuid="GPU-..."} 0   (a GPU the exporter could not read this cycle)
if ! grep -Eq '^gpu_up\{[^}]*\} 0(\.0)?$' <<<"$metrics"; then
  exit 0
fi

bin=()
read -r -a bin <<<"${GPU_AUDIT_BIN:-gpu-audit}"
extra=()
read -r -a extra <<<"${GPU_AUDIT_HEALTH_ARGS:-}"
args=(slurm health --apply --exporter "$url")
if [[ -n ${GPU_AUDIT_JOBMAP_DIR:-} ]]; then
  args+=(--jobmap-dir "$GPU_AUDIT_JOBMAP_DIR")
fi
if [[ -n ${SLURMD_NODENAME:-} ]]; then
  args+=(--node "$SLURMD_NODENAME")
fi
if ! out=$(timeout 120 "${bin[@]}" "${args[@]}" "${extra[@]}" 2>&1); then
  say "gpu-audit slurm health failed: ${out##*$'\n'}"
fi
printf '%s\n' "$out"
exit 0
