"""`gpu-audit launcher ...`: the daemon (`serve`) and its clients.

serve wires the launcher's parts (store, scheduler, engine, GPU state, executor,
job-mapping writer, audit spool, telemetry endpoint) from one YAML file; the client
commands talk to the daemon's unix socket (launcher.protocol) and never name the caller:
the daemon asks the kernel.

Exit codes: 0 done; 1 the daemon refused (not found, denied) or could not be reached;
2 bad arguments, configuration or job spec (every problem listed).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from gpu_audit.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, ConfigError
from launcher.config import LauncherCoreConfig
from launcher.limits import DaemonLimits
from launcher.progress import describe_environment, format_duration
from launcher.protocol import DEFAULT_SOCKET, ProtocolError, RequestTooLarge, call


class LauncherConfig(BaseModel):
    """The daemon's settings (`gpu-audit launcher serve --config FILE`)."""

    model_config = ConfigDict(extra="forbid")

    state_dir: Path = Field(Path("/var/lib/gpu-audit/launcher"),
                            description="Directory of the SQLite state (launcher.db), job "
                            "logs and the instance lock; created if missing. One daemon "
                            "per directory.")
    socket: Path = Field(DEFAULT_SOCKET, description="The unix socket clients connect to "
                         "(clients: `--socket` or GPU_AUDIT_LAUNCHER_SOCKET).")
    socket_mode: int = Field(0o666, ge=0, le=0o777,
                             description="Permission bits of the socket (0666: every local "
                             "user may submit; 0660 with socket_group: only its members). "
                             "Octal in YAML is 0666 (0o666 is refused); 438 is the same.")
    socket_group: str | None = Field(None, description="Group the socket is chowned to "
                                     "(with socket_mode 0660: only its members may "
                                     "submit); null: left as created.")
    admin_group: str | None = Field(None, description="Members may cancel, hold, release "
                                    "and read the logs of every job (root always may); "
                                    "null: root only.")
    tick_seconds: float = Field(1.0, gt=0, le=60,
                                description="Seconds between the daemon's engine rounds "
                                "(measure GPUs, reap exits, schedule).")
    gpus: str = Field("nvml", description="GPU state source: `nvml`, `sim:N` (N simulated "
                      "GPUs, 1-64) or `exporter:URL` (the node exporter's base URL).")
    jobmap_dir: Path | None = Field(Path("/run/gpu-audit/jobs"),
                                    description="Where job-mapping files for the exporter's "
                                    "attribution are written (its attribution.jobmap_dir); "
                                    "null: none written.")
    spool_dir: Path | None = Field(None, description="Audit spool of the launcher's "
                                   "lifecycle records (stream `launcher`); null: "
                                   "<state_dir>/spool.")
    metrics_listen: str | None = Field(None, description="HOST:PORT of the launcher's "
                                       "Prometheus endpoint (job telemetry; empty host: "
                                       "127.0.0.1); null: none.")
    web_config_file: Path | None = Field(None, description="TLS and basic auth of the "
                                         "metrics endpoint: a Prometheus web-config file "
                                         "(the same format as exporter.web_config_file); "
                                         "null: plain HTTP, no auth.")
    allow_root_jobs: bool = Field(False, description="Let root submit jobs that run as "
                                  "root (off: refused).")
    log_level: str = Field("info", description="Least severe log level written to stderr "
                           "(debug, info, warning, error); an unknown name logs at info.")
    core: LauncherCoreConfig = Field(default_factory=LauncherCoreConfig,
                                     description="Scheduling policy and engine timings "
                                     "(launcher/config.py), the same model replay uses.")
    limits: DaemonLimits = Field(default_factory=DaemonLimits,
                                 description="What clients may cost the daemon: connections "
                                 "per uid and in total, bytes per request and in all, "
                                 "deadlines to send a request and to read an answer "
                                 "(launcher/limits.py).")

    @model_validator(mode="after")
    def _daemon_policy(self) -> LauncherConfig:
        if self.core.policy.name == "hand-launched":
            raise ValueError("core.policy.name: `hand-launched` is a replay baseline (people "
                             "starting jobs by hand), not a policy the daemon runs")
        return self


def load_config(path: Path | None, overrides: Mapping[str, Any]) -> LauncherConfig:
    from gpu_audit.yamlload import load_file

    base = load_file(LauncherConfig, path) if path is not None else LauncherConfig()
    data = base.model_dump()
    data.update({k: v for k, v in overrides.items() if v is not None})
    return LauncherConfig.model_validate(data)


def serve_options() -> dict[str, str]:
    """Each `serve` option that sets a configuration key (key -> option), read from the
    parser: the options whose destination is a LauncherConfig key. `_serve` applies
    exactly these and the configuration reference lists them."""
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["serve"]
    return {a.dest: max(a.option_strings, key=len) for a in serve._actions
            if a.option_strings and a.dest in LauncherConfig.model_fields}


def add_arguments(p: argparse.ArgumentParser) -> None:
    lsub = p.add_subparsers(dest="launcher_command", metavar="ACTION", required=True)
    s = lsub.add_parser("serve", help="Run the launcher daemon.",
                        description="Run the node-local job launcher: a fair priority queue "
                        "with checkpoint-first preemption, on a unix socket.")
    s.add_argument("--config", type=Path, metavar="FILE",
                   help="The launcher's YAML configuration (docs/CONFIGURATION.md).")
    s.add_argument("--state-dir", type=Path, metavar="DIR",
                   help="Where the job store, logs and job-mapping files live (state_dir).")
    s.add_argument("--socket", type=Path, metavar="PATH",
                   help="The unix socket clients connect to (socket).")
    s.add_argument("--gpus", metavar="SOURCE",
                   help="Where the GPUs are read from: nvml, sim:N or exporter:URL (gpus).")
    s.add_argument("--metrics-listen", metavar="HOST:PORT",
                   help="Serve the launcher's Prometheus metrics here (metrics_listen).")

    def client(name: str, help_text: str) -> argparse.ArgumentParser:
        c = lsub.add_parser(name, help=help_text, description=help_text)
        c.add_argument("--socket", type=Path, metavar="PATH",
                       default=Path(os.environ.get("GPU_AUDIT_LAUNCHER_SOCKET",
                                                   str(DEFAULT_SOCKET))),
                       help="The daemon's socket (GPU_AUDIT_LAUNCHER_SOCKET; default "
                       f"{DEFAULT_SOCKET}).")
        c.add_argument("--json", action="store_true", help="Print the daemon's JSON answer.")
        return c

    c = client("submit", "Submit a job or a pipeline (YAML).")
    c.add_argument("file", type=Path, metavar="FILE",
                   help="The job or pipeline spec (docs/LAUNCHER.md).")
    client("queue", "Waiting and running jobs, each waiting job's priority by term.")
    c = client("status", "Your jobs, or one job in detail.")
    c.add_argument("id", nargs="?", metavar="ID", help="One job (default: all of yours).")
    c.add_argument("--events-from", type=int, metavar="N",
                   help="With an id: the page of its events from event N (0: the oldest); "
                   "default: the newest 200.")
    c = client("logs", "A job's output (your own jobs; admins: all).")
    c.add_argument("id", metavar="ID", help="The job.")
    c.add_argument("--follow", "-f", action="store_true", help="Keep printing until it ends.")
    c.add_argument("--stderr", action="store_true", help="stderr instead of stdout.")
    c.add_argument("--attempt", type=int, metavar="N",
                   help="The output of attempt N (default: the newest).")
    for name, text in (("cancel", "Cancel a job (running: its process group is killed)."),
                       ("hold", "Keep a waiting job from starting."),
                       ("release", "Let a held job start again."),
                       ("retry", "Queue a failed, timed out or cancelled job again, with the "
                        "jobs its failure cancelled (its pipeline's later steps); it resumes "
                        "from its newest checkpoint, if any.")):
        c = client(name, text)
        c.add_argument("id", metavar="ID", help="The job.")
    from gpu_audit_app.launcher.replay import add_replay_arguments

    add_replay_arguments(lsub)


def command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    cmd = args.launcher_command
    if cmd == "serve":
        return _serve(args)
    if cmd == "replay":
        from gpu_audit_app.launcher.replay import replay_command

        return replay_command(args, lambda path: load_config(path, {}).core)
    try:
        return _client(cmd, args)
    except RequestTooLarge as exc:
        print(f"gpu-audit launcher {cmd}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except ProtocolError as exc:
        print(f"gpu-audit launcher {cmd}: {exc}", file=sys.stderr)
        return EXIT_FAILURE


# --- serve ---------------------------------------------------------------------------


def _serve(args: argparse.Namespace) -> int:
    from gpu_audit.errors import LockHeld
    from gpu_audit.logredact import setup_logging
    from launcher.loopstats import LoopStats
    from launcher.safefs import UnsafePath
    from launcher.server import run_daemon

    config = load_config(args.config, {key: getattr(args, key) for key in serve_options()})
    setup_logging(config.log_level)
    _gpu_source(config.gpus)  # a bad source is exit 2 before anything starts
    if config.core.quotas.projects and not config.core.projects:
        import logging

        logging.getLogger("gpu_audit.launcher").warning(
            "core.quotas.projects sets limits for %s, but core.projects configures no "
            "membership: any user may name any project, so those limits bound only what "
            "users choose to write (list each project's groups or users in core.projects)",
            ", ".join(sorted(config.core.quotas.projects)[:10]))
    # the daemon's own files are private unless made otherwise (the socket, the job
    # directories and the job-mapping files set their modes); jobs get the umask it had
    job_umask = os.umask(0o077)
    stats = LoopStats()
    try:
        return run_daemon(lambda: _build(config, stats, job_umask),
                          state_dir=config.state_dir, socket_path=config.socket,
                          socket_mode=config.socket_mode, socket_group=config.socket_group,
                          admin_group=config.admin_group, tick_seconds=config.tick_seconds,
                          limits=config.limits, stats=stats)
    except LockHeld as exc:
        print(f"gpu-audit launcher serve: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    except UnsafePath as exc:
        print(f"gpu-audit launcher serve: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _gpu_source(text: str) -> Any:
    from launcher.gpustate import ExporterStatusSource, NvmlSource

    kind, _, arg = text.partition(":")
    if kind == "sim":
        if not arg.isdigit() or not 0 < int(arg) <= 64:
            raise ConfigError("launcher", [f"gpus: {text!r}: sim:N needs 1 <= N <= 64"])
        from launcher.sim.gpus import SimGpuSource  # only when asked for by name

        return SimGpuSource(int(arg))
    if kind == "exporter" and arg:
        return ExporterStatusSource(arg)
    if kind == "nvml" and not arg:
        return NvmlSource()
    raise ConfigError("launcher", [f"gpus: {text!r}: one of nvml, sim:N, exporter:URL"])


def _build(config: LauncherConfig, stats: Any = None, job_umask: int = 0o022) -> Any:
    from prometheus_client import CollectorRegistry

    from gpu_audit.http.config import parse_listen
    from gpu_audit.http.server import MetricsServer
    from gpu_audit.http.state import LatestState
    from gpu_audit.http.webconfig import WebConfig, load_web_config
    from launcher.audit import LauncherAudit
    from launcher.engine import Engine
    from launcher.executor import EventsBudget, ProcessExecutor
    from launcher.jobmap import JobMapWriter
    from launcher.scheduler import Scheduler
    from launcher.service import Service
    from launcher.store import Store
    from launcher.telemetry import Telemetry

    gpus = _gpu_source(config.gpus)
    sim = config.gpus.startswith("sim:")
    lim = config.limits
    events = EventsBudget(lim.events_window_seconds, lim.events_max_bytes,
                          lim.events_max_lines)
    executor: ProcessExecutor
    if sim:
        from launcher.sim.binding import SimGpuBinding, SimGpuView  # asked for by name

        binding = SimGpuBinding(config.state_dir, gpus, allow_root_jobs=config.allow_root_jobs,
                                job_umask=job_umask, events=events)
        executor, gpus = binding, SimGpuView(gpus, binding)
    else:
        executor = ProcessExecutor(config.state_dir, allow_root_jobs=config.allow_root_jobs,
                                   job_umask=job_umask, events=events)
    store = Store(config.state_dir / "launcher.db")
    engine = Engine(store, Scheduler(config.core.policy), gpus, executor, time.time,
                    config.core)
    telemetry = Telemetry()
    if config.metrics_listen:
        # the project's endpoint (connection limits, timeouts, TLS and basic auth from
        # web_config_file), as the exporter's and the shipper's
        try:
            host, port = parse_listen(config.metrics_listen)
        except ValueError as exc:
            raise ConfigError("launcher", [f"metrics_listen: {exc}"]) from exc
        if config.metrics_listen.startswith(":"):
            host = "127.0.0.1"  # an empty host is loopback here (documented)
        web = (load_web_config(config.web_config_file) if config.web_config_file is not None
               else WebConfig())
        registry = CollectorRegistry(auto_describe=True)
        registry.register(telemetry)
        if stats is not None:
            registry.register(stats)
        state = LatestState(math.inf, snapshots_expected=False)
        try:
            server = MetricsServer(host, port, state, web, registry,
                                   title="gpu-audit launcher")
        except OSError as exc:
            raise ConfigError("launcher", [f"metrics_listen {config.metrics_listen!r}: "
                                           f"cannot listen: {exc.strerror or exc}"]) from exc
        server.start()
        state.set_backend(True)
    if config.spool_dir is not None:  # inside state_dir it was checked with it
        from launcher.safefs import open_dir

        os.close(open_dir(config.spool_dir, mode=None))
    audit = LauncherAudit(config.spool_dir or config.state_dir / "spool", simulated=sim)
    jobmap = JobMapWriter(config.jobmap_dir) if config.jobmap_dir is not None else None
    return Service(engine, store, executor, jobmap=jobmap, audit=audit, telemetry=telemetry)


# --- clients -------------------------------------------------------------------------


def _refused(cmd: str, resp: Mapping[str, Any]) -> int:
    print(f"gpu-audit launcher {cmd}: {resp.get('message', resp.get('error'))}",
          file=sys.stderr)
    for p in resp.get("problems", []) or []:
        print(f"  - {p}", file=sys.stderr)
    return EXIT_USAGE if resp.get("error") in ("invalid", "bad_request", "too_large") \
        else EXIT_FAILURE


def _client(cmd: str, args: argparse.Namespace) -> int:
    sock: Path = args.socket
    if cmd == "submit":
        try:
            text = args.file.read_text(encoding="utf-8")
        except OSError as exc:
            print(f"gpu-audit launcher submit: cannot read {args.file}: {exc.strerror}",
                  file=sys.stderr)
            return EXIT_USAGE
        resp = call(sock, {"op": "submit", "spec": text, "path": str(args.file),
                           "cwd": os.getcwd()})
    elif cmd == "queue":
        resp = call(sock, {"op": "queue"})
    elif cmd == "status":
        req = {"op": "status", "id": args.id}
        if args.events_from is not None:
            req["events_from"] = args.events_from
        resp = call(sock, req)
    elif cmd == "logs":
        return _logs(sock, args)
    else:
        resp = call(sock, {"op": cmd, "id": args.id})
    if not resp.get("ok"):
        return _refused(cmd, resp)
    if args.json:
        print(json.dumps(resp, indent=2, sort_keys=True))
        return EXIT_OK
    print(_render(cmd, resp))
    return EXIT_OK


def _logs(sock: Path, args: argparse.Namespace) -> int:
    offset = 0
    while True:
        req: dict[str, Any] = {"op": "logs", "id": args.id, "offset": offset,
                               "stream": "err" if args.stderr else "out"}
        if args.attempt is not None:
            req["attempt"] = args.attempt
        resp = call(sock, req)
        if not resp.get("ok"):
            return _refused("logs", resp)
        data = resp.get("data", "")
        if data:
            sys.stdout.write(data)
            sys.stdout.flush()
        offset = int(resp.get("offset", offset))
        if not args.follow or (resp.get("done") and not data):
            return EXIT_OK
        if not data:
            time.sleep(0.5)


# a big submission's estimates are in --json and the queue; the terminal gets the first
SUBMIT_TIMING_ROWS = 20


def _fmt_time(t: float | None) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t)) if t else "-"


def _render(cmd: str, resp: Mapping[str, Any]) -> str:
    if cmd == "submit":
        pairs = ", ".join(f"{i} ({n})" for i, n in zip(resp["ids"], resp["names"],
                                                         strict=True))
        lines = [f"submitted {len(resp['ids'])} job(s): {pairs}"]
        timing = resp.get("timing") or []
        for t in timing[:SUBMIT_TIMING_ROWS]:
            parts = [f"  job {t['id']}:"]
            if t.get("started_at"):
                parts.append(f"started {_fmt_time(t['started_at'])}")
            source = t.get("estimate_source") or "none"
            if t.get("estimated_start") and not t.get("started_at"):
                parts.append(f"estimated start {_fmt_time(t['estimated_start'])} in the "
                             "current queue" + (f", finish {_fmt_time(t['estimated_finish'])}"
                                                if t.get("estimated_finish") else ""))
            elif not t.get("started_at"):
                parts.append("estimated start unknown (a job ahead has no runtime estimate "
                             "or limit)")
            if t.get("earliest_finish"):
                parts.append(f"estimated finish {_fmt_time(t['earliest_finish'])} at the "
                             f"earliest (estimate {format_duration(t['estimate_seconds'])}, "
                             f"source {source})")
            else:
                parts.append(f"no runtime estimate (source {source}: give expected_runtime "
                             "or max_runtime_seconds)")
            if isinstance(t.get("deadline"), (int, float)):
                parts.append(f"deadline {_fmt_time(t['deadline'])}")
            if t.get("warning"):
                parts.append(f"WARNING: {t['warning']}")
            lines.append(" ".join(parts))
        if len(timing) > SUBMIT_TIMING_ROWS:
            lines.append(f"  ... and {len(timing) - SUBMIT_TIMING_ROWS} more (`gpu-audit "
                         "launcher queue` shows each one's estimated start)")
        return "\n".join(lines)
    if cmd == "retry":
        pairs = ", ".join(f"{i} ({n})" for i, n in zip(resp["ids"], resp["names"],
                                                         strict=True))
        step = resp.get("resumes_from_step")
        start = f"resumes from step {step}" if step is not None else "starts over (no checkpoint)"
        return f"queued again: {pairs}; job {resp['id']} {start}"
    if cmd == "queue":
        text = _render_queue(resp["jobs"])
        total = resp.get("waiting_total")
        shown = sum(1 for j in resp["jobs"] if j.get("state") not in ("running", "preempting"))
        if isinstance(total, int) and total > shown:
            text += f"\n... and {total - shown} more waiting (lower priority)"
        return text
    if cmd == "status":
        if "job" in resp:
            return _render_job(resp["job"])
        return _render_table(resp["jobs"])
    return f"job {resp['id']}: {resp.get('state')}"


def _progress_cell(p: Mapping[str, Any] | None) -> str:
    """'40/100 40%' / '40' (no total) / '-'."""
    if not p or p.get("step") is None:
        return "-"
    if p.get("total_steps") is None or p.get("fraction") is None:
        return str(p["step"])
    return f"{p['step']}/{p['total_steps']} {100 * p['fraction']:.0f}%"


def _loss_cell(p: Mapping[str, Any] | None) -> str:
    loss = (p or {}).get("loss")
    return f"{loss:.4g}" if isinstance(loss, int | float) else "-"


def _eta_cell(p: Mapping[str, Any] | None) -> str:
    eta = (p or {}).get("eta_seconds")
    return format_duration(eta) if isinstance(eta, int | float) else "-"


def _estimate_cell(e: Mapping[str, Any] | None, key: str = "remaining_seconds") -> str:
    """'2h00m spec' / '45m10s progress' / '- none': the estimate and where it comes from."""
    if not e:
        return "-"
    v = e.get(key)
    return (f"{format_duration(v) if isinstance(v, int | float) else '-'} "
            f"{e.get('source') or 'none'}")


def _render_table(jobs: Sequence[Mapping[str, Any]]) -> str:
    """Your jobs: a waiting one's last column is why it waits, the others' their GPUs."""
    head = (f"{'ID':>5}  {'NAME':<16} {'USER':<14} {'PROJECT':<12} {'STATE':<10} {'TRY':>3}"
            f"  {'PROGRESS':<18} {'ETA':>7}  {'ESTIMATE (LEFT, SOURCE)':<24}"
            "  GPUS / WAITING FOR")
    rows = [head]
    for j in jobs:
        last = ",".join(g.removeprefix("GPU-") for g in j.get("gpus") or []) or "-"
        if j.get("wait_reason"):
            last = f"{j['wait_reason']}: {j.get('wait_detail') or ''}".rstrip(": ")
        p = j.get("progress")
        rows.append(f"{j['id']:>5}  {j['name'][:16]:<16} {j['user'][:14]:<14} "
                    f"{j['project'][:12]:<12} {j['state']:<10} {j['attempt']:>3}  "
                    f"{_progress_cell(p)[:18]:<18} {_eta_cell(p):>7}  "
                    f"{_estimate_cell(j.get('estimate'))[:24]:<24}  {last}")
    return "\n".join(rows)


def _num(v: object, width: int) -> str:
    return f"{v:>{width}.1f}" if isinstance(v, int | float) else f"{'-':>{width}}"


def _render_queue(jobs: Sequence[Mapping[str, Any]]) -> str:
    """Running jobs (start, attempt, GPUs, the priority they started with), then waiting
    jobs (priority by term, and the one reason each waits)."""
    running = [j for j in jobs if j.get("state") in ("running", "preempting")]
    waiting = [j for j in jobs if j not in running]
    rows = [f"RUNNING {len(running)}",
            f"{'ID':>5}  {'NAME':<16} {'USER':<14} {'STATE':<10} {'STARTED':<8} {'TRY':>3} "
            f"{'PRIORITY':>9}  {'PROGRESS':<18} {'LOSS':>9} {'ETA':>7}  "
            f"{'ESTIMATE (LEFT, SOURCE)':<24} {'END':<8}  GPUS"]
    for j in running:
        gpus = ",".join(g.removeprefix("GPU-") for g in j.get("gpus") or []) or "-"
        rows.append(f"{j['id']:>5}  {j['name'][:16]:<16} {j['user'][:14]:<14} "
                    f"{j['state']:<10} {_fmt_time(j.get('started_at')):<8} "
                    f"{j.get('attempt', 0):>3} {_num(j.get('start_priority'), 9)}  "
                    f"{_progress_cell(j.get('progress'))[:18]:<18} "
                    f"{_loss_cell(j.get('progress')):>9} {_eta_cell(j.get('progress')):>7}  "
                    f"{_estimate_cell(j.get('estimate'))[:24]:<24} "
                    f"{_fmt_time(j.get('estimated_end')):<8}  {gpus}")
    rows += ["", f"WAITING {len(waiting)}",
             f"{'ID':>5}  {'NAME':<16} {'USER':<14} {'STATE':<10} {'PRIORITY':>9} "
             f"{'URGENCY':>8} {'TIER':>7} {'AGE':>7} {'FAIRSHR':>8}  "
             f"{'ESTIMATE (RUNTIME, SOURCE)':<26} {'START':<8}  REASON"]
    for j in waiting:
        p = j.get("priority") or {}
        fair = None
        if isinstance(p.get("fairshare_user"), int | float):
            fair = p["fairshare_user"] + (p.get("fairshare_project") or 0.0)
        reason = j.get("wait_reason") or "-"
        detail = j.get("wait_detail") or ""
        rows.append(f"{j['id']:>5}  {j['name'][:16]:<16} {j['user'][:14]:<14} "
                    f"{j['state']:<10} {_num(p.get('total'), 9)} {_num(p.get('urgency'), 8)} "
                    f"{_num(p.get('tier'), 7)} {_num(p.get('age'), 7)} {_num(fair, 8)}  "
                    f"{_estimate_cell(j.get('estimate'), 'total_seconds')[:26]:<26} "
                    f"{_fmt_time(j.get('estimated_start')):<8}  "
                    f"{reason}: {detail}".rstrip(": "))
    return "\n".join(rows)


def _render_job(j: Mapping[str, Any]) -> str:
    lines = [f"job {j['id']} {j['name']}: {j['state']} (attempt {j['attempt']})",
             f"  user {j['user']}, project {j['project']}",
             f"  gpus {', '.join(j.get('gpus') or []) or '-'}",
             f"  submitted {_fmt_time(j.get('submitted_at'))}, started "
             f"{_fmt_time(j.get('started_at'))}, finished {_fmt_time(j.get('finished_at'))}"]
    if j.get("exit_code") is not None:
        lines.append(f"  exit code {j['exit_code']}")
    if j.get("wait_reason"):
        lines.append(f"  waiting: {j['wait_reason']}: {j.get('wait_detail') or ''}".rstrip())
    if j.get("start_priority") is not None:
        lines.append(f"  started with priority {j['start_priority']:.1f}")
    if j.get("reason"):
        lines.append(f"  reason: {j['reason']}")
    if j.get("last_checkpoint_step") is not None:
        lines.append(f"  last checkpoint: step {j['last_checkpoint_step']}")
    p = j.get("progress")
    if p and p.get("step") is not None:
        parts = [f"step {_progress_cell(p)}"]
        if p.get("epoch") is not None:
            parts.append(f"epoch {p['epoch']}")
        if p.get("loss") is not None:
            parts.append(f"loss {_loss_cell(p)}")
        if p.get("steps_per_second") is not None:
            parts.append(f"{p['steps_per_second']:.3g} steps/s")
        parts.append(f"ETA {_eta_cell(p)}" if p.get("eta_seconds") is not None
                     else "no ETA (needs step, total_steps and steps_per_second from a "
                          "running attempt)")
        lines.append(f"  progress: {', '.join(parts)} (reported "
                     f"{_fmt_time(p.get('reported_at'))}, attempt {p.get('attempt')})")
    e = j.get("estimate")
    if e:
        total, left = e.get("total_seconds"), e.get("remaining_seconds")
        lines.append(
            f"  runtime estimate: {format_duration(total)}"
            + (f", {format_duration(left)} left" if j.get("state") in ("running",
                                                                      "preempting")
               and left is not None else "")
            + f" (source: {e.get('source') or 'none'})")
    if j.get("environment"):
        lines.append(f"  runs: {describe_environment(j['environment'])}")
    lines.append(f"  GPU-seconds allocated {j.get('allocated_gpu_seconds', 0):.1f}, lost "
                 f"{j.get('lost_gpu_seconds', 0):.1f}")
    events = list(j.get("events", []))
    total, first = j.get("events_total"), j.get("events_from")
    if isinstance(total, int) and isinstance(first, int) and len(events) < total:
        lines.append(f"  events {first}..{first + len(events) - 1} of {total} "
                     f"(--events-from N for another page)")
    telemetry = [e for e in events if e["kind"] == "telemetry"]
    if telemetry:
        last = telemetry[-1]
        lines.append(f"  telemetry: {len(telemetry)} reports, last step {last.get('step')} "
                     f"loss {last.get('loss')}")
    for e in events:
        if e["kind"] == "telemetry":
            continue
        extra = {k: v for k, v in e.items() if k not in ("time", "kind")}
        lines.append(f"  {_fmt_time(e['time'])} {e['kind']} "
                     f"{json.dumps(extra, sort_keys=True) if extra else ''}".rstrip())
    return "\n".join(lines)


__all__ = ["ConfigError", "LauncherConfig", "add_arguments", "command", "load_config",
           "serve_options"]
