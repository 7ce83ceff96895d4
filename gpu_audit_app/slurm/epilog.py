"""`gpu-audit slurm epilog`: a Slurm job's run has ended on this node; record it.

Run by deploy/slurm/epilog.sh (as root, by slurmd, with Slurm's SLURM_JOB_* environment)
before it removes the job-mapping file the prolog wrote. It:

1. takes the run's GPUs and start from that file, and the run's StartTime/EndTime from
   slurmctld (`scontrol show job`) when the job record still describes this run (a
   requeued job's record already describes the next one: then the prolog's start and
   this clock, in whole seconds as Slurm counts, are used, and the record says so);
2. measures what the run did on its GPUs from the node's audit trail (the exporter's
   archive, then its spool for what is not archived yet): GPU time held, busy share,
   idle-held time, peak memory, energy (chargeback.slurm.usage);
3. appends one `job_finished` record to the hash-chained stream `slurm` in its own spool
   (`<slurm dir>/spool`, shipped like the launcher's), writes the report as JSON to
   `<slurm dir>/reports/<job>.<attempt>.json`, optionally stores it in the job's
   AdminComment (`sacctmgr`), and prints it (slurmd's log).

It never fails the job: every problem is printed and the exit status says only whether
all went well (epilog.sh logs it and exits 0, since a failing Epilog drains the node).

What the run was (Slurm's times for it, its attempt, when the trail covers its end, its
usage by that trail) is the chargeback component's (chargeback.slurm.ended); this module
is the wiring around it: Slurm's environment, the prolog's and the job's files, the
configuration, the record, the report and what is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import math
import os
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson

from chargeback.slurm.ended import (
    attempt_of,
    measure_run,
    slurm_times,
    trail_covers,
    wait_for_trail,
)
from chargeback.slurm.report import RunReport, admin_comment, render_text, with_usage
from chargeback.slurm.usage import UsageMeter
from chargeback.software import SoftwareUsage
from gpu_audit import __version__, slurmcmd
from gpu_audit.atomicfile import replace_file
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.jobevents import job_event
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.errors import EXIT_FAILURE, EXIT_OK, ConfigError
from gpu_audit.spool import SpoolConfig, SpoolWriter
from gpu_audit.spool.errors import SpoolLocked
from gpu_audit_app.chargeback.sources import archive_source
from gpu_audit_app.config import Config, load_settings
from launcher.progress import clean_environment, estimate_remaining, fraction, progress_of

DEFAULT_JOBMAP_DIR = Path("/run/gpu-audit/jobs")
DEFAULT_SLURM_DIR = Path("/var/lib/gpu-audit/slurm")
# the prolog makes each GPU job's events file here (owned by the job's user), the job
# step wrapper points GPU_AUDIT_EVENTS_FILE at it, the epilog reads and removes it
DEFAULT_EVENTS_DIR = Path("/run/gpu-audit/slurm-events")
EVENTS_TAIL_BYTES = 256 * 1024  # the newest progress is at the end: never read more
STREAM = "slurm"
LOCK_WAIT_S = 30.0  # two runs ending at once on a node: the second waits for the spool
_MAX_JOBMAP_BYTES = 64 * 1024


def read_jobmap(path: Path) -> Mapping[str, Any] | None:
    """The prolog's file (root's directory, but opened without following a link and read
    up to a cap all the same); None when there is none (the run held no GPU)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(_MAX_JOBMAP_BYTES + 1)
    if len(data) > _MAX_JOBMAP_BYTES:
        raise ValueError(f"{path}: over {_MAX_JOBMAP_BYTES} bytes")
    doc = orjson.loads(data)
    if not isinstance(doc, dict):
        raise ValueError(f"{path}: not a JSON object")
    return doc


def events_path(events_dir: Path, job_id: str) -> Path:
    """Where the prolog makes the job's events file (the helper's report channel) on this
    node, and requeue-on-preempt.sh points GPU_AUDIT_EVENTS_FILE at."""
    return events_dir / f"{job_id}.jsonl"


def read_job_events(path: Path, uid: int | None, end: float
                    ) -> tuple[dict[str, Any], dict[str, Any], str | None]:
    """(progress, environment, problem) from the job's events file: the newest `metrics`
    event (sanitised by launcher.progress: a job is not trusted, and with
    `remaining_seconds` at the run's end) and the newest `environment` event. Only the
    last EVENTS_TAIL_BYTES are read, from a regular file owned by the job's user opened
    without following a link; anything else is a problem, said, and nothing is taken."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return {}, {}, None  # the job did not use the helper, or ran outside its wrapper
    except OSError as exc:
        return {}, {}, f"{path}: {exc.strerror}"
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or (uid is not None and st.st_uid not in (uid, 0)):
            return {}, {}, f"{path}: not a regular file of the job's user: not read"
        fh.seek(max(0, st.st_size - EVENTS_TAIL_BYTES))
        data = fh.read(EVENTS_TAIL_BYTES)
    metrics: Mapping[str, Any] | None = None
    env: Mapping[str, Any] | None = None
    lines = data.split(b"\n")
    if st.st_size > EVENTS_TAIL_BYTES:
        lines = lines[1:]  # the first line may be cut
    for line in lines:
        try:
            doc = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(doc, dict):
            if doc.get("event") == "metrics":
                metrics = doc
            elif doc.get("event") == "environment":
                env = doc
    progress: dict[str, Any] = {}
    if metrics is not None:
        t = metrics.get("time")
        when = float(t) if isinstance(t, int | float) and not isinstance(t, bool) \
            and 0 <= t <= end else end
        p = progress_of(metrics, when, 0)
        if p.step is not None:
            progress = {k: v for k, v in p.as_dict().items() if k != "attempt"}
            progress["reported_at"] = progress.pop("time")
            progress["fraction"] = fraction(p)
            progress["remaining_seconds"] = estimate_remaining(p, end)
            progress = {k: v for k, v in progress.items() if v is not None}
    return progress, clean_environment(env) if env is not None else {}, None


def measure(config: Config, config_path: Path | None, job_id: str, start: float,
            end: float) -> tuple[UsageMeter, list[str], SoftwareUsage]:
    """The job's usage on this node from the exporter's archive (when the configuration
    has an archive sink) and spool: where they are and the key, for measure_run."""
    dirs: list[Path] = []
    key = None
    try:
        archive, key = archive_source(config_path)
        dirs.append(archive)
    except ConfigError:
        pass  # no archive sink: the spool alone
    dirs.append(config.spool.directory)
    return measure_run(dirs, key, job_id, start=start, end=end,
                       audit_interval=config.audit.interval_seconds,
                       sample_interval=config.exporter.interval_seconds)


def write_record(slurm_dir: Path, report: RunReport, host: str,
                 hmac_key_file: Path | None) -> None:
    """Append the run's `job_finished` record to the `slurm` stream (waiting for another
    epilog that holds the spool)."""
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            spool = SpoolWriter(SpoolConfig(directory=slurm_dir / "spool", fsync_window_ms=0))
            break
        except SpoolLocked:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    try:
        producer = AuditProducer(AuditConfig(stream=STREAM, hmac_key_file=hmac_key_file), spool,
                                 host=host, exporter_version=__version__, simulated=False,
                                 lifecycle_events=None)
        producer.start()
        producer.commit_records([job_event("job_finished", timestamp=time.time(), host=host,
                                           stream=STREAM, version=__version__,
                                           job=report.job_fields())])
        failed = producer.failed_by_reason()
        if failed:
            raise OSError(errno.EIO, f"the spool refused the record: {dict(failed)}")
    finally:
        spool.close()


def spawn_store_comment(job_id: str, slurm_dir: Path) -> bool:
    """Start `gpu-audit slurm store-comment` in its own session and return at once: the
    job ends only after its Epilog, and slurmctld's final record of it would overwrite an
    AdminComment stored before it reaches slurmdbd, so it is stored once it has."""
    argv = [sys.executable, "-m", "gpu_audit_app", "slurm", "store-comment", job_id,
            "--slurm-dir", str(slurm_dir)]
    try:
        subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)
    except OSError as exc:
        print(f"gpu-audit slurm epilog: job {job_id}: AdminComment not stored: {exc}",
              file=sys.stderr)
        return False
    return True


def store_comment(args: argparse.Namespace) -> int:
    """`gpu-audit slurm store-comment JOBID`: once sacct shows the job's run ended, store
    this node's reports of the job in its AdminComment (sacctmgr)."""
    job_id = args.job_id
    slurm_dir = Path(args.slurm_dir or os.environ.get("GPU_AUDIT_SLURM_DIR")
                     or DEFAULT_SLURM_DIR)
    runs = stored_reports(slurm_dir, job_id)
    if not job_id.isdigit() or not runs:
        print(f"gpu-audit slurm store-comment: no report of job {job_id} in "
              f"{slurm_dir / 'reports'}", file=sys.stderr)
        return EXIT_FAILURE
    newest = max(runs, key=lambda r: r.attempt)
    deadline = time.monotonic() + args.wait
    while True:
        try:
            rows = slurmcmd.parsable(slurmcmd.run("sacct", [
                "-j", job_id, "-X", "-D", "-n", "-P", "-o", "Start,End"]), ("Start", "End"))
        except slurmcmd.SlurmCommandError:
            rows = []
        if any(slurmcmd.parse_time(r["Start"]) == newest.start_time
               and slurmcmd.parse_time(r["End"]) is not None for r in rows) or (
                newest.time_source == "node" and any(
                    slurmcmd.parse_time(r["End"]) is not None for r in rows)):
            break
        if time.monotonic() > deadline:
            print(f"gpu-audit slurm store-comment: job {job_id} has no ended run in sacct "
                  f"after {args.wait:g} s", file=sys.stderr)
            return EXIT_FAILURE
        time.sleep(1.0)
    try:
        slurmcmd.run("sacctmgr", ["-i", "modify", "job", "where", f"jobid={job_id}", "set",
                                  f"AdminComment={admin_comment(runs)}"], timeout=30)
    except slurmcmd.SlurmCommandError as exc:
        print(f"gpu-audit slurm store-comment: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK


def stored_reports(slurm_dir: Path, job_id: str) -> list[RunReport]:
    out = []
    for path in sorted((slurm_dir / "reports").glob(f"{job_id}.*.json")):
        try:
            out.append(RunReport.from_json(orjson.loads(path.read_bytes())))
        except (OSError, ValueError, TypeError):
            continue
    return out


def epilog(args: argparse.Namespace) -> int:
    env = os.environ
    job_id = env.get("SLURM_JOB_ID", "")
    if not job_id.isdigit():
        print(f"gpu-audit slurm epilog: SLURM_JOB_ID is missing or not a number "
              f"({job_id or 'unset'}): nothing recorded", file=sys.stderr)
        return EXIT_FAILURE
    jobmap_dir = Path(args.jobmap_dir or env.get("GPU_AUDIT_JOBMAP_DIR") or DEFAULT_JOBMAP_DIR)
    slurm_dir = Path(args.slurm_dir or env.get("GPU_AUDIT_SLURM_DIR") or DEFAULT_SLURM_DIR)
    now = time.time()
    try:
        doc = read_jobmap(jobmap_dir / f"slurm-{job_id}.json")
    except (OSError, ValueError) as exc:
        print(f"gpu-audit slurm epilog: job {job_id}: {exc}: nothing recorded", file=sys.stderr)
        return EXIT_FAILURE
    if doc is None:
        return EXIT_OK  # no GPU on this node: nothing to account
    gpus = tuple(str(g) for g in doc.get("gpus", []) if isinstance(g, str))
    prolog_start = doc.get("start_time")
    prolog_start = float(prolog_start) if isinstance(prolog_start, int | float) else None
    run = slurm_times(job_id, prolog_start, warn=lambda line: print(
        f"gpu-audit slurm epilog: {line}", file=sys.stderr))
    if run.times is not None:
        (start, end), source = run.times, "slurm"
    else:
        start = prolog_start if prolog_start is not None else now
        end, source = float(math.floor(now)), "node"
    attempt = attempt_of(doc.get("restart_count"), run, env.get("SLURM_JOB_RESTART_COUNT", ""))
    exit_code = env.get("SLURM_JOB_EXIT_CODE", "")
    events_dir = Path(args.events_dir or env.get("GPU_AUDIT_SLURM_EVENTS_DIR")
                      or DEFAULT_EVENTS_DIR)
    uid_text = env.get("SLURM_JOB_UID", "")
    ev_file = events_path(events_dir, job_id)
    progress, environment, problem = read_job_events(
        ev_file, int(uid_text) if uid_text.isdigit() else None, end)
    if problem is not None:
        print(f"gpu-audit slurm epilog: job {job_id}: events file {problem}", file=sys.stderr)
    with contextlib.suppress(OSError):
        ev_file.unlink()  # this run's; the next run's prolog makes a fresh one
    report = RunReport(
        job_id=job_id, node=env.get("SLURMD_NODENAME") or socket.gethostname(),
        attempt=attempt,
        user=env.get("SLURM_JOB_USER", ""), account=env.get("SLURM_JOB_ACCOUNT", ""),
        partition=env.get("SLURM_JOB_PARTITION", ""), gpus=gpus, start_time=start,
        end_time=end, time_source=source,
        exit_code=int(exit_code) if exit_code.lstrip("-").isdigit() else None,
        progress=progress, environment=environment)
    ok = True
    try:
        config = load_settings(args.config)
    except ConfigError as exc:
        # without it neither the trail nor the stream's HMAC key is known: the report
        # file and AdminComment only, no record (an unkeyed one would break the chain)
        config = None
        ok = False
        print(f"gpu-audit slurm epilog: job {job_id}: configuration error in {exc.render()}; "
              "no record written", file=sys.stderr)
    if config is not None:
        try:
            every = config.audit.interval_seconds
            if not wait_for_trail(config.spool.directory, end, every,
                                  config.exporter.interval_seconds, limit=args.trail_wait):
                print(f"gpu-audit slurm epilog: job {job_id}: the exporter wrote no record "
                      f"past {trail_covers(end, every):.0f} (its audit interval after the "
                      "run's end): the report may miss the run's last interval",
                      file=sys.stderr)
            meter, problems, software = measure(config, args.config, job_id, start, end)
            for p in problems[:5]:
                print(f"gpu-audit slurm epilog: audit trail: {p}", file=sys.stderr)
            usage = meter.jobs.get(job_id)
            with_usage(report, usage)
            if usage is not None:
                report.software = software.of_processes(usage.pids)
        except (OSError, ValueError, ConfigError) as exc:
            ok = False
            print(f"gpu-audit slurm epilog: job {job_id}: cannot read the audit trail: {exc}",
                  file=sys.stderr)
        try:
            write_record(slurm_dir, report, config.host, config.audit.hmac_key_file)
        except (OSError, ValueError) as exc:
            ok = False
            print(f"gpu-audit slurm epilog: job {job_id}: cannot write its record to "
                  f"{slurm_dir / 'spool'}: {exc}", file=sys.stderr)
    try:
        (slurm_dir / "reports").mkdir(parents=True, exist_ok=True)
        replace_file(slurm_dir / "reports" / f"{job_id}.{report.attempt}.json",
                     orjson.dumps(report.to_json(), option=orjson.OPT_SORT_KEYS))
    except OSError as exc:
        ok = False
        print(f"gpu-audit slurm epilog: job {job_id}: cannot write its report: {exc}",
              file=sys.stderr)
    if args.admin_comment:
        ok = spawn_store_comment(job_id, slurm_dir) and ok
    print(render_text([report]), end="")
    return EXIT_OK if ok else EXIT_FAILURE
