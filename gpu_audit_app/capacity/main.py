"""`gpu-audit capacity`: do we need more GPUs? The capacity report of a period
(docs/CAPACITY.md).

The app layer wires what the components may not: chargeback's source readers (the same
ones `gpu-audit chargeback` uses, called once per bin of the period), the launcher's
store for queue waits, sacct for Slurm pending times, and the launcher's replay engine
for the what-if. The figures themselves are chargeback.capacity's (pure).

Exit 0 with the outputs written, 1 when the source is unreachable or has no data for the
whole period, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sqlite3
import sys
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from chargeback.capacity.compute import basis, build, figures_from_fleet, figures_of
from chargeback.capacity.model import Bin, Wait, WhatIf
from chargeback.capacity.outputs import summary, write_outputs
from chargeback.capacity.slurm import NOT_KNOWN, parse_nodes, slurm_bins
from chargeback.model import Fleet, Request, SourceData
from chargeback.run import SourceError, has_data
from chargeback.sources.slurm import SacctError, gpus_of, read_nodes, read_sacct
from gpu_audit import slurmcmd
from gpu_audit.errors import EXIT_FAILURE, EXIT_OK, ConfigError
from gpu_audit_app.capacity.args import BINS
from gpu_audit_app.capacity.replay import run_whatif, snapshot
from gpu_audit_app.chargeback.main import readers
from gpu_audit_app.chargeback.period import period
from launcher.store import WAITING

SLURM_BASIS = ("allocated: GPU time Slurm allocated to jobs (sacct AllocTRES gres/gpu); "
               "installed: the GPUs of the nodes Slurm lists now")
# what an archive reader says for a bin it has nothing for (a bin, not a failure)
_EMPTY = ("no usage for", "no archive part for")


def _request(args: argparse.Namespace, start: datetime, end: datetime) -> Request:
    return Request(start=start, end=end, source=args.source, config=args.config, sink=args.sink,
                   prometheus_url=args.prometheus_url, rates=None, directory=None,
                   idle_policy="none", out=args.out,
                   include_simulated=args.include_simulated,
                   allow_unverified=args.allow_unverified, allow_gaps=args.allow_gaps,
                   hash_sealed_parts=args.hash_parts)


def _keep_notes(data: SourceData, notes: list[str], seen: set[str]) -> None:
    for n in data.notes:
        key = n.split(":", 1)[0] + n[-40:]
        if n.startswith(("INCOMPLETE", "SIMULATED", "archive: each sealed part's size")) \
                and key not in seen:
            seen.add(key)
            notes.append(n)


def day_bins(req: Request, data: SourceData, bin_seconds: float = BINS["day"]) -> list[Bin]:
    """Bins from one read of the whole period (the archive's per-bin, per-model sums,
    keyed by day, or by YYYY-MM-DDTHH:MM for shorter bins): a bin without sums is None."""
    step = int(bin_seconds)
    fmt = "%Y-%m-%d" if step == int(BINS["day"]) else "%Y-%m-%dT%H:%M"
    spans: list[tuple[datetime, datetime, str]] = []
    t = req.start
    while t < req.end:
        # bins lie on whole multiples of their length since the epoch, as the rollup's
        lo = int(t.timestamp()) // step * step
        u = min(datetime.fromtimestamp(lo + step, tz=UTC), req.end)
        spans.append((t, u, datetime.fromtimestamp(lo, tz=UTC).strftime(fmt)))
        t = u
    # The rollup keys a record by the bin its interval ends in; the reader keeps only
    # the period's share of a record straddling an edge, and the one across the period's
    # end is keyed by the bin after it: that share is the last bin's (and one keyed
    # before the first bin, the first's), not dropped.
    sums: dict[str, dict[str, Fleet]] = {}
    first, last = spans[0][2], spans[-1][2]
    for key, fleets in data.model_days.items():
        into = sums.setdefault(min(max(key, first), last), {})
        for model, f in fleets.items():
            into.setdefault(model, Fleet()).add(f)
    bins: list[Bin] = []
    for t, u, key in spans:
        got = sums.get(key)
        bins.append(Bin(t, (u - t).total_seconds(), None if not got else {
            model: figures_from_fleet(f, f.held_gpu_seconds) for model, f in got.items()}))
    return bins


def read_bins(req: Request, bin_seconds: float, notes: list[str]) -> tuple[list[Bin], str]:
    """The period cut into bins, each read through chargeback's reader for the source;
    day bins from one read where the source sums per day and model (the archive: each
    sealed part from its seal, once). A bin the source has nothing for is None (not
    known), never zeros."""
    reader = readers()[req.source]
    seen: set[str] = set()
    if req.source == "archive":
        try:
            whole = reader(replace(req, bin_seconds=bin_seconds), False)
        except SourceError as exc:
            if not any(e in str(exc) for e in _EMPTY):
                raise
            return [Bin(req.start, (req.end - req.start).total_seconds(), None)], ""
        if whole.model_days and not whole.allocation_known:
            _keep_notes(whole, notes, seen)
            return day_bins(req, whole, bin_seconds), basis(whole)
    bins: list[Bin] = []
    t = req.start
    step = timedelta(seconds=bin_seconds)
    text = ""
    while t < req.end:
        u = min(t + step, req.end)
        try:
            data: SourceData | None = reader(replace(req, start=t, end=u), False)
        except SourceError as exc:
            if not any(e in str(exc) for e in _EMPTY):
                raise
            data = None
        if data is not None and has_data(data):
            bins.append(Bin(t, (u - t).total_seconds(), figures_of(data)))
            text = text or basis(data)
            _keep_notes(data, notes, seen)
        else:
            bins.append(Bin(t, (u - t).total_seconds(), None))
        t = u
    return bins, text


def launcher_waits(paths: list[str]) -> list[Wait]:
    """Every wait in the launcher stores: each start (its `waited_seconds`, since the job
    was queued or requeued) and each job still waiting (since it was queued)."""
    out: list[Wait] = []
    for path in paths:
        if not Path(path).is_file():
            raise ConfigError("arguments", [f"--launcher-state {path}: no such file"])
        with ExitStack() as stack:
            try:
                store = stack.enter_context(snapshot(path))
            except sqlite3.DatabaseError as exc:
                raise ConfigError("arguments", [f"--launcher-state {path}: not a launcher "
                                                f"store ({exc})"]) from None
            jobs = {j.id: j for j in store.jobs()}
            for kind in ("started", "resumed", "restarted"):
                for ev in store.events(kind=kind):
                    rec = jobs.get(ev.job_id) if ev.job_id is not None else None
                    waited = ev.data.get("waited_seconds")
                    if rec is None or not isinstance(waited, (int, float)):
                        continue
                    out.append(Wait("launcher", f"{path}:{rec.id}", rec.spec.gpu_share,
                                    ev.time - float(waited), ev.time))
            for rec in store.jobs(WAITING):
                out.append(Wait("launcher", f"{path}:{rec.id}", rec.spec.gpu_share,
                                rec.queued_at, None))
    return out


def slurm_waits(start: datetime, end: datetime,
                run: Callable[[str, Sequence[str]], str] | None = None) -> list[Wait]:
    """Pending stretches from sacct: each job (and each requeued run) from Eligible to
    Start, GPUs from ReqTRES's gres/gpu; a job still pending has no Start. `run`: the
    command runner (default gpu_audit.slurmcmd.run), as chargeback's read_sacct takes."""
    fields = ("JobIDRaw", "Eligible", "Start", "ReqTRES", "State")
    args = ["-a", "-X", "-D", "-n", "-P", "-S", slurmcmd.slurm_time(start.timestamp()),
            "-E", slurmcmd.slurm_time(end.timestamp() - 1), "-o", ",".join(fields)]
    try:
        rows = slurmcmd.parsable((run or slurmcmd.run)("sacct", args), fields)
    except slurmcmd.SlurmCommandError as exc:
        raise SacctError(str(exc)) from None
    out = []
    for r in rows:
        gpus = gpus_of(r["ReqTRES"])
        eligible = slurmcmd.parse_time(r["Eligible"])
        if gpus == 0 or eligible is None:
            continue
        out.append(Wait("slurm", r["JobIDRaw"], float(gpus), eligible,
                        slurmcmd.parse_time(r["Start"])))
    return out


def read_slurm(start: datetime, end: datetime, bin_seconds: float, now: float,
               run: Callable[[str, Sequence[str]], str] | None = None
               ) -> tuple[list[Bin], list[str]]:
    """Bins from real scontrol and sacct (chargeback.capacity.slurm.slurm_bins)."""
    nodes = parse_nodes(read_nodes(run))
    if not any(n.gpus for n in nodes):
        raise SacctError("scontrol show node lists no node with GPUs (Gres=gpu:...): no "
                         "installed capacity to report against")
    return slurm_bins(start, end, bin_seconds, read_sacct(start, end, run), nodes=nodes,
                      now=now)


def whatif(args: argparse.Namespace, start: datetime, end: datetime
           ) -> tuple[list[WhatIf], str]:
    """The queue replayed by the launcher's own engine: as configured without idle
    reclaim (the baseline), with idle reclaim, and with +N GPUs."""
    return run_whatif(args.whatif_trace, args.launcher_state, args.whatif_gpus, start, end,
                      node_gpus=args.node_gpus)


def capacity_command(args: argparse.Namespace) -> int:
    start, end = period(args)
    problems = []
    if end <= start:
        problems.append(f"the period is empty: {start.isoformat()} is not before "
                        f"{end.isoformat()}")
    if args.source == "prometheus" and not args.prometheus_url:
        problems.append("--prometheus-url URL is needed with --source prometheus")
    if args.horizon_days < 1:
        problems.append(f"--horizon-days {args.horizon_days}: at least 1")
    if args.node_gpus is not None and not 1 <= args.node_gpus <= 64:
        problems.append(f"--node-gpus {args.node_gpus}: 1 to 64 (the replay engine's node)")
    if any(n < 1 for n in args.whatif_gpus):
        problems.append("--whatif-gpus N: N is at least 1")
    if problems:
        raise ConfigError("arguments", problems)
    req = _request(args, start, end)
    notes: list[str] = []
    not_known: tuple[str, ...] = ()
    try:
        if args.source == "slurm":
            bins, slurm_notes = read_slurm(start, end, BINS[args.bin], time.time())
            notes += slurm_notes
            basis_text, not_known = SLURM_BASIS, NOT_KNOWN
        else:
            bins, basis_text = read_bins(req, BINS[args.bin], notes)
    except (SourceError, SacctError) as exc:
        print(f"gpu-audit capacity: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    if all(b.models is None for b in bins):
        print(f"gpu-audit capacity: no data for {start.isoformat()} .. {end.isoformat()} "
              f"from {args.source}: nothing to report (no fleet figures, so no utilisation, "
              "percentiles or forecast)", file=sys.stderr)
        return EXIT_FAILURE
    waits: list[Wait] = []
    sources: list[str] = []
    if args.launcher_state:
        waits += launcher_waits(args.launcher_state)
        sources.append("launcher")
    if args.slurm:
        try:
            waits += slurm_waits(start, end)
            sources.append("slurm")
        except SacctError as exc:
            notes.append(f"Slurm pending times not read: {exc}")
    if args.bin == "day":
        notes.append("day bins: p95/p99 allocated GPUs are of daily means (peaks inside a "
                     "day do not show) and 'hours at >= 90 %' counts the hours of whole days "
                     "whose mean was at least 90 % (--bin hour for hourly bins)")
    runs, note = whatif(args, start, end)
    cap = build(start, end, args.source, BINS[args.bin], bins, basis_text, waits, sources,
                args.horizon_days, runs, note, notes, not_known)
    written = write_outputs(cap, Path(args.out), png=not args.no_png)
    sys.stdout.write(summary(cap))
    for name in written:
        print(f"wrote {Path(args.out) / name}")
    return EXIT_OK
