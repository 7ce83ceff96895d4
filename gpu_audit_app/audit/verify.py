"""`gpu-audit audit verify`: check an audit trail wherever it lives (the command; the
checking itself is gpu_audit.audit.verify).

PATH may be a spool directory, an archive directory (its parts in archive order, read by
gpu_audit.archive; other .jsonl / .jsonl.gz files after them, in name order; `--fast`
checks seals and part digests and reads only unsealed parts, `--rollups` recomputes
every seal's sums) or one JSON Lines file. With --sink NAME the records are read back from that
configured sink for the --from/--to range. Exit 0 when the trail is intact, 1 when a
problem was found (each one printed with where it is), 2 for bad arguments and when
there is no record to verify (a wrong folder must not read as a healthy, empty trail).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime
from pathlib import Path

from gpu_audit.archive.verify import verify_archive
from gpu_audit.audit.canonical import load_hmac_key
from gpu_audit.audit.verify import (
    VerifyReport,
    verify_jsonl,
    verify_readback,
    verify_spool_dir,
)
from gpu_audit.audit.witness import WitnessUnavailable
from gpu_audit.audit.witness import heads as witness_heads
from gpu_audit.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE, ConfigError
from gpu_audit.spool.fsck import spool_dir_problem


def _parse_time(text: str, what: str) -> int:
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ConfigError("arguments", [f"{what}: {text!r} is not an RFC 3339 time"]) from None
    if dt.tzinfo is None:
        raise ConfigError("arguments", [f"{what}: {text!r} needs a time zone (e.g. Z)"])
    return int(dt.timestamp()) * 1_000_000_000 + dt.microsecond * 1000


EXPECTED_PATH = ("expected a spool directory, an archive directory with .jsonl / .jsonl.gz "
                 "files, or a JSON Lines file of audit records")


def _nothing_to_verify(report: VerifyReport, where: str, expected: str) -> bool:
    """No record and no problem proves nothing: say so (exit 2) instead of OK."""
    if report.records or not report.ok:
        return False
    print(f"gpu-audit audit verify: no audit records in {where}; {expected}", file=sys.stderr)
    return True


def verify_command(args: argparse.Namespace) -> int:
    key = load_hmac_key(args.hmac_key_file) if args.hmac_key_file else None
    if args.sink:
        return _verify_sink(args, key)
    path: Path | None = args.path
    if path is None:
        print("gpu-audit audit verify: give a PATH or --sink NAME", file=sys.stderr)
        return EXIT_USAGE
    if not path.exists():
        print(f"gpu-audit audit verify: {path} does not exist", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "witness", None) and not (path.is_dir()
                                               and spool_dir_problem(path) is not None):
        print("gpu-audit audit verify: --witness checks an archive directory against the "
              f"chain heads Prometheus kept; {path} is not one", file=sys.stderr)
        return EXIT_USAGE
    if path.is_dir() and spool_dir_problem(path) is None:
        report = verify_spool_dir(path, key)
        expected = ("the spool holds none (none written yet, or every segment shipped and "
                    "deleted); expected records to verify: read the sinks' copy with --sink NAME")
    elif path.is_dir():
        workers = args.workers if args.workers is not None else (os.cpu_count() or 1)
        heads = None
        if getattr(args, "witness", None):
            at = (_parse_time(args.witness_at, "--witness-at") / 1e9
                  if getattr(args, "witness_at", None) else None)
            try:
                heads = witness_heads(args.witness, at)
            except WitnessUnavailable as exc:
                print(f"gpu-audit audit verify: {exc}", file=sys.stderr)
                return EXIT_FAILURE
        report = verify_archive(path, key, fast=args.fast, rollups=args.rollups,
                                workers=max(1, workers), witness=heads)
        expected = EXPECTED_PATH
    else:
        report, expected = verify_jsonl(path, key), EXPECTED_PATH
    if _nothing_to_verify(report, str(path), expected):
        return EXIT_USAGE
    return _print(report, args)


def _print(report: VerifyReport, args: argparse.Namespace) -> int:
    if getattr(args, "json", False):
        print(json.dumps(report.to_json(), indent=2))
    else:
        print(report.render())
    return EXIT_OK if report.ok else EXIT_FAILURE


def _verify_sink(args: argparse.Namespace, key: bytes | None) -> int:
    from gpu_audit_app.config import load_settings, pick_sink
    from shipper.sinks.errors import ReadBackUnsupported
    from shipper.sinks.registry import create_sink

    if not (args.time_from and args.time_to):
        print("gpu-audit audit verify --sink needs --from and --to", file=sys.stderr)
        return EXIT_USAGE
    start = _parse_time(args.time_from, "--from")
    end = _parse_time(args.time_to, "--to")
    config = load_settings(args.config)
    try:
        chosen = pick_sink(config, None, "configured", args.sink,
                           str(args.config or "(default configuration)"))
    except ConfigError as exc:
        print(f"gpu-audit audit verify: {'; '.join(exc.problems)}", file=sys.stderr)
        return EXIT_USAGE
    sink = create_sink(chosen, spool_dir=config.spool.directory)
    try:
        report = verify_readback(sink.read_back(start, end), hmac_key=key,
                                 source=f"sink {args.sink}")
    except ReadBackUnsupported as exc:
        print(f"gpu-audit audit verify: sink {args.sink!r} ({sink.kind}) cannot give records "
              f"back: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        sink.close()
    if _nothing_to_verify(report, f"sink {args.sink} from {args.time_from} to {args.time_to}",
                          "expected the records shipped to it in that range"):
        return EXIT_USAGE
    return _print(report, args)
