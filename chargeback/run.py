"""One chargeback run: inputs, source, bill, outputs.

`run_chargeback(req, readers=...)` loads the rates and directory files, reads the period
with the reader of the source the request names, refuses a period with no data (an
empty bill would look valid), builds the bill (and, for each `--compare-with` source,
that source's bill of the same period, compared with it: `Reconciliation.comparisons`)
and hands it to `chargeback.outputs.write_outputs`, which writes the CSV, JSON, HTML and
the manifest into `req.out` and returns each file's sha256.

The readers are the caller's: the app layer (gpu_audit_app.chargeback.main) builds one
per source from the gpu-audit configuration (the archive directory and HMAC key, the
search sinks), which chargeback may not import. This module keeps no registry of its
own, and never imports replay (chargeback.replay sits above it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from chargeback.compute import IDLE_POLICIES, build_bill, compare_bills
from chargeback.directory import Directory, load_directory
from chargeback.model import Bill, Request, SourceData
from chargeback.outputs import write_outputs
from chargeback.rates import Rates, load_rates
from gpu_audit.errors import ConfigError, GpuAuditError

SOURCES = ("prometheus", "archive", "elasticsearch", "opensearch")


class NoDataError(GpuAuditError, RuntimeError):
    """The source had nothing for the period: no bill is written."""


@dataclass(frozen=True, slots=True)
class Result:
    bill: Bill
    data: SourceData
    outputs: dict[str, str]  # file name -> sha256


def check_request(req: Request) -> None:
    """ConfigError naming every problem with the request itself."""
    problems = []
    if req.end <= req.start:
        problems.append(f"the period is empty: {req.start.isoformat()} is not before "
                        f"{req.end.isoformat()}")
    if req.source not in SOURCES:
        problems.append(f"--source {req.source!r}: one of {', '.join(SOURCES)}")
    if req.idle_policy not in IDLE_POLICIES:
        problems.append(f"--idle-policy {req.idle_policy!r}: one of {', '.join(IDLE_POLICIES)}")
    if "prometheus" in (req.source, *req.compare_with) and not req.prometheus_url:
        problems.append("--prometheus-url URL is needed with --source prometheus "
                        "(or --compare-with prometheus)")
    for other in req.compare_with:
        if other not in SOURCES:
            problems.append(f"--compare-with {other!r}: one of {', '.join(SOURCES)}")
        elif other == req.source:
            problems.append(f"--compare-with {other}: that is the bill's own source")
    if len(set(req.compare_with)) != len(req.compare_with):
        problems.append("--compare-with names a source twice")
    if problems:
        raise ConfigError("arguments", problems)


Reader = Callable[[Request, bool], SourceData]
"""One source's reader: the period of `req` from that source (`progress`: show a bar),
raising SourceError when the source cannot be read."""


class SourceError(GpuAuditError, RuntimeError):
    """A source could not be read (unreachable, refused, broken trail): exit 1."""


def read_source(req: Request, readers: Mapping[str, Reader], progress: bool = False
                ) -> SourceData:
    reader = readers.get(req.source)
    if reader is None:
        raise SourceError(f"no reader for --source {req.source} in this program "
                          "(gpu-audit chargeback passes them)")
    return reader(req, progress)


def has_data(data: SourceData) -> bool:
    return any(f.gpu_seconds > 0 or f.down_gpu_seconds > 0 for f in data.fleet.values()) or any(
        u.used_gpu_seconds > 0 for u in data.usage.values())


def load_tables(rates_path: str | None, directory_path: str | None
                ) -> tuple[Rates | None, Directory]:
    """The rates and directory files, validated together: one ConfigError naming every
    problem of both. No rates file: None (a showback)."""
    errors: list[ConfigError] = []
    rates: Rates | None = None
    directory: Directory | None = None
    try:
        rates = None if rates_path is None else load_rates(rates_path)
    except ConfigError as exc:
        errors.append(exc)
    try:
        directory = load_directory(directory_path)
    except ConfigError as exc:
        errors.append(exc)
    if len(errors) == 1:
        raise errors[0]
    if errors:
        raise ConfigError("the rates and directory files",
                          [p for e in errors for p in e.located()])
    assert directory is not None
    return rates, directory


def run_chargeback(req: Request, *, readers: Mapping[str, Reader],
                   progress: bool = False) -> Result:
    """The bill of `req` read with `readers` (source name -> reader), written to
    `req.out`."""
    check_request(req)
    rates, directory = load_tables(req.rates, req.directory)
    data = read_source(req, readers, progress)
    if not has_data(data):
        where = data.inputs.get("prometheus_url") or req.config or req.source
        raise NoDataError(f"no data for {req.start.isoformat()} .. {req.end.isoformat()} "
                          f"from {req.source} ({where}): no bill written")
    bill = build_bill(data, rates, directory, req.idle_policy)
    for other in req.compare_with:
        # the same period, rates, directory and policy from another source
        odata = read_source(replace(req, source=other, compare_with=()), readers, progress)
        if not has_data(odata):
            raise NoDataError(f"no data for {req.start.isoformat()} .. "
                              f"{req.end.isoformat()} from {other} (--compare-with): "
                              "no bill written")
        data.compared[other] = odata
        obill = build_bill(odata, rates, directory, req.idle_policy)
        bill.reconciliation.comparisons[other] = compare_bills(bill, obill)
        bill.reconciliation.other_sources[other] = obill.reconciliation.fleet_gpu_hours
    out = Path(req.out)
    out.mkdir(parents=True, exist_ok=True)
    outputs: dict[str, str] = write_outputs(bill, req, data, out)
    return Result(bill, data, outputs)
