"""`gpu-audit chargeback simulate SCENARIO`: a period's bill from the GPU simulator.

The real pipeline, in virtual time: the simulator backend (exporter.sim) plays the
scenario from the period's start, its processes are mirrored into a fake /proc and
attributed by the real resolver, the real AuditProducer hash-chains the cycle's records
(every one `simulated: true`) and the real archive sink writes them as day parts. The
clock is a number stepped by `step` seconds per cycle, so a month at 300 s cycles
(8,640 cycles) takes seconds to a minute, not a month.

Then the archive is billed like any other (`--source archive`, `--include-simulated`)
through a gpu-audit configuration written beside it (`gpu-audit-sim.yaml`, naming the
archive sink), so the manifest records it and `chargeback replay` re-reads the kept archive.
The bill says it is simulated: the report's banner, the archive source's note on the
simulated records billed, `include_simulated` in the manifest. Never silent fake data.

Owners are named as `gpu-audit run --simulate` names them (exporter.sim.fakeproc): the
user database is an empty passwd file, so a simulated uid never borrows this host's
user name (uid 1000 is `uid:1000` here, on every machine, in both paths) unless the
scenario's environment names the user.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

import orjson

from exporter.attribution.config import AttributionConfig
from exporter.attribution.resolver import Resolver
from exporter.sim.backend import SimBackend
from exporter.sim.fakeproc import write_fake_proc
from exporter.sim.scenario import load_scenario
from gpu_audit import __version__
from gpu_audit.audit.config import AuditConfig
from gpu_audit.audit.producer import AuditProducer
from gpu_audit.errors import GpuAuditError
from gpu_audit.model.samples import BackendInfo
from gpu_audit.model.snapshot import Snapshot
from shipper.sinks.archive.config import ArchiveSinkConfig
from shipper.sinks.archive.sink import ArchiveSink
from shipper.sinks.base import Outcome, SinkRecord

CONFIG_NAME = "gpu-audit-sim.yaml"
# The defaults give the trail `gpu-audit run` writes: interval usage records (schema 3,
# audit.interval_seconds a multiple of the sampling interval), in sealed day parts. A
# month at 60 s sampling is 43,200 cycles (under a minute).
SIM_STEP = 60.0
SIM_AUDIT_INTERVAL = 300.0
HOST = "sim-node"


class SimulationError(GpuAuditError, RuntimeError):
    """The simulated archive could not be written (the sink refused a record)."""


class _SinkSpool:
    """The producer's spool port, handing each group commit straight to the archive
    sink (what the shipper would deliver from a spool, in the same order)."""

    def __init__(self, sink: ArchiveSink) -> None:
        self.sink = sink
        self.offset = 0
        self.last: bytes | None = None
        self.records = 0

    def commit(self, payloads: Sequence[bytes]) -> int:
        first = self.offset
        batch = []
        for raw in payloads:
            self.offset += 1
            doc = orjson.loads(raw)
            batch.append(SinkRecord(offset=self.offset, record_id=doc["id"], doc=doc, raw=raw))
        if batch:
            for item in self.sink.send(batch):
                if item.outcome is not Outcome.DELIVERED:
                    raise SimulationError(f"archive sink: {item.outcome.value} {item.reason}")
            self.last = batch[-1].raw
            self.records += len(batch)
        return first

    def last_payload(self) -> bytes | None:
        return self.last

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Simulated:
    archive: Path
    config: Path  # a gpu-audit configuration whose archive sink is `archive`
    scenario: str
    cycles: int
    records: int
    gpus: int


@dataclass(slots=True)
class _Node:
    host: str
    backend: SimBackend
    info: BackendInfo
    producer: AuditProducer
    proc: Path
    resolver: Resolver


def simulate_archive(scenario: str, start: datetime, end: datetime, archive: Path,
                     config: Path, *, step: float = SIM_STEP, nodes: int = 1,
                     audit_interval: float | None = None,
                     observe: Callable[[Snapshot], None] | None = None) -> Simulated:
    """Play `scenario` over [start, end] in `step`-second cycles into `archive` (which
    must be empty or absent: a simulated trail is never appended to another), and write
    `config`, a gpu-audit configuration naming it as the archive sink.

    `nodes` > 1 plays that many copies of the scenario's node (hosts sim-node-01, ...,
    each its own hash-chained stream, the scenario's seed + i for its noise), their
    records delivered cycle by cycle in time order. `audit_interval` is
    audit.interval_seconds (a multiple of `step`; default SIM_AUDIT_INTERVAL, or `step`
    when that is not a multiple of it; equal to `step`: the per-cycle trail).
    `observe` sees every cycle's snapshot after the producer (tests render it into a
    Prometheus to bill the same run from both sources).
    """
    if not step > 0:
        raise SimulationError(f"--sim-step {step}: must be > 0")
    if audit_interval is None:
        q = SIM_AUDIT_INTERVAL / step
        audit_interval = SIM_AUDIT_INTERVAL if q >= 1 and abs(q - round(q)) < 1e-9 else step
    interval = audit_interval
    ratio = interval / step
    if ratio < 1 - 1e-9 or abs(ratio - round(ratio)) > 1e-6 * ratio:
        raise SimulationError(f"--sim-audit-interval {interval:g}: must be a multiple of "
                              f"--sim-step {step:g}")
    if nodes < 1:
        raise SimulationError(f"--sim-nodes {nodes}: must be >= 1")
    if archive.exists() and any(archive.iterdir()):
        raise SimulationError(f"{archive} is not empty: the simulated archive needs a "
                              "directory of its own")
    archive.mkdir(parents=True, exist_ok=True)
    base = load_scenario(scenario)
    t0, t_end = start.timestamp(), end.timestamp()
    clock = [t0]
    sink = ArchiveSink(ArchiveSinkConfig.model_validate(
        {"type": "archive", "directory": archive, "fsync": False}), "archive", archive)
    sink.start()
    spool = _SinkSpool(sink)
    fleet: list[_Node] = []
    cycles = 0
    try:
        for i in range(nodes):
            spec = base if i == 0 else replace(
                base, spec=base.spec.model_copy(update={"seed": base.spec.seed + i}))
            backend = SimBackend(spec, start_time=t0, clock=lambda: clock[0])
            host = HOST if nodes == 1 else f"{HOST}-{i + 1:02d}"
            proc = Path(tempfile.mkdtemp(prefix="gpu-audit-sim-proc-"))
            # an empty user database, as the exporter's simulator uses (SimProcfs)
            passwd = proc / "passwd"
            passwd.write_text("")
            fleet.append(_Node(
                host=host, backend=backend, info=backend.open(),
                producer=AuditProducer(AuditConfig(stream="sim", interval_seconds=interval),
                                       spool, host=host,
                                       exporter_version=__version__, simulated=True,
                                       clock=lambda: clock[0]),
                proc=proc, resolver=Resolver(AttributionConfig(procfs_root=proc,
                                                        passwd_file=passwd))))
        for node in fleet:
            node.producer.start()
        prev: float | None = None
        while clock[0] <= t_end:
            now = clock[0]
            for node in fleet:
                gpus = tuple(node.backend.sample(now, slow=cycles % 4 == 0))
                write_fake_proc(node.proc, (p for g in gpus for p in g.processes), prune=True)
                snap = Snapshot(
                    timestamp=now, host=node.host, backend=node.info, gpus=gpus,
                    processes=node.resolver.attribute(gpus), interval_seconds=step,
                    elapsed_seconds=now - prev if prev is not None else 0.0, cycle=cycles)
                node.producer.on_snapshot(snap)
                if observe is not None:
                    observe(snap)
            prev = now
            cycles += 1
            clock[0] = t0 + cycles * step
        clock[0] = t_end
        for node in fleet:
            node.producer.stop()
    finally:
        for node in fleet:
            node.backend.close()
            shutil.rmtree(node.proc, ignore_errors=True)
        sink.close()
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(
        "# written by gpu-audit chargeback simulate: the SIMULATED archive it billed\n"
        f"spool:\n  directory: {orjson.dumps(str(archive.parent / 'spool')).decode()}\n"
        "shipper:\n  sinks:\n  - type: archive\n"
        f"    directory: {orjson.dumps(str(archive)).decode()}\n", encoding="utf-8")
    return Simulated(archive=archive, config=config, scenario=base.name, cycles=cycles,
                     records=spool.records, gpus=len(base.gpus) * nodes)
