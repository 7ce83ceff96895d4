"""The launcher's Prometheus families: training telemetry of each job and the queue's own.

Per running attempt (labels job, name, user, project, attempt): the newest `step`,
`loss`, `total_steps`, progress ratio, `steps_per_second`, `epoch`, the estimated seconds
to the end (launcher/progress.py `estimate_remaining`; only where the job reported a
step, a total and a throughput) and any other numeric user metric the job-side helper
reported in its events file (`{"event": "metrics", "step": ..., "loss": ..., "<name>":
<number>}`), so a dashboard can put a loss curve and an ETA beside the GPU usage of the
same job. What a job reports is sanitised (launcher/progress.py) before it is exported,
and a job's series go when its attempt ends (job_ended), so the per-job series are
bounded by the running jobs. For the launcher: jobs by
state, waiting jobs by the kind of their current reason (launcher/reasons.py: a fixed set
of values; the numbers stay in `queue`'s text), scheduling decisions, preemptions,
preemption latency histograms
(signal-to-commit, commit-to-exit) and GPU-seconds lost to preemption.

Every family is named `gpu_audit_launcher_*` and declared in FAMILIES below (name, type,
help, labels): the launcher's catalogue, apart from gpu_audit.selfmetrics because these
describe jobs, not gpu-audit. Families are built fresh on every collect (a custom
collector); this module must never do I/O.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from launcher.progress import Progress, estimate_remaining, fraction, progress_of

JOB_LABELS = ("job", "name", "user", "project", "attempt")
LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
_METRIC_NAME = re.compile(r"^[a-z][a-z0-9_]{0,62}$")
MAX_USER_METRICS = 16
# metrics-event fields with a family of their own (never exported as user metrics)
PROGRESS_FIELDS = frozenset({"step", "loss", "total_steps", "steps_per_second", "epoch"})


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    type: str
    help: str
    labels: tuple[str, ...] = ()


FAMILIES: Mapping[str, Family] = {f.name: f for f in (
    Family("gpu_audit_launcher_job_step", "gauge",
           "Newest training step the job reported (gpu_audit_ckpt metrics event).", JOB_LABELS),
    Family("gpu_audit_launcher_job_loss", "gauge",
           "Newest training loss the job reported.", JOB_LABELS),
    Family("gpu_audit_launcher_job_total_steps", "gauge",
           "Total training steps the job reported it will run.", JOB_LABELS),
    Family("gpu_audit_launcher_job_progress_ratio", "gauge",
           "step / total_steps of the job's newest report (0..1).", JOB_LABELS),
    Family("gpu_audit_launcher_job_steps_per_second", "gauge",
           "Training throughput the job reported (its helper's sliding window).", JOB_LABELS),
    Family("gpu_audit_launcher_job_epoch", "gauge",
           "Epoch of the job's newest report.", JOB_LABELS),
    Family("gpu_audit_launcher_job_eta_seconds", "gauge",
           "Estimated seconds until the job reaches its total steps: (total_steps - step) "
           "/ steps_per_second at its newest report, less the time since.", JOB_LABELS),
    Family("gpu_audit_launcher_job_metric", "gauge",
           "Newest value of a numeric user metric the job reported.", (*JOB_LABELS, "metric")),
    Family("gpu_audit_launcher_job_last_checkpoint_step", "gauge",
           "Step of the job's newest committed checkpoint.", JOB_LABELS),
    Family("gpu_audit_launcher_jobs", "gauge", "Jobs in the launcher by state.", ("state",)),
    Family("gpu_audit_launcher_waiting_jobs", "gauge",
           "Waiting jobs (queued, requeued, held) by the kind of their current reason: new, "
           "held, dependency, backoff, user_limit, project_limit, priority, resources, "
           "gpu_memory, preempting, yielded (`gpu-audit launcher queue` gives the numbers).",
           ("reason",)),
    Family("gpu_audit_launcher_decisions_total", "counter",
           "Scheduling decisions made (starts and preemptions).", ("action",)),
    Family("gpu_audit_launcher_preemptions_total", "counter",
           "Preemptions by outcome: checkpointed (exited with the preempted code) or killed "
           "after the grace period.", ("outcome",)),
    Family("gpu_audit_launcher_preempt_signal_to_commit_seconds", "histogram",
           "From the preemption signal to the job's checkpoint commit."),
    Family("gpu_audit_launcher_preempt_commit_to_exit_seconds", "histogram",
           "From the job's checkpoint commit to its exit."),
    Family("gpu_audit_launcher_lost_gpu_seconds_total", "counter",
           "GPU-seconds of work lost to preemptions and failures (since the newest commit)."),
    Family("gpu_audit_launcher_anomalies_total", "counter",
           "Training anomalies (NaN/inf loss, loss spikes) the jobs reported."),
)}


class _Histogram:
    def __init__(self) -> None:
        self.counts = [0] * len(LATENCY_BUCKETS)
        self.total = 0
        self.sum = 0.0

    def observe(self, v: float) -> None:
        self.total += 1
        self.sum += v
        for i, b in enumerate(LATENCY_BUCKETS):
            if v <= b:
                self.counts[i] += 1

    def family(self, f: Family) -> HistogramMetricFamily:
        h = HistogramMetricFamily(f.name, f.help)
        buckets = [(f"{b:g}", float(c)) for b, c in zip(LATENCY_BUCKETS, self.counts,
                                                          strict=True)]
        buckets.append(("+Inf", float(self.total)))
        h.add_metric([], buckets, self.sum)
        return h


@dataclass
class _JobSeries:
    labels: tuple[str, ...]
    progress: Progress | None = None
    checkpoint_step: float | None = None
    metrics: dict[str, float] | None = None


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    return float(v)


class Telemetry(Collector):
    """Updated by the daemon's loop, read by scrapes (a lock between them)."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._jobs: dict[Any, _JobSeries] = {}
        self._states: dict[str, int] = {}
        self._waiting: dict[str, int] = {}
        self._decisions: dict[str, int] = {}
        self._preemptions: dict[str, int] = {}
        self._s2c = _Histogram()
        self._c2e = _Histogram()
        self._lost = 0.0
        self._anomalies = 0

    # --- updates -------------------------------------------------------------------------

    def job_started(self, job: Any, name: str, user: str, project: str, attempt: int) -> None:
        with self._lock:
            self._jobs[job] = _JobSeries((str(job), name, user, project, str(attempt)))

    def job_ended(self, job: Any) -> None:
        with self._lock:
            self._jobs.pop(job, None)

    def job_event(self, job: Any, doc: Mapping[str, Any]) -> None:
        with self._lock:
            series = self._jobs.get(job)
            event = doc.get("event")
            if event == "anomaly":
                self._anomalies += 1
            if series is None:
                return
            if event == "metrics":
                now = self._clock()
                t = _number(doc.get("time"))
                when = now if t is None or not 0 <= t <= now else t  # never in the future
                p = progress_of(doc, when, 0)
                if p.step is not None:
                    series.progress = p
                elif p.loss is not None and series.progress is not None:
                    series.progress = Progress(**{**series.progress.as_dict(), "loss": p.loss})
                for key, value in doc.items():
                    v = _number(value)
                    if v is None or key in ("event", "time", "pid") or key in PROGRESS_FIELDS:
                        continue
                    if _METRIC_NAME.match(key):
                        m = series.metrics if series.metrics is not None else {}
                        if key in m or len(m) < MAX_USER_METRICS:
                            m[key] = v
                        series.metrics = m
            elif event == "checkpoint_committed":
                series.checkpoint_step = _number(doc.get("step"))

    def set_states(self, counts: Mapping[str, int]) -> None:
        with self._lock:
            self._states = dict(counts)

    def set_waiting(self, counts: Mapping[str, int]) -> None:
        """Waiting jobs per reason kind (every kind listed, 0 where none waits)."""
        with self._lock:
            self._waiting = dict(counts)

    def decision(self, action: str) -> None:
        with self._lock:
            self._decisions[action] = self._decisions.get(action, 0) + 1

    def preemption(self, outcome: str, signal_to_commit: float | None,
                   commit_to_exit: float | None, lost_gpu_seconds: float) -> None:
        with self._lock:
            self._preemptions[outcome] = self._preemptions.get(outcome, 0) + 1
            if signal_to_commit is not None:
                self._s2c.observe(signal_to_commit)
            if commit_to_exit is not None:
                self._c2e.observe(commit_to_exit)
            self._lost += lost_gpu_seconds

    def lost(self, gpu_seconds: float) -> None:
        with self._lock:
            self._lost += gpu_seconds

    # --- collect -------------------------------------------------------------------------

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            yield from self._job_families()
            f = FAMILIES["gpu_audit_launcher_jobs"]
            g = GaugeMetricFamily(f.name, f.help, labels=list(f.labels))
            for state, n in sorted(self._states.items()):
                g.add_metric([state], n)
            yield g
            f = FAMILIES["gpu_audit_launcher_waiting_jobs"]
            g = GaugeMetricFamily(f.name, f.help, labels=list(f.labels))
            for kind, n in sorted(self._waiting.items()):
                g.add_metric([kind], n)
            yield g
            for name, table in (("gpu_audit_launcher_decisions_total", self._decisions),
                                ("gpu_audit_launcher_preemptions_total", self._preemptions)):
                f = FAMILIES[name]
                c = CounterMetricFamily(f.name.removesuffix("_total"), f.help,
                                        labels=list(f.labels))
                for key, n in sorted(table.items()):
                    c.add_metric([key], n)
                yield c
            yield self._s2c.family(FAMILIES["gpu_audit_launcher_preempt_signal_to_commit_seconds"])
            yield self._c2e.family(FAMILIES["gpu_audit_launcher_preempt_commit_to_exit_seconds"])
            f = FAMILIES["gpu_audit_launcher_lost_gpu_seconds_total"]
            yield CounterMetricFamily(f.name.removesuffix("_total"), f.help, value=self._lost)
            f = FAMILIES["gpu_audit_launcher_anomalies_total"]
            yield CounterMetricFamily(f.name.removesuffix("_total"), f.help,
                                      value=self._anomalies)

    def _job_families(self) -> Iterator[Metric]:
        fams = {n: FAMILIES[n] for n in (
            "gpu_audit_launcher_job_step", "gpu_audit_launcher_job_loss",
            "gpu_audit_launcher_job_total_steps", "gpu_audit_launcher_job_progress_ratio",
            "gpu_audit_launcher_job_steps_per_second", "gpu_audit_launcher_job_epoch",
            "gpu_audit_launcher_job_eta_seconds",
            "gpu_audit_launcher_job_metric", "gpu_audit_launcher_job_last_checkpoint_step")}
        out = {n: GaugeMetricFamily(f.name, f.help, labels=list(f.labels))
               for n, f in fams.items()}
        now = self._clock()
        for s in self._jobs.values():
            p = s.progress
            if p is not None:
                for name, v in (
                        ("gpu_audit_launcher_job_step", p.step),
                        ("gpu_audit_launcher_job_loss", p.loss),
                        ("gpu_audit_launcher_job_total_steps", p.total_steps),
                        ("gpu_audit_launcher_job_progress_ratio", fraction(p)),
                        ("gpu_audit_launcher_job_steps_per_second", p.steps_per_second),
                        ("gpu_audit_launcher_job_epoch", p.epoch),
                        ("gpu_audit_launcher_job_eta_seconds", estimate_remaining(p, now))):
                    if v is not None:
                        out[name].add_metric(list(s.labels), float(v))
            if s.checkpoint_step is not None:
                out["gpu_audit_launcher_job_last_checkpoint_step"].add_metric(
                    list(s.labels), s.checkpoint_step)
            for key, v in sorted((s.metrics or {}).items()):
                out["gpu_audit_launcher_job_metric"].add_metric([*s.labels, key], v)
        yield from out.values()
