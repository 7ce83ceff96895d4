"""The period of a bill, from `--month` or `--from`/`--to`, and where its records are
(`--config`, `--sink`): the options `gpu-audit chargeback` (its `--group-by` bills too)
and `gpu-audit capacity` share, defined once. Light: the parser imports it."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime

from gpu_audit.errors import ConfigError


def add_period_arguments(p: argparse.ArgumentParser) -> None:
    """--month, or --from and --to."""
    when = p.add_argument_group("period (one of)")
    when.add_argument("--month", metavar="YYYY-MM", help="A calendar month, UTC.")
    when.add_argument("--from", dest="time_from", metavar="RFC3339", help="Start (inclusive).")
    when.add_argument("--to", dest="time_to", metavar="RFC3339", help="End (exclusive).")


def add_location_arguments(p: argparse.ArgumentParser) -> None:
    """--config and --sink: the configuration and the sink to read records from."""
    p.add_argument("--config", metavar="FILE", help="gpu-audit configuration: where the "
                   "archive and the sinks are.")
    p.add_argument("--sink", metavar="NAME",
                   help="The configured archive or search sink to read (its name, or its "
                   "type when unnamed), when the configuration has more than one.")


_MONTH = re.compile(r"^(\d{4})-(\d{2})$")


def _time(text: str, what: str, problems: list[str]) -> datetime | None:
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        problems.append(f"{what}: {text!r} is not an RFC 3339 time")
        return None
    if dt.tzinfo is None:
        problems.append(f"{what}: {text!r} needs a time zone (e.g. Z)")
        return None
    return dt.astimezone(UTC)


def period(args: argparse.Namespace) -> tuple[datetime, datetime]:
    """The [start, end) of --month or --from/--to; ConfigError naming every problem."""
    problems: list[str] = []
    if args.month and (args.time_from or args.time_to):
        raise ConfigError("arguments", ["--month or --from/--to, not both"])
    if args.month:
        m = _MONTH.match(args.month)
        if m is None or not 1 <= int(m.group(2)) <= 12:
            raise ConfigError("arguments", [f"--month {args.month!r}: expected YYYY-MM"])
        year, month = int(m.group(1)), int(m.group(2))
        start = datetime(year, month, 1, tzinfo=UTC)
        end = datetime(year + (month == 12), month % 12 + 1, 1, tzinfo=UTC)
        return start, end
    if not args.time_from or not args.time_to:
        raise ConfigError("arguments", ["a period is needed: --month YYYY-MM, or both "
                                        "--from and --to"])
    begin = _time(args.time_from, "--from", problems)
    until = _time(args.time_to, "--to", problems)
    if problems or begin is None or until is None:
        raise ConfigError("arguments", problems)
    return begin, until
