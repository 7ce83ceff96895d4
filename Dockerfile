# syntax=docker/dockerfile:1
# gpu-audit container image: the exporter, shipper and launcher (`gpu-audit ...`).
#
#   docker build -t gpu-audit .
#   docker run --rm -p 9945:9945 gpu-audit run --backend sim --scenario busy   # no GPU needed
#   docker run --rm --gpus all --pid host -p 9945:9945 gpu-audit run            # NVML
#
# Non-root by default (uid 10001). NVML itself works as that user under the NVIDIA
# container runtime (it hands the container world-usable /dev/nvidia* nodes). Reading the
# environ of other users' processes (the `environ` attribution source: JOB_ID, USER,
# PROJECT_NAME) needs root or CAP_SYS_PTRACE; without it those reads are counted as
# `environ_denied` and the job map, cgroup, owner and kubelet sources still answer.
# Override where you need it:  docker run --user 0 ...  (Kubernetes: runAsUser: 0,
# deploy/kubernetes/overlays/nvml). See deploy/README.md.

ARG PYTHON_VERSION=3.11

FROM python:${PYTHON_VERSION}-slim-bookworm AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY gpu_audit ./gpu_audit
COPY gpu_audit_app ./gpu_audit_app
COPY gpu_audit_ckpt ./gpu_audit_ckpt
COPY exporter ./exporter
COPY shipper ./shipper
COPY alerts ./alerts
COPY dashboards ./dashboards
COPY chargeback ./chargeback
COPY launcher ./launcher
# The project's wheel and the wheels of everything it needs (every sink's client: [all]).
RUN pip wheel --wheel-dir /wheels '.[all]'

FROM python:${PYTHON_VERSION}-slim-bookworm AS runtime
# VERSION is pyproject.toml's version (tests/deploy/test_container.py checks it).
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="gpu-audit" \
      org.opencontainers.image.description="GPU usage auditing: NVML/DCGM Prometheus exporter with per-process attribution, tamper-evident audit trail and loss-free shipper" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MALLOC_ARENA_MAX=2 \
    GPU_AUDIT_HEALTHZ_URL=http://127.0.0.1:9945/healthz
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links /wheels "gpu-audit[all]==${VERSION}" \
    && groupadd --system --gid 10001 gpu-audit \
    && useradd --system --uid 10001 --gid gpu-audit --home-dir /var/lib/gpu-audit \
       --shell /usr/sbin/nologin gpu-audit \
    && install -d -o gpu-audit -g gpu-audit -m 0750 /var/lib/gpu-audit /etc/gpu-audit \
    && install -d -o gpu-audit -g gpu-audit -m 0755 /run/gpu-audit /run/gpu-audit/jobs
USER 10001:10001
WORKDIR /var/lib/gpu-audit
VOLUME ["/var/lib/gpu-audit"]
EXPOSE 9945
# Standard library only, so the image needs no curl. A process serving another address
# (the shipper's metrics_listen, a launcher) sets GPU_AUDIT_HEALTHZ_URL; with TLS on the
# endpoint (web_config_file) point it at https:// and mount the CA.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, sys, urllib.request as u; sys.exit(0 if u.urlopen(os.environ['GPU_AUDIT_HEALTHZ_URL'], timeout=4).status == 200 else 1)"]
ENTRYPOINT ["gpu-audit"]
CMD ["run"]
