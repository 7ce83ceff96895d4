"""The rules every component must apply alike, defined once: what "idle" means, the label
sets usage is aggregated by, and the recording rules a bill reads.

alerts/ renders these expressions into alerts/rules/recording.yaml; chargeback/ reads the
recorded series and, in raw mode, evaluates the very same expressions over the raw
series; the audit records (gpu_audit.audit.holders), the Slurm bill, the search source
and the launcher's replay count idle GPU time with the same threshold. A copy of any of
them elsewhere is a defect (tests/core/test_shared_rules.py looks for one).

Pure strings and numbers: this module never talks to Prometheus and never reads
configuration (a site's params file may choose another idle threshold for its alerts;
IDLE_UTILIZATION is the default every bill assumes).
"""

from __future__ import annotations

IDLE_UTILIZATION = 0.05
"""A GPU under this utilisation (0-1) is idle: held-idle time, waste alerts, reclaim."""

GPU = "instance, gpu, uuid"
"""One GPU: the node and the device."""
IDENTITY = "user, project, job"
"""One owner: who, for which project, in which job."""
GPU_IDENTITY = f"{GPU}, {IDENTITY}"


def promql_number(value: float) -> str:
    """A number as PromQL and people read it, exactly: 1073741824, 0.95, 600.5 (never
    rounded to six digits as `:g` would, 1.07374e+09)."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def power_split(sel: str) -> str:
    """The energy rule's first two steps, as the head of an `or` chain: each GPU's power
    split over its holders by SM use, else by memory (no per-process SM, as under MIG,
    or all at 0); the caller ends the chain with the even split. The audit records apply
    the same rule in gpu_audit.audit.accounting.energy_weights."""
    sm_held = (f"(sum by ({GPU_IDENTITY}) (gpu_process_sm_utilization_ratio{sel})"
               f" and on ({GPU_IDENTITY}) gpu:gpu_held:bool)")
    mem_held = (f"(sum by ({GPU_IDENTITY}) (gpu_process_memory_used_bytes{sel})"
                f" and on ({GPU_IDENTITY}) gpu:gpu_held:bool)")
    return (f"    {sm_held}\n"
            f"      / on (instance, uuid) group_left ()\n"
            f"    (sum by (instance, uuid) {sm_held} > 0)\n"
            f"    or on (instance, uuid)\n"
            f"    {mem_held}\n"
            f"      / on (instance, uuid) group_left ()\n"
            f"    (sum by (instance, uuid) {mem_held} > 0)\n"
            f"    or on (instance, uuid)\n")


EQUAL_SPLIT = ("gpu:gpu_held:bool / on (instance, uuid) group_left ()\n"
               "  count by (instance, uuid) (gpu:gpu_held:bool)")
"""A GPU split evenly over its holders."""


def bill_rules(sel: str, idle_utilization: float = IDLE_UTILIZATION) -> dict[str, str]:
    """The recording rules a bill reads, record -> expression, in evaluation order (later
    rules read earlier ones). `sel`: the matchers every raw series gets (`{...}` or "")."""
    util = f"gpu_utilization_ratio{sel}"
    power = f"gpu_power_usage_watts{sel}"
    # MIG: the instances an identity holds, each with its weight (its profile's compute
    # slices / the GPU's; gpu_audit.model.mig); no series on a GPU counted whole
    mig_held = (f"(max by ({GPU_IDENTITY}, gpu_instance_id)"
                f" (gpu_process_mig_weight_ratio{sel})"
                f" and on ({GPU_IDENTITY}) gpu:gpu_held:bool)")
    alloc = f"max by ({GPU_IDENTITY}) (gpu_allocation_info{sel})"
    return {
        "gpu:gpu_held:bool":
            f"max by ({GPU_IDENTITY}) (gpu_process_memory_used_bytes{sel} > bool 0) == 1",
        "gpu:gpu_idle_held:bool":
            f"gpu:gpu_held:bool and on (instance, uuid)\n"
            f"  (max by (instance, uuid) ({util}) < {promql_number(idle_utilization)})",
        # per GPU and identity: the part of the GPU it holds (1, or on a MIG GPU its
        # instances' weights), what was reserved for it (weighted as held time is; not
        # through the utilisation, which a MIG parent does not report), the holder's
        # share (1 / holders; on a MIG GPU each instance's weight / its holders), its SM
        # use, its power share
        "gpu:gpu_held:weight": f"sum by ({GPU_IDENTITY}) {mig_held}\nor\ngpu:gpu_held:bool",
        "gpu:gpu_allocated:weight":
            f"sum by ({GPU_IDENTITY}) (max by ({GPU_IDENTITY}, gpu_instance_id)"
            f" (gpu_process_mig_weight_ratio{sel})"
            f" and on ({GPU_IDENTITY}) {alloc})\nor\n{alloc}",
        "gpu:gpu_held:share":
            f"sum by ({GPU_IDENTITY}) (\n"
            f"  {mig_held}\n"
            f"    / on (instance, uuid, gpu_instance_id) group_left ()\n"
            f"  count by (instance, uuid, gpu_instance_id) {mig_held}\n"
            f")\n"
            f"or\n"
            f"{EQUAL_SPLIT}",
        "gpu:gpu_busy:sum":
            f"sum by ({GPU_IDENTITY}) (gpu_process_sm_utilization_ratio{sel})",
        "gpu:gpu_power_watts:share":
            f"(\n"
            f"{power_split(sel)}"
            f"    ({EQUAL_SPLIT})\n"
            f")\n"
            f"* on (instance, uuid) group_left () max by (instance, uuid) ({power})",
        # per GPU: up (1/0; its samples also count the time down), utilisation and
        # power, one series per physical GPU
        "gpu:gpu_up:max": f"max by ({GPU}) (gpu_up{sel})",
        "gpu:gpu_utilization_ratio:max": f"max by ({GPU}) ({util})",
        "gpu:gpu_power_watts:max": f"max by ({GPU}) ({power})",
    }
