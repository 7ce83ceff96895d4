"""The `gpu-audit` command: one entry point, a subcommand per component.

Exit codes: 0 success; 1 runtime failure (backend unavailable, verify found problems);
2 bad configuration, scenario or arguments, or nothing to inspect (nothing was started);
141 (128 + SIGPIPE) when the reader of the output went away (`... | head`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpu_audit import __version__
from gpu_audit.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, ConfigError, GpuAuditError

log = logging.getLogger("gpu_audit")

EXIT_SIGPIPE = 128 + signal.SIGPIPE  # what a shell reports for a process ended by SIGPIPE


def _add_config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", type=Path, metavar="FILE",
                   help="YAML configuration file (every key has a default: docs/CONFIGURATION.md).")


def _add_exporter_args(p: argparse.ArgumentParser) -> None:
    _add_config_args(p)
    p.add_argument("--listen", metavar="HOST:PORT", help="HTTP endpoint (exporter.listen).")
    p.add_argument("--backend", choices=("nvml", "dcgm", "sim"),
                   help="Sample source (exporter.backend). 'sim' needs --scenario.")
    p.add_argument("--scenario", metavar="NAME|FILE",
                   help="Simulator scenario: busy, idle, leak, hot, xid, mig, large or a file.")
    p.add_argument("--time-scale", type=float, metavar="X",
                   help="Simulator: scenario seconds per wall second (exporter.time_scale).")
    p.add_argument("--interval", type=float, metavar="SECONDS",
                   help="Fast sampling interval (exporter.interval_seconds).")
    p.add_argument("--spool-dir", type=Path, metavar="DIR",
                   help="Spool directory (spool.directory).")
    _add_log_level_arg(p)


def _add_log_level_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", choices=("debug", "info", "warning", "error"),
                   metavar="LEVEL", help="Least severe level written to stderr: debug, info, "
                   "warning or error (log_level; default info).")


# Commands whose arguments need no component module: their parser leaves out the options
# of the others, whose definitions live in the launcher, chargeback, alerts and dashboards
# code, so that the long-running exporter never imports (and keeps resident) code it does
# not run (about 3.6 MB of RSS).
_LIGHT_COMMANDS = frozenset({"run", "exporter", "shipper", "check-config", "audit", "spool"})


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand argv names (its first word that is not an option), if any."""
    return next((a for a in argv if not a.startswith("-")), None)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The whole command line; with a command that needs no component module (run,
    exporter, ...), the other commands are listed without their options."""
    full = command not in _LIGHT_COMMANDS
    parser = argparse.ArgumentParser(
        prog="gpu-audit",
        description="Know who used which GPU, when, how well and at what cost: an NVML/DCGM "
        "Prometheus exporter with per-process attribution, a tamper-evident audit trail and "
        "a shipper that loses nothing.",
    )
    parser.add_argument("--version", action="version", version=f"gpu-audit {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("run", help="Exporter + shipper in one process (the main job).",
                       description="Sample every GPU, serve /metrics, write audit records to the "
                       "spool and ship them to the configured sinks (a local archive by default).")
    _add_exporter_args(p)

    p = sub.add_parser("exporter", help="Sample GPUs, serve /metrics, write audit records.",
                       description="The exporter alone: sampling loop, Prometheus endpoint and "
                       "audit records written to the spool (shipped by `gpu-audit shipper`).")
    _add_exporter_args(p)

    p = sub.add_parser("shipper", help="Ship spooled audit records to the configured sinks.",
                       description="Deliver the spool written by an exporter in another process.")
    _add_config_args(p)
    p.add_argument("--spool-dir", type=Path, metavar="DIR",
                   help="Spool directory the exporter writes (spool.directory).")
    _add_log_level_arg(p)

    p = sub.add_parser("check-config", help="Validate the configuration and say what is wrong.",
                       description="Validate the configuration (exporter, attribution, audit, "
                       "spool, shipper sinks, web-config and scenario files) and list every "
                       "problem at once. Exit 0 when valid, 2 otherwise.")
    _add_exporter_args(p)

    p = sub.add_parser("audit", help="Audit trail tools.")
    asub = p.add_subparsers(dest="audit_command", metavar="ACTION", required=True)
    v = asub.add_parser("verify", help="Check records for gaps, duplicates, reordering, edits.",
                        description="Verify the hash chain and sequence of audit records in a "
                        "spool directory, a JSON Lines file (.jsonl/.jsonl.gz) or an archive "
                        "directory, or read back from a configured sink with --sink.")
    v.add_argument("path", nargs="?", type=Path, metavar="PATH",
                   help="Spool directory, archive directory or JSON Lines file.")
    v.add_argument("--hmac-key-file", type=Path, metavar="FILE",
                   help="Secret the chain was keyed with.")
    v.add_argument("--sink", metavar="NAME", help="Read back from this configured sink.")
    v.add_argument("--from", dest="time_from", metavar="RFC3339", help="Start of range (--sink).")
    v.add_argument("--to", dest="time_to", metavar="RFC3339", help="End of range (--sink).")
    v.add_argument("--fast", action="store_true",
                   help="Archive: check the seals (their chain, MAC, each part's SHA-256 and "
                   "place in the hash chain) and read record by record only the parts "
                   "whose seal the key does not prove (every part of an unkeyed trail).")
    v.add_argument("--rollups", action="store_true",
                   help="Archive: recompute every seal's rollup from the part's records, "
                   "those the key proves too (the others' always are, without --fast).")
    v.add_argument("--witness", metavar="URL",
                   help="Archive: Prometheus (its query API) that scraped the exporters' "
                   "gpu_audit_audit_head: the archive must hold every head it kept.")
    v.add_argument("--witness-at", metavar="RFC3339",
                   help="--witness: the heads as Prometheus held them at this time "
                   "(default now; earlier than the shipper's lag for a live archive).")
    v.add_argument("--json", action="store_true",
                   help="The report as one JSON document (same exit code).")
    v.add_argument("--workers", type=int, default=None, metavar="N",
                   help="Archive: verify hosts' streams in N processes (default: one per "
                   "CPU).")
    _add_config_args(v)

    p = sub.add_parser("spool", help="Spool tools (fsck and statistics).")
    ssub = p.add_subparsers(dest="spool_command", metavar="ACTION", required=True)
    sv = ssub.add_parser("verify", help="Check every segment, frame and cursor (an fsck).")
    sv.add_argument("directory", type=Path, metavar="DIR", help="The spool directory.")
    sv.add_argument("--json", action="store_true",
                    help="The report as one JSON document (same exit code).")
    ss = ssub.add_parser("stats", help="Segments, bytes, offsets and per-sink lag.")
    ss.add_argument("directory", type=Path, metavar="DIR", help="The spool directory.")
    ss.add_argument("--json", action="store_true", help="Machine-readable output.")

    p = sub.add_parser("rules", help="Prometheus recording and alerting rules.")
    rsub = p.add_subparsers(dest="rules_command", metavar="ACTION", required=True)
    rr = rsub.add_parser("render", help="Write the rule files of a params file.",
                         description="Render recording.yaml and alerts.yaml from a params "
                         "file (alerts/params/production.yaml, fast.yaml or a site's copy).")
    if full:
        from alerts.cli import add_render_args

        add_render_args(rr)

    p = sub.add_parser("chargeback", help="A period's bill: GPU-hours, energy and cost per "
                       "user, project and department.",
                       description="bill: a month (--month) or a period (--from/--to) from "
                       "Prometheus, the audit archive or Elasticsearch/OpenSearch; simulate: "
                       "the same from a simulator scenario, said SIMULATED everywhere; replay: "
                       "an earlier bill reproduced from its manifest and checked. The flag "
                       "form (`chargeback --month ...`, `--simulate`, `--replay`) still works "
                       "for this release, with a deprecation line.")
    if full:
        from gpu_audit_app.chargeback.main import add_arguments

        add_arguments(p)

    p = sub.add_parser("capacity", help="Do we need more GPUs? Allocated, busy, held-idle "
                       "and free GPU-hours, demand that waited, trend and what-if.",
                       description="The capacity report of a month (--month) or a period "
                       "(--from/--to) from the archive, Prometheus or a search sink, with "
                       "queue waits from the launcher's store and sacct: CSV, JSON, HTML with "
                       "charts and a one-screen summary in --out (docs/CAPACITY.md).")
    if full:
        from gpu_audit_app.capacity.args import add_arguments as add_capacity_arguments

        add_capacity_arguments(p)

    p = sub.add_parser("dashboards", help="Grafana and Kibana dashboards.")
    dsub = p.add_subparsers(dest="dashboards_command", metavar="ACTION", required=True)
    dp = dsub.add_parser("push", help="Upload the dashboards to Grafana and/or Kibana.",
                         description="Upload the Grafana dashboards into a folder (overwrite by "
                         "uid) and/or import the Kibana saved objects (overwrite by id). "
                         "Credentials from GRAFANA_TOKEN or GRAFANA_USER/GRAFANA_PASSWORD, "
                         "KIBANA_API_KEY or KIBANA_USER/KIBANA_PASSWORD, or the --*-file "
                         "options; never on the command line.")
    if full:
        from dashboards.cli_args import add_push_arguments

        add_push_arguments(dp)

    p = sub.add_parser("launcher", help="Node-local GPU job launcher (daemon and clients).",
                       description="A fair GPU job queue with checkpoint-first preemption, "
                       "requeue and identity injection: `serve` runs the daemon; submit, queue, "
                       "status, logs, cancel, hold and release talk to it over its socket.")
    if full:
        from gpu_audit_app.launcher.main import add_arguments as add_launcher_arguments

        add_launcher_arguments(p)

    p = sub.add_parser("slurm", help="gpu-audit on a Slurm cluster: epilog, job reports, "
                       "health check, idle-GPU policy (docs/SLURM.md).")
    if full:
        from gpu_audit_app.slurm.main import add_arguments as add_slurm_arguments

        add_slurm_arguments(p)
    return parser


# command-line option (argparse dest) -> the setting it overrides
_OPTIONS = {
    "listen": ("exporter", "listen"),
    "backend": ("exporter", "backend"),
    "scenario": ("exporter", "scenario"),
    "time_scale": ("exporter", "time_scale"),
    "interval": ("exporter", "interval_seconds"),
    "spool_dir": ("spool", "directory"),
    "log_level": ("log_level",),
}


def _labels() -> dict[tuple[str, ...], str]:
    """Each override's option, to blame a bad value on it."""
    return {path: "--" + attr.replace("_", "-") for attr, path in _OPTIONS.items()}


def _overrides(args: argparse.Namespace) -> dict[tuple[str, ...], Any]:
    out: dict[tuple[str, ...], Any] = {}
    for attr, path in _OPTIONS.items():
        value = getattr(args, attr, None)
        if value is not None:
            out[path] = str(value) if isinstance(value, Path) else value
    return out


def _setup_logging(level: str) -> None:
    from gpu_audit.logredact import setup_logging

    setup_logging(level)


def main(argv: Sequence[str] | None = None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    command = _command_of(words)
    if command == "chargeback":  # its flag form, kept for one release
        from gpu_audit_app.chargeback.legacy import modern_argv

        words, note = modern_argv(words)
        if note is not None:
            print(note, file=sys.stderr)
    parser = build_parser(command)
    args = parser.parse_args(words)
    if args.command is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        code = _dispatch(parser, args)
        sys.stdout.flush()  # a closed pipe shows here, not in the interpreter's exit
        return code
    except BrokenPipeError:
        return _closed_pipe()
    except ConfigError as exc:
        print(f"gpu-audit: configuration error in {exc.render()}", file=sys.stderr)
        return EXIT_USAGE
    except GpuAuditError as exc:  # one of ours that no command handled: its line, no trace
        print(f"gpu-audit {args.command}: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_OK


def _closed_pipe() -> int:
    """`gpu-audit ... | head` after head left: end quietly, as a tool killed by SIGPIPE.

    Python ignores SIGPIPE, so the write raises instead; stdout is pointed at /dev/null
    so the interpreter's final flush does not raise again ("Exception ignored ...").
    """
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return EXIT_SIGPIPE


def _refuse_wrong_spool_path(cmd: str, config: Any) -> None:
    """A spool path that cannot work (it is a file, it is inside /proc) is exit 2 before
    anything starts. The exporter alone keeps serving through a spool it cannot write
    yet (a file in place of a parent, permissions: it counts and retries), so only
    `run` and `shipper`, which need the spool at start, refuse a parent that is a file.
    Permissions are left to the running process; check-config reports them all."""
    uses_spool = cmd == "shipper" or config.audit.enabled or (
        cmd == "run" and config.shipper.enabled)
    if uses_spool:
        from gpu_audit.paths import directory_problems

        problems = directory_problems("spool.directory", config.spool.directory,
                                      writable=False, parents=cmd != "exporter")
        if problems:
            raise ConfigError("configuration", problems)


def _dispatch(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from gpu_audit_app.config import load_settings

    cmd = args.command
    if cmd == "check-config":
        from gpu_audit_app.check_config import check_config

        check_config(args.config, _overrides(args), labels=_labels())
        print(f"configuration OK ({args.config or 'defaults'})")
        return EXIT_OK
    if cmd in ("run", "exporter", "shipper"):
        config = load_settings(getattr(args, "config", None), _overrides(args),
                               labels=_labels())
        _setup_logging(config.log_level)
        if config.audit_interval_note and config.audit.enabled and cmd != "shipper":
            log.info("%s", config.audit_interval_note)
        _refuse_wrong_spool_path(cmd, config)
        if cmd == "shipper":
            from gpu_audit_app.config import config_seal_key
            from shipper.standalone import run_shipper

            return run_shipper(config, seal_key=config_seal_key(config))
        from gpu_audit_app.run import run

        return run(config, with_shipper=(cmd == "run"))
    if cmd == "audit":  # its one action, verify (argparse requires it)
        _setup_logging("warning")
        from gpu_audit_app.audit.verify import verify_command

        return verify_command(args)
    if cmd == "capacity":
        _setup_logging("warning")
        from gpu_audit_app.capacity.main import capacity_command

        return capacity_command(args)
    if cmd == "chargeback":
        _setup_logging("warning")
        from gpu_audit_app.chargeback.main import chargeback_command

        return chargeback_command(args)
    if cmd == "spool":
        _setup_logging("warning")
        from gpu_audit.spool import render_stats, spool_dir_problem, spool_stats, verify_spool

        problem = spool_dir_problem(args.directory)
        if problem is not None:
            print(f"gpu-audit spool {args.spool_command}: {problem}", file=sys.stderr)
            return EXIT_USAGE
        if args.spool_command == "verify":
            report = verify_spool(args.directory)
            if args.json:
                print(json.dumps(report.to_json(), indent=2, sort_keys=True))
            else:
                print(report.render())
            return EXIT_OK if report.ok else EXIT_FAILURE
        stats = spool_stats(args.directory)
        if args.json:
            print(json.dumps(stats, indent=2, sort_keys=True, default=str))
        else:
            print(render_stats(stats))
        return EXIT_OK
    if cmd == "launcher":
        from gpu_audit_app.launcher.main import command as launcher_command

        return launcher_command(args, parser)
    if cmd == "slurm":
        _setup_logging("warning")
        from gpu_audit_app.slurm.main import command as slurm_command

        return slurm_command(args, parser)
    if cmd == "rules":  # its one action, render
        from alerts.cli import render_command

        return render_command(args)
    if cmd == "dashboards":  # its one action, push
        from dashboards.cli_args import push_command

        return push_command(args)
    parser.print_help()
    return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
