"""`gpu-audit chargeback bill|simulate|replay`: a period's bill from Prometheus, the
archive or a search sink (`bill`), from a simulator scenario played into an archive
(`simulate`), or an earlier bill reproduced from its manifest (`replay`, handed over to
`chargeback.replay.replay`, which reruns the recorded request and checks the outputs
byte for byte).

Exit 0 with the outputs written, 1 when the source is unreachable or has no data for
the period (no bill is written), 2 for bad arguments, rates or directory files.

The source readers are built here (`readers()`), because two of them read the gpu-audit
configuration (where the archive and the search sinks are), which chargeback may not
import; a run and a replay get the same ones.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chargeback.model import Request, SourceData
from chargeback.run import (
    NoDataError,
    Reader,
    SourceError,
    load_tables,
    run_chargeback,
)
from chargeback.software import valid_key
from gpu_audit.errors import EXIT_FAILURE, EXIT_OK, ConfigError
from gpu_audit_app.chargeback.period import add_location_arguments, add_period_arguments, period


def group_by_choice(text: str) -> str:
    """argparse type of --group-by: owner, slurm, software or software:NAME."""
    if text in ("owner", "slurm") or valid_key(text):
        return text
    raise argparse.ArgumentTypeError(
        f"{text!r}: one of owner, slurm, software, software:NAME (a library's short name "
        "as the exporter records it, e.g. software:cudart, software:torch, software:image)")


def _add_source_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--source", default=None, metavar="SOURCE",
                   choices=("prometheus", "archive", "elasticsearch", "opensearch"),
                   help="Where the usage comes from: prometheus (default), archive, "
                   "elasticsearch or opensearch.")
    p.add_argument("--compare-with", metavar="SOURCE[,SOURCE]", default="",
                   help="Also read these sources for the same period and report how their "
                   "bills differ (e.g. --source prometheus --compare-with archive).")
    p.add_argument("--prometheus-url", metavar="URL",
                   help="Prometheus-compatible query API (Prometheus, VictoriaMetrics, ...).")
    add_location_arguments(p)


def _add_output_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rates", metavar="FILE", help="Rates file (YAML; see "
                   "chargeback/examples/rates.yaml). Without it: a showback (GPU-hours and "
                   "energy, no cost).")
    p.add_argument("--csv-totals", action="store_true",
                   help="End the CSV with a `total` line (the sums of its number columns).")
    p.add_argument("--excel", action="store_true",
                   help="Write the CSVs with a UTF-8 byte-order mark, for spreadsheet tools "
                   "that need one to read UTF-8.")
    p.add_argument("--directory", metavar="FILE", help="Directory file: user/project -> "
                   "department (YAML; see chargeback/examples/directory.yaml).")
    p.add_argument("--idle-policy", default="proportional",
                   choices=("none", "proportional", "even"),
                   help="How idle fleet cost is shared over owners (default proportional).")
    p.add_argument("--out", metavar="DIR", default="chargeback-out", help="Output directory.")


def _add_archive_reading_arguments(p: argparse.ArgumentParser) -> None:
    """How far an archive is trusted and checked (bill and simulate both read one)."""
    p.add_argument("--allow-gaps", action="store_true",
                   help="Bill from a trail with gaps (records missing, a part missing or "
                   "damaged): stamped INCOMPLETE in the terminal, CSV, JSON, report and "
                   "manifest. Without it such a bill exits 1.")
    p.add_argument("--verify-records", action="store_true",
                   help="Archive: read every record of the sealed parts too, and check "
                   "that their seals' sums are the records' (slower).")


def _add_bill_arguments(p: argparse.ArgumentParser) -> None:
    add_period_arguments(p)
    _add_source_arguments(p)
    _add_output_arguments(p)
    p.add_argument("--include-simulated", action="store_true",
                   help="Bill simulated series/records too (left out by default).")
    p.add_argument("--allow-unverified", action="store_true",
                   help="Bill from an archive whose hash chain does not verify (said in the "
                   "report).")
    _add_archive_reading_arguments(p)
    p.add_argument("--witness", metavar="URL",
                   help="Archive: Prometheus that scraped the exporters' chain heads "
                   "(gpu_audit_audit_head): the archive must hold every head it kept, or "
                   "its newest records were cut off (as `audit verify --witness`).")
    p.add_argument("--trust-unkeyed-seals", action="store_true",
                   help="Archive without an HMAC key: bill sealed parts from their seals' "
                   "sums without reading them (fast), though nothing proves those sums; the "
                   "bill is marked unverified and says so.")
    slurm = p.add_argument_group("Slurm clusters (docs/SLURM.md)")
    slurm.add_argument("--group-by", type=group_by_choice, default="owner",
                       metavar="KEY",
                       help="owner: the bill by department, project and user (default); "
                       "slurm: by Slurm account, partition and user, from the audit trail, "
                       "with --compare-with slurm beside sacct's GPU TRES-hours; software: "
                       "GPU-hours of GPU processes by what they ran (libraries and image "
                       "from the exporter's process_start records), software:NAME by one "
                       "library's version (e.g. software:cudart, software:torch).")
    slurm.add_argument("--trail", metavar="DIR", action="append", default=[],
                       help="--group-by slurm/software: an archive or spool to read "
                       "(repeatable: each node's exporter archive and `slurm` stream); "
                       "default --config's archive.")


# What `simulate` bills with: the simulated archive through its own configuration, no
# other source, the owner bill (the run's `request` reads these as a bill's would).
_SIMULATE_DEFAULTS: dict[str, object] = {
    "source": None, "compare_with": "", "prometheus_url": None, "config": None,
    "sink": None, "include_simulated": False, "allow_unverified": False, "witness": None,
    "trust_unkeyed_seals": False, "group_by": "owner", "trail": []}


def _action(sub: Any, name: str, value: str, summary: str, description: str, *,
            value_help: str) -> argparse.ArgumentParser:
    """An action whose one positional argument is `value` (its dest, lower-cased)."""
    p: argparse.ArgumentParser = sub.add_parser(name, help=summary, description=description)
    p.add_argument(value.lower(), metavar=value, help=value_help)
    return p


def add_arguments(p: argparse.ArgumentParser) -> None:
    """`chargeback bill|simulate|replay`, each with its own options."""
    sub = p.add_subparsers(dest="chargeback_command", metavar="ACTION", required=True)
    bill = sub.add_parser(
        "bill", help="Bill a period from Prometheus, the archive or a search sink.",
        description="Bill a month (--month) or a period (--from/--to) from Prometheus, the "
        "audit archive or Elasticsearch/OpenSearch: CSV, JSON, HTML and an audit manifest in "
        "--out. Exit 1 when the source is unreachable or has no data for the period.")
    _add_bill_arguments(bill)
    sim = _action(sub, "simulate", "SCENARIO",
                  "A SIMULATED bill from a simulator scenario (demos and tests).",
                  "Play a simulator scenario over the period in virtual time through the "
                  "real producer into a hash-chained archive, and bill that archive, "
                  "simulated records included and said so everywhere.",
                  value_help="The simulator scenario to play (a shipped name or a file).")
    add_period_arguments(sim)
    _add_output_arguments(sim)
    _add_archive_reading_arguments(sim)
    sim.add_argument("--sim-archive", metavar="DIR", help="Where the simulated archive "
                     "goes (empty or new; default OUT/sim-archive).")
    sim.add_argument("--sim-nodes", metavar="N", type=int, default=1,
                     help="Copies of the scenario's node (default 1): N x its GPUs.")
    sim.add_argument("--sim-step", metavar="SECONDS", type=float, default=60.0,
                     help="Simulated sampling interval (default 60).")
    sim.add_argument("--sim-audit-interval", metavar="SECONDS", type=float, default=None,
                     help="audit.interval_seconds of the simulated exporter: a multiple of "
                     "--sim-step (default 300: interval usage records, "
                     "schema 3, as `gpu-audit run` writes them; equal to the step: the "
                     "per-cycle trail).")
    sim.set_defaults(**_SIMULATE_DEFAULTS)
    _action(sub, "replay", "MANIFEST",
            "Reproduce an earlier bill from its manifest and check it.",
            "Re-read the source an earlier bill named in its manifest, bill it again and "
            "check every output byte for byte. Exit 1 when they differ or the source is gone.",
            value_help="The manifest.json an earlier bill wrote in its --out.")


def request(args: argparse.Namespace) -> Request:
    start, end = period(args)
    return Request(start=start, end=end, source=args.source or "prometheus",
                   config=args.config, sink=args.sink,
                   prometheus_url=args.prometheus_url, rates=args.rates,
                   directory=args.directory, idle_policy=args.idle_policy, out=args.out,
                   include_simulated=args.include_simulated,
                   allow_unverified=args.allow_unverified,
                   allow_gaps=args.allow_gaps, verify_records=args.verify_records,
                   witness=args.witness, trust_unkeyed_seals=args.trust_unkeyed_seals,
                   csv_totals=args.csv_totals, excel=args.excel,
                   compare_with=tuple(s.strip() for s in args.compare_with.split(",")
                                      if s.strip()))


def _bar(enabled: bool, what: str) -> Any:
    """A rich progress bar on stderr when it is a terminal, else None."""
    if not enabled or not sys.stderr.isatty():
        return None
    from rich.progress import Progress

    return Progress(transient=True), what


def _settings(req: Request) -> Any:
    """Where the archive or the search sink is, from --config (gpu_audit_app's
    chargeback_sources reads the shipper's sink configuration)."""
    from gpu_audit_app.chargeback import sources as chargeback_sources

    path = Path(req.config) if req.config else None
    if req.source == "archive":
        return chargeback_sources.archive_source(path, req.sink)
    return chargeback_sources.search_settings(path, req.source, req.sink)


def _archive(req: Request, progress: bool) -> SourceData:
    directory, key = _settings(req)
    from chargeback.sources.archive import (
        ArchiveRefused,
        read_archive,
    )

    bar = _bar(progress, f"reading {directory}")
    try:
        if bar is None:
            data: SourceData = read_archive(req, directory, key)
            return data
        prog, what = bar
        with prog:
            task = prog.add_task(what, total=None)
            data = read_archive(req, directory, key, progress=lambda done, total: prog.update(
                task, completed=done, total=total))
            return data
    except ArchiveRefused as exc:
        raise SourceError(str(exc)) from None


def _search(req: Request, progress: bool) -> SourceData:
    settings = _settings(req)
    from chargeback.sources.search import read_search
    from chargeback.sources.search_query import SearchUnavailable

    try:
        data: SourceData = read_search(req, settings)
        return data
    except SearchUnavailable as exc:
        raise SourceError(str(exc)) from None


def _prometheus(req: Request, progress: bool) -> SourceData:
    from chargeback.sources.prometheus import PrometheusError, read_prometheus

    try:
        return read_prometheus(req, progress)
    except PrometheusError as exc:
        raise SourceError(str(exc)) from None


def readers() -> Mapping[str, Reader]:
    """Source name -> reader, for `run_chargeback` and `replay` (looked up when called,
    so each reader is the module's current one)."""
    return {"prometheus": _prometheus, "archive": _archive,
            "elasticsearch": _search, "opensearch": _search}


def _simulate(args: argparse.Namespace) -> argparse.Namespace:
    """Write the simulated archive of `chargeback simulate`; the arguments that bill it."""
    from gpu_audit_app.chargeback.sim import CONFIG_NAME, simulate_archive

    start, end = period(args)
    out = Path(args.out)
    archive = Path(args.sim_archive) if args.sim_archive else out / "sim-archive"
    print(f"SIMULATED: playing scenario {args.scenario!r} over {start.isoformat()} .. "
          f"{end.isoformat()} every {args.sim_step:g} s (virtual time) into {archive}",
          flush=True)
    sim = simulate_archive(args.scenario, start, end, archive.resolve(),
                           (out / CONFIG_NAME).resolve(), step=args.sim_step,
                           nodes=args.sim_nodes, audit_interval=args.sim_audit_interval)
    print(f"SIMULATED: {sim.cycles} cycles of {sim.gpus} simulated GPU(s), {sim.records} "
          f"hash-chained records (all simulated: true); billing them with "
          f"--include-simulated from {out / CONFIG_NAME}")
    return argparse.Namespace(**{**vars(args), "source": "archive",
                                 "config": str(sim.config), "include_simulated": True})


def chargeback_command(args: argparse.Namespace) -> int:
    if args.chargeback_command == "replay":
        from chargeback.replay import replay

        try:
            return replay(Path(args.manifest), readers=readers())
        except (SourceError, NoDataError) as exc:
            print(f"gpu-audit chargeback replay: {exc}", file=sys.stderr)
            return EXIT_FAILURE
    if args.chargeback_command == "simulate":
        from gpu_audit_app.chargeback.sim import SimulationError

        # every problem of the rates and directory files before a month is simulated
        load_tables(args.rates, args.directory)
        try:
            args = _simulate(args)
        except SimulationError as exc:
            print(f"gpu-audit chargeback simulate: {exc}", file=sys.stderr)
            return EXIT_FAILURE
    elif args.group_by == "slurm":
        from gpu_audit_app.slurm.bill import slurm_bill_command

        return slurm_bill_command(args)
    elif args.group_by != "owner":
        from gpu_audit_app.chargeback.software_bill import software_bill_command

        return software_bill_command(args)
    wrong = [f"{flag} goes with --group-by slurm" for flag, used in (
        ("--trail", bool(args.trail)),
        ("--compare-with slurm",
         "slurm" in (s.strip() for s in args.compare_with.split(",")))) if used]
    if wrong:
        raise ConfigError("arguments", wrong)
    req = request(args)
    try:
        result = run_chargeback(req, readers=readers(), progress=sys.stderr.isatty())
    except (SourceError, NoDataError) as exc:
        print(f"gpu-audit chargeback: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    r = result.bill.reconciliation
    print(f"chargeback {req.start.isoformat()} .. {req.end.isoformat()} from {req.source}: "
          f"{sum(1 for row in result.bill.rows if row.kind == 'owner')} owner rows")
    print(f"fleet {r.fleet_gpu_hours:.2f} GPU-h (down {r.down_gpu_hours:.2f}) = owners "
          f"{r.owners_gpu_hours:.2f} + unattributed {r.unattributed_gpu_hours:.2f} + idle "
          f"{r.idle_gpu_hours:.2f} (difference {r.difference_gpu_hours:+.3f})")
    print(f"energy {r.fleet_energy_kwh:.2f} kWh (integrated power {r.power_energy_kwh:.2f}, "
          f"difference {r.energy_difference_kwh:+.3f})")
    for name, c in sorted(r.comparisons.items()):
        print(f"compared with {name}: fleet {c.fleet_gpu_hours:.2f} GPU-h "
              f"({c.fleet_gpu_hours - r.fleet_gpu_hours:+.3f}), energy "
              f"{c.fleet_energy_kwh:.2f} kWh ({c.fleet_energy_kwh - r.fleet_energy_kwh:+.3f})")
    for note in result.bill.notes:
        if note.startswith("ENERGY:"):
            print(f"WARNING {note}")
    if not result.bill.priced:
        print("SHOWBACK: no --rates, so the bill has GPU-hours and energy and no cost "
              "(the cost columns are empty)")
    comp = result.bill.completeness
    if comp is not None:
        print(f"completeness: {comp.status}; {comp.inventory_gpus} GPU(s) on "
              f"{comp.inventory_hosts} host(s): expected {comp.expected_gpu_hours:.2f} GPU-h, "
              f"observed {comp.observed_gpu_hours:.2f} (up + down)")
        for line in comp.chains:
            print(f"  {line}")
        for line in comp.silent:
            print(f"  silent: {line}")
        for line in comp.gaps:
            print(f"  GAP: {line}")
        if comp.gaps:
            print("INCOMPLETE: this bill was made with --allow-gaps; every output says so")
    if result.bill.simulated_included:
        print("SIMULATED: this bill includes simulated records (--include-simulated); "
              "the report, notes and manifest say so")
    if result.bill.simulated_excluded:
        print(f"simulated left out: {result.bill.simulated_excluded}")
    for name in sorted(result.outputs):
        print(f"wrote {Path(req.out) / name}  sha256 {result.outputs[name]}")
    return EXIT_OK
