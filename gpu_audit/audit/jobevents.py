"""Audit records of a job's lifecycle, written by the launcher into its own stream (and by
the Slurm epilog into stream `slurm`: one `job_finished` per run and node, with the
run's allocation and its measured usage, docs/SLURM.md).

`job_event()` builds one `kind: event` record (schema 2) for `job_queued`,
`job_started`, `job_preempted`, `job_checkpoint_committed`, `job_resumed`,
`job_finished` (and `launcher_start` / `launcher_stop`), with a `job` object: the job id,
attempt, user, uid, project, GPUs, and where known the exit code and class, allocated
GPU-seconds, preemption latencies, the last committed checkpoint and, on start, the
environment fingerprint. The producer chains and commits them like any record.

Pure: no I/O. A field that is not known is absent, never "" (like every record).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpu_audit.audit.canonical import SCHEMA_ID, format_time_ns, record_id, to_time_ns

JOB_EVENTS: Sequence[str] = (
    "job_queued",
    "job_started",
    "job_preempted",
    "job_checkpoint_committed",
    "job_resumed",
    "job_finished",
    "launcher_start",
    "launcher_stop",
)

# the keys a `job` object may carry (schema: additionalProperties false)
JOB_FIELDS: frozenset[str] = frozenset({
    "id", "attempt", "user", "uid", "project", "department", "gpus", "gpu_fraction",
    "state", "exit_code", "exit_class", "allocated_gpu_seconds", "lost_gpu_seconds",
    "signal_to_commit_seconds", "commit_to_exit_seconds", "checkpoint_step",
    "checkpoint_time", "checkpoint_path", "reason", "fingerprint",
    # Slurm runs: account and partition, the allocation's interval and where its times
    # came from ("slurm": slurmctld's own stamps; "node": the prolog's and epilog's clock)
    "account", "partition", "start_time", "end_time", "time_source",
    # measured by the exporter while the run held its GPUs (the per-job GPU report)
    "usage",
    # Slurm runs: how far the run got and what it ran (the job's events file) and what
    # its GPU processes ran (the exporter's process_start records)
    "progress", "environment", "software",
})


def _clean(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items() if v is not None and v != ""}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def job_event(
    event: str,
    *,
    timestamp: float,
    host: str,
    stream: str,
    version: str,
    job: Mapping[str, Any] | None = None,
    simulated: bool = False,
) -> dict[str, Any]:
    """One lifecycle record; `job` keys outside JOB_FIELDS raise (a schema violation)."""
    if event not in JOB_EVENTS:
        raise ValueError(f"unknown launcher event {event!r}")
    time_ns = to_time_ns(timestamp)
    job_part: dict[str, Any] = {}
    if job:
        unknown = set(job) - JOB_FIELDS
        if unknown:
            raise ValueError(f"unknown job field(s) {sorted(unknown)}")
        job_part = _clean(job)
    key = f"{job_part.get('id', '')}/{job_part.get('attempt', '')}"
    rec: dict[str, Any] = {
        "schema": SCHEMA_ID,
        "kind": "event",
        "event": event,
        # the job and attempt take the process-key slot of the id: two jobs' events in the
        # same nanosecond stay distinct
        "id": record_id(host, stream, "event", event=event, time_ns=time_ns, gpu_uuid="",
                        process_key=key, xid_key=""),
        "stream": stream,
        "time": format_time_ns(time_ns),
        "time_ns": time_ns,
        "host": host,
        "interval_seconds": 0.0,
        "elapsed_seconds": 0.0,
        "simulated": simulated,
        "exporter_version": version,
    }
    if job_part:
        rec["job"] = job_part
    return rec
