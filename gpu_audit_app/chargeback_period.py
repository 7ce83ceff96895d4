"""The period of a bill, from `--month` or `--from`/`--to` (shared by `gpu-audit
chargeback` and its `--group-by slurm` bill)."""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime

from gpu_audit.errors import ConfigError

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
