"""PromQL building blocks shared by the recording and alerting rules.

Label sets are written once here so every rule aggregates the same way. The exporter's
`job` label is the workload's job (Prometheus must scrape it with `honor_labels: true`,
see alerts/README.md); `instance` is the node.
"""

from __future__ import annotations

from alerts.params import Params

GPU = "instance, gpu, uuid"
"""One GPU: the node and the device."""
IDENTITY = "user, project, job"
"""One owner: who, for which project, in which job."""
GPU_IDENTITY = f"{GPU}, {IDENTITY}"
OWNER = "user, project, job, slurm_job"
"""Who holds a GPU, as `gpu_allocation_info` says (the workload's job, and its Slurm job)."""


def with_owners(p: Params, per_gpu: str, lookback: str) -> str:
    """`per_gpu` (one series per GPU: labelled by instance and uuid at most, with gpu)
    once per owner its exporter reported on that GPU within `lookback` (so a GPU that
    was lost still names the jobs it had), labelled with OWNER and keeping the value;
    a GPU nobody held in that time keeps its own series. Hardware alerts use it to say
    whose work is hit."""
    owners = (f"max by ({GPU}, {OWNER}) (\n"
              f"  last_over_time(gpu_allocation_info{sel(p)}[{lookback}])\n)")
    return (f"{owners}\n  * on (instance, uuid) group_left () ({per_gpu})\n"
            f"or on (instance, uuid) ({per_gpu})")


def sel(p: Params, *matchers: str) -> str:
    """A series selector's matchers, with `simulated!="true"` unless the params count
    simulated data (it also matches series that have no such label)."""
    parts = list(matchers)
    if not p.include_simulated:
        parts.insert(0, 'simulated!="true"')
    return "{" + ", ".join(parts) + "}" if parts else ""


def alternation(values: list[str] | list[int]) -> str:
    """A regex matching exactly these values."""
    return "|".join(str(v) for v in values)


def num(value: float) -> str:
    """A number as PromQL and people read it, exactly: 1073741824, 0.95, 600.5 (never
    rounded to six digits as `:g` would, 1.07374e+09)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))
