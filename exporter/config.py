"""Configuration of the exporter: sampling, the HTTP endpoint and the metric profile."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator

from gpu_audit.config_section import Section
from gpu_audit.http.config import HttpLimitsConfig, parse_listen
from gpu_audit.model.mig import check_site_key

DEFAULT_LISTEN = "0.0.0.0:9945"
# dcgm-exporter's released host label name (main renames it to "hostname").
DEFAULT_HOST_LABEL = "Hostname"
# Labels every compat series already has (exporter.compat); the host label must differ.
_TAKEN_LABELS = frozenset({"gpu", "UUID", "pci_bus_id", "device", "modelName", "GPU_I_PROFILE",
                           "GPU_I_ID", "DCGM_FI_DRIVER_VERSION", "pod", "namespace",
                           "container", "simulated"})


class CompatConfig(Section):
    dcgm_exporter: bool = Field(
        False,
        description="Also emit dcgm-exporter's names and labels (DCGM_FI_DEV_GPU_UTIL, ... "
        "with gpu, UUID, modelName, Hostname, ...) so existing dashboards, recording rules "
        "and alerts keep working. Its modelName label and DCGM_FI_DEV_PCIE_REPLAY_COUNTER "
        "draw promtool lint complaints (docs/METRICS.md lists them).",
    )
    host_label: str = Field(
        DEFAULT_HOST_LABEL,
        description="Name of the compat profile's host label: dcgm-exporter's released "
        "'Hostname', or 'hostname' as its main branch spells it.",
    )
    promtool_clean: bool = Field(
        False,
        description="Leave out the two dcgm-exporter items promtool's lint rejects (the "
        "camelCase modelName label, DCGM_FI_DEV_PCIE_REPLAY_COUNTER).",
    )

    @field_validator("host_label")
    @classmethod
    def _label_name(cls, v: str) -> str:
        if not re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", v) or v.startswith("__"):
            raise ValueError(f"{v!r} is not a Prometheus label name")
        if v in _TAKEN_LABELS:
            raise ValueError(f"{v!r} is already a label of every compat series")
        return v


class ExporterConfig(Section):
    listen: str = Field(DEFAULT_LISTEN, description="HOST:PORT of the HTTP endpoint.")
    backend: Literal["nvml", "dcgm", "sim"] = Field(
        "nvml", description="Where samples come from. 'sim' needs a scenario."
    )
    scenario: str | None = Field(
        None, description="Simulator scenario: a shipped name (busy, idle, ...) or a file."
    )
    time_scale: float = Field(
        1.0, gt=0, description="Simulator only: scenario seconds per wall second (the "
        "story runs faster; records, GPU time and energy stay on the wall clock)."
    )
    interval_seconds: float = Field(5.0, gt=0, le=3600, description="Fast sampling tier.")
    slow_interval_seconds: float = Field(
        60.0, gt=0, le=86400, description="Slow tier: inventory, ECC, retired pages, NVLink."
    )
    stale_after_seconds: float | None = Field(
        None, gt=0, description="/readyz fails when the snapshot is older (default 3 x interval)."
    )
    web_config_file: Path | None = Field(
        None, description="TLS and basic auth, in the Prometheus exporter-toolkit format."
    )
    compat: CompatConfig = CompatConfig()
    http: HttpLimitsConfig = HttpLimitsConfig()
    log_summary_interval_seconds: float = Field(
        300.0, ge=0,
        description="Log a one-line summary (cycles, records, spool, per-sink lag) this "
        "often; 0: never. Changes of state (GPU lost, XID, spool refusing) are logged as "
        "they happen.",
    )
    process_pid_label: bool = Field(
        False, description="Add a pid label to per-process series (unbounded cardinality)."
    )
    max_process_series_per_gpu: int = Field(
        256, ge=1, description="Cap on per-process series per GPU; the rest are counted."
    )
    dcgm_host: str | None = Field(
        None, description="DCGM host engine address; default starts an embedded engine."
    )
    inventory_directory: Path | None = Field(
        None,
        description="Where the GPU inventory is kept (every GPU seen, its last state, XIDs "
        "and owners), so a GPU lost before a restart is still reported lost after it. "
        "Created 0700; must belong to the exporter's user. Default: `inventory` in the "
        "spool directory.",
    )

    mig_weights: dict[str, float] = Field(
        default_factory=dict,
        description="The site's weights of MIG instances, over the built-in table "
        "(docs/CHARGEBACK.md, \"MIG: billed by the slice\": compute slices, 3g.40gb = 3/7 "
        "of an A100): `PROFILE: weight` (e.g. `3g.40gb: 0.5`) or `MODEL/PROFILE: weight` "
        "for one GPU model (MODEL a part of the GPU's name, e.g. `H100/1g.10gb: 0.125`); "
        "a weight is in (0, 1]. The exporter's series and the audit records carry the "
        "weight, so every bill source uses it.",
    )

    @field_validator("listen")
    @classmethod
    def _listen_ok(cls, v: str) -> str:
        parse_listen(v)
        return v

    @field_validator("mig_weights")
    @classmethod
    def _mig_weights_ok(cls, v: dict[str, float]) -> dict[str, float]:
        problems = []
        for key, w in v.items():
            wrong = check_site_key(key)
            if wrong is not None:
                problems.append(f"{key}: {wrong}")
            elif not (math.isfinite(w) and 0 < w <= 1):
                problems.append(f"{key}: weight {w} must be > 0 and <= 1")
        if problems:
            raise ValueError("; ".join(problems))
        return {k.strip().lower() if "/" not in k else k: w for k, w in v.items()}
