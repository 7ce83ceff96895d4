"""Waste and leak alerts: GPUs held but idle, jobs that use their GPUs little, usage
nobody is attributed to, and per-identity GPU memory that grows towards exhaustion.

They are for the owner and FinOps, not for paging: Alertmanager routes them by project
and user (alerts/alertmanager/alertmanager.yml).
"""

from __future__ import annotations

from alerts.params import Params, duration_seconds, human_duration
from alerts.promql import indent, num, sel
from alerts.recording import gpu_free_memory, leak_growth
from alerts.rule import Alert

OWNER = ("{{ $labels.user }} (project {{ $labels.project }}, job {{ $labels.job }})")
GPU_AT = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.instance }}"


def waste_alerts(p: Params) -> list[Alert]:
    w = p.waste
    idle_pct = f"{w.idle_utilization * 100:g}%"
    return [
        Alert(
            name="GpuHeldIdle",
            # the share of the time held in the window that the GPU was idle; it outlives
            # a stopped exporter by up to one window, which is why Alertmanager inhibits
            # it then
            expr=f"sum_over_time(gpu:gpu_idle_held:bool[{w.idle_window}])\n"
                 f"  / count_over_time(gpu:gpu_held:bool[{w.idle_window}])\n"
                 f"  >= {num(w.idle_fraction)}",
            for_=w.idle_for, severity="warning", category="waste",
            summary="{{ $labels.user }} holds GPU {{ $labels.gpu }} of "
                    "{{ $labels.instance }} without using it",
            description=f"{OWNER} holds memory on {GPU_AT}, which was below {idle_pct} "
                        f"utilisation {{{{ $value | humanizePercentage }}}} of the time in the "
                        f"last {human_duration(w.idle_window)}, for more than "
                        f"{human_duration(w.idle_for)}.",
        ),
        Alert(
            name="GpuJobLowUtilization",
            expr=f"avg by (instance, user, project, job) (\n"
                 f"  avg_over_time(gpu:allocation_utilization_ratio"
                 f"[{w.low_utilization_window}])\n"
                 f") < {num(w.low_utilization)}",
            for_=w.low_utilization_for, severity="info", category="waste",
            summary="Job {{ $labels.job }} of {{ $labels.user }} uses its GPUs little",
            description=f"The GPUs {OWNER} holds on {{{{ $labels.instance }}}} were "
                        f"{{{{ $value | humanizePercentage }}}} busy on average over the last "
                        f"{human_duration(w.low_utilization_window)} (below "
                        f"{w.low_utilization * 100:g}%), for more than "
                        f"{human_duration(w.low_utilization_for)}.",
        ),
        Alert(
            name="GpuUnattributedMemory",
            expr=f"gpu_unattributed_memory_bytes{sel(p)} > {num(w.unattributed_memory_bytes)}",
            for_=w.unattributed_for, severity="info", category="waste",
            summary="GPU memory nobody is attributed to on GPU {{ $labels.gpu }} of "
                    "{{ $labels.instance }}",
            description=f"{{{{ $value | humanize1024 }}}}B of memory on {GPU_AT} is used by "
                        f"no process gpu-audit could attribute, for more than "
                        f"{human_duration(w.unattributed_for)}.",
        ),
        Alert(
            name="GpuUnattributedUtilization",
            expr=f"gpu_unattributed_utilization_ratio{sel(p)} > {num(w.unattributed_utilization)}",
            for_=w.unattributed_for, severity="info", category="waste",
            summary="GPU utilisation nobody is attributed to on GPU {{ $labels.gpu }} of "
                    "{{ $labels.instance }}",
            description=f"{{{{ $value | humanizePercentage }}}} of the utilisation of {GPU_AT} "
                        f"comes from no process gpu-audit could attribute, for more than "
                        f"{human_duration(w.unattributed_for)}.",
        ),
    ]


def leak_alerts(p: Params) -> list[Alert]:
    lk = p.leak
    return [
        Alert(
            name="GpuMemoryLeak",
            # value: seconds until the GPU's free memory is gone at this identity's growth
            # rate; what counts as a leak (and what does not: a warm-up, a ramp-up that
            # levelled off, noise) is alerts.recording.leak_growth, the expression the
            # leak recording rules (the dashboard's suspects) are made of
            expr=f"{gpu_free_memory(p)}\n"
                 f"  / on (instance, uuid) group_right () (\n"
                 f"{indent(leak_growth(p), '    ')}\n"
                 f"  )\n"
                 f"< {duration_seconds(lk.horizon)}",
            for_=lk.for_, severity="warning", category="leak",
            summary="GPU memory of {{ $labels.user }} grows towards exhaustion on GPU "
                    "{{ $labels.gpu }} of {{ $labels.instance }}",
            description=f"GPU memory of {OWNER}, process {{{{ $labels.process_name }}}}, on "
                        f"{GPU_AT} has kept growing over the last {human_duration(lk.window)} "
                        f"(more than {lk.min_growth_ratio_per_hour * 100:g}% of the GPU's "
                        f"memory an hour, a new peak in the last "
                        f"{human_duration(lk.recent_window)}); at that rate the GPU runs out "
                        f"of memory in {{{{ $value | humanizeDuration }}}}.",
        ),
    ]
