"""One simulated GPU: turns a scenario plan into a GpuSample at a given scenario time.

The device is compiled once from its GpuPlan and processes (curves into cheap
evaluators, identities and constant process samples built ahead), then `sample(t, slow)`
only does arithmetic. It keeps the state real counters need (energy, NVLink bytes, XID
totals) so they grow monotonically as scenario time advances.

How derived values are modelled (documented in exporter/sim/README.md):
GPU utilisation is the sum of its processes' (capped at 1); memory used is the sum of
process memory; power rises linearly from idle to full-load draw with load; temperature
follows load (or an explicit curve); at `slowdown_celsius` the SM clock drops and
sw_thermal_slowdown is set, at `hw_slowdown_celsius` further with hw_thermal_slowdown.

This module must never read files, sleep, or consult the wall clock: time comes in as
an argument, which is what lets tests drive it deterministically.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from exporter.sim.curves import Compiled, compile_curve, noise_bits, seed_key, unit_noise
from exporter.sim.scenario import GpuPlan, ProcessPlan
from exporter.sim.schema import DcgmSpec, EventSpec
from gpu_audit.model.fields import CATALOGUE, CLOCK_EVENT_REASONS, MEMORY_ERROR_XIDS
from gpu_audit.model.samples import (
    FieldValues,
    GpuSample,
    MigInstance,
    ProcessSample,
    XidEvent,
)

SLOW_KEYS: frozenset[str] = frozenset(m.key for m in CATALOGUE if m.tier == "slow")
DCGM_KEYS: frozenset[str] = frozenset(m.key for m in CATALOGUE if m.dcgm_only)
_UTIL_KEYS = ("utilization_gpu", "utilization_memory", "utilization_encoder",
              "utilization_decoder")
_NVLINK_KEYS = ("nvlink_up", "nvlink_errors", "nvlink_bytes")
_NVLINK_ERROR_TYPES = ("replay", "recovery", "crc_flit", "crc_data")
_ECC_KEYS = (("corrected", "volatile"), ("uncorrected", "volatile"),
             ("corrected", "aggregate"), ("uncorrected", "aggregate"))
_XID_DOUBLE_BIT_ECC = 48  # "DBE (double bit error) ECC error": counted and row-remapped
_PSTATE_BUSY, _PSTATE_IDLE = 0.0, 8.0
_TWELVE_BITS = 2.0 / 4096


class _Proc:
    """A compiled process: curves ready to evaluate, identity built once."""

    __slots__ = ("constant_sample", "constant_values", "curves", "end", "gi", "key", "mem",
                 "memutil", "noisy", "plan", "sm", "start", "template")

    template: list[float]

    def __init__(self, plan: ProcessPlan, seed: int, mig: bool) -> None:
        key = (seed, plan.gpu_index, plan.pid, plan.source_index)
        self.plan = plan
        self.start = plan.start
        self.end = math.inf if plan.end is None else plan.end
        self.gi = plan.gpu_instance_id
        self.key = seed_key(*key)
        self.mem = compile_curve(plan.memory, seed_key(*key, "mem"), lo=0.0)
        self.sm = compile_curve(plan.util.sm, seed_key(*key, "sm"), 0.0, 1.0)
        self.memutil = compile_curve(plan.util.mem, seed_key(*key, "memutil"), 0.0, 1.0)
        enc = compile_curve(plan.util.enc, seed_key(*key, "enc"), 0.0, 1.0)
        dec = compile_curve(plan.util.dec, seed_key(*key, "dec"), 0.0, 1.0)
        self.curves = (self.mem, self.sm, self.memutil, enc, dec)
        # Constant-plus-noise curves (the usual shape) share one hash per process and
        # cycle, 12 bits each: a third of the cost of hashing every curve on its own.
        self.noisy: tuple[tuple[int, float, float, float, float, int], ...] | None = None
        if all(c.base is not None for c in self.curves):
            self.template = [c.base or 0.0 for c in self.curves]
            self.noisy = tuple(
                (i, c.base, c.noise, c.lo, c.hi, 12 * i)
                for i, c in enumerate(self.curves) if c.base is not None and c.noise
            )
        # A process whose curves never change yields the same immutable sample every
        # cycle; building it once keeps the `large` scenario cheap.
        self.constant_values = self.values(0.0)
        self.constant_sample = (
            self.build(self.constant_values, mig)
            if all(c.constant is not None for c in self.curves) else None
        )

    def values(self, tp: float) -> list[float]:
        """[memory, sm, mem, enc, dec] at `tp` seconds into the process's life."""
        if self.noisy is None:
            return [c.at(tp) for c in self.curves]
        out = list(self.template)
        if self.noisy:
            h = noise_bits(self.key, math.floor(tp))
            for i, base, noise, lo, hi, shift in self.noisy:
                v = base + noise * (((h >> shift) & 0xFFF) * _TWELVE_BITS - 1.0)
                out[i] = lo if v < lo else hi if v > hi else v
        return out

    def build(self, values: list[float], mig: bool) -> ProcessSample:
        """The ProcessSample for curve `values` (as returned by `values`)."""
        plan = self.plan
        mem, sm, memutil, enc, dec = values
        if mig:
            # NVML has no per-process utilisation inside MIG instances.
            return ProcessSample(plan.pid, plan.name, plan.uid, plan.type, int(mem), None,
                                 None, None, None, plan.gpu_instance_id,
                                 plan.compute_instance_id, plan.identity)
        return ProcessSample(plan.pid, plan.name, plan.uid, plan.type, int(mem), sm, memutil,
                             enc, dec, plan.gpu_instance_id, plan.compute_instance_id,
                             plan.identity)



class SimDevice:
    """The simulated state of one GPU across a run."""

    def __init__(
        self,
        plan: GpuPlan,
        processes: Sequence[ProcessPlan],
        events: Sequence[EventSpec],
        *,
        seed: int,
        dcgm: DcgmSpec | None,
        boot_seconds: float,
        origin: float,
        time_scale: float = 1.0,
    ) -> None:
        self.plan = plan
        # Scenario seconds per wall second: the story runs faster, the physics do not.
        # Counters (energy, NVLink bytes, violation time) accrue per wall second, so a
        # demo at time_scale 60 reports the energy its power draw integrates to over the
        # wall time the run took, not 60 times that.
        self.time_scale = time_scale
        self.info = plan.info
        spec = plan.spec
        self.spec = spec
        self.mig_mode = plan.info.mig_mode
        self.origin = origin
        self.dcgm = dcgm
        self.procs = [_Proc(p, seed, self.mig_mode) for p in processes]
        self.unsupported = self._unsupported()
        self.max_power = spec.max_power_watts or spec.power_limit_watts * 0.95
        self.temp_curve: Compiled | None = (
            compile_curve(spec.thermal.curve, seed_key(seed, plan.info.index, "temp"))
            if spec.thermal.curve is not None else None
        )
        self.noise_key = seed_key(seed, plan.info.index, "gpu")
        self.xid_events = [e for e in events if e.kind == "xid"]
        self.lost = [(e.at, math.inf if e.until is None else e.until)
                     for e in events if e.kind == "lost"]
        self.links = spec.nvlink.links if spec.nvlink is not None else 0
        self.link_factor = [
            0.9 + 0.2 * (unit_noise(self.noise_key, link) + 1) / 2 for link in range(self.links)
        ]
        self.down_links = frozenset(spec.nvlink.down_links) if spec.nvlink else frozenset()
        # Counter state: the driver has been up `boot_seconds`, idling, before time 0.
        self.energy = boot_seconds * spec.idle_power_watts
        self.nvlink_bytes = 0.0
        # Seconds of clock violation per policy (NVML's violation status), since t=0.
        self.violation = {"power": 0.0, "thermal": 0.0}
        self.last_t: float | None = None
        self.last_power: float | None = None
        self.last_sm = 0.0
        self.xid_next = 0
        self.xid_totals: dict[int, int] = {}
        self.xid_last: float | None = None
        self.dbe_count = 0
        self.slow_values: dict[str, FieldValues] | None = None

    def _unsupported(self) -> frozenset[str]:
        spec = self.spec
        out = set(spec.unsupported)
        if not spec.fan:
            out.add("fan_speed")
        if spec.ecc is None:
            out.add("ecc_errors")
        if spec.retired_pages is None:
            out.update(("retired_pages", "retired_pages_pending"))
        if spec.remapped_rows is None:
            out.update(("remapped_rows", "remapped_rows_pending", "remapped_rows_failure"))
        if spec.nvlink is None:
            out.update(_NVLINK_KEYS)
        if self.dcgm is None:
            out.update(DCGM_KEYS)
        if self.mig_mode:
            # Real hardware: device utilisation is not supported on a MIG parent, and
            # DCGM reports its profiling fields per GPU instance (MigInstance.values).
            out.update(_UTIL_KEYS)
            out.update(DCGM_KEYS)
        return frozenset(out)

    def is_lost(self, t: float) -> bool:
        return any(a <= t < b for a, b in self.lost)

    def inject(self, kind: str, t: float, xid: int | None = None) -> None:
        """A live event at scenario time `t` (exporter/sim/hostprocs.py reads them):
        `xid` (code `xid`) is reported by the next sample, `lost` takes the GPU down from
        `t` until a `recovered` event."""
        if kind == "xid" and xid is not None:
            ev = EventSpec(at=t, gpu=self.info.index, kind="xid", xid=xid)
            # after the ones already reported, in time order among those still due
            later = [e for e in self.xid_events[self.xid_next:] if e.at > t]
            self.xid_events = [*self.xid_events[:len(self.xid_events) - len(later)], ev, *later]
        elif kind == "lost":
            if not self.is_lost(t):
                self.lost.append((t, math.inf))
        elif kind == "recovered":
            self.lost = [(a, min(b, t)) if a <= t < b else (a, b) for a, b in self.lost]

    def sample(self, t: float, slow: bool,
               host_processes: Sequence[ProcessSample] = ()) -> GpuSample:
        """The GPU at `t` scenario seconds. `t` must not go backwards between calls.
        `host_processes`: real processes of this host on the GPU this cycle (their
        memory and utilisation count like a scenario process's)."""
        new_xids = self._advance_xids(t)
        if self.is_lost(t):
            self.last_t, self.last_power = t, None
            return GpuSample(
                info=self.info, up=False, error="gpu_lost", xid_totals=dict(self.xid_totals),
                xid_last_timestamp=self.xid_last, new_xids=new_xids,
            )
        # wall seconds since the last sample: what the counters accrue over
        dt = 0.0 if self.last_t is None else max(t - self.last_t, 0.0) / self.time_scale
        procs: list[ProcessSample] = []
        sm = memutil = enc = dec = 0.0
        mem_used = 0
        per_instance: dict[int, int] = {}
        mig_mode = self.mig_mode
        for p in self.procs:
            start = p.start
            if not start <= t < p.end:
                continue
            sample = p.constant_sample
            if sample is None:
                vals = p.values(t - start)
                sample = p.build(vals, mig_mode)
            else:
                vals = p.constant_values
            procs.append(sample)
            used = int(vals[0])
            mem_used += used
            if p.gi is not None:
                per_instance[p.gi] = per_instance.get(p.gi, 0) + used
            # Inside MIG these are hidden from NVML but still heat and power the board.
            sm += vals[1]
            memutil += vals[2]
            enc += vals[3]
            dec += vals[4]
        for hp in host_processes:
            procs.append(hp)
            mem_used += hp.used_memory_bytes or 0
            sm += hp.sm_util_ratio or 0.0
            memutil += hp.memory_util_ratio or 0.0
        sm, memutil, enc, dec = min(sm, 1.0), min(memutil, 1.0), min(enc, 1.0), min(dec, 1.0)
        inst_util = self._instance_util(t) if mig_mode and self.dcgm is not None else {}
        values = self._fast_values(
            t, dt, sm=sm, memutil=memutil, enc=enc, dec=dec, mem_used=mem_used, busy=bool(procs)
        )
        # a memory-error XID changes ECC and row remapping now (as the NVML backend
        # re-reads them at once), not at the next slow cycle
        memory_xid = any(ev.xid in MEMORY_ERROR_XIDS for ev in new_xids)
        if slow or memory_xid or self.slow_values is None:
            self.slow_values = self._slow_values(t)
        values.update(self.slow_values)
        self.last_t = t
        mig = tuple(
            MigInstance(m.uuid, m.gpu_instance_id, m.compute_instance_id, m.profile,
                        m.memory_total_bytes, per_instance.get(m.gpu_instance_id, 0),
                        self._instance_prof(inst_util.get(m.gpu_instance_id, (0.0, 0.0))))
            for m in self.plan.mig
        )
        unsupported = self.unsupported
        return GpuSample(
            info=self.info,
            values={k: v for k, v in values.items() if k not in unsupported},
            unsupported=unsupported,
            processes=tuple(procs),
            mig=mig,
            xid_totals=dict(self.xid_totals),
            xid_last_timestamp=self.xid_last,
            new_xids=new_xids,
        )

    def _advance_xids(self, t: float) -> tuple[XidEvent, ...]:
        new = []
        while self.xid_next < len(self.xid_events) and self.xid_events[self.xid_next].at <= t:
            ev = self.xid_events[self.xid_next]
            self.xid_next += 1
            assert ev.xid is not None
            self.xid_totals[ev.xid] = self.xid_totals.get(ev.xid, 0) + 1
            self.xid_last = self.origin + ev.at
            if ev.xid == _XID_DOUBLE_BIT_ECC:
                self.dbe_count += 1
            new.append(XidEvent(uuid=self.info.uuid, xid=ev.xid, timestamp=self.xid_last))
        return tuple(new)

    def _fast_values(
        self, t: float, dt: float, *, sm: float, memutil: float, enc: float, dec: float,
        mem_used: int, busy: bool,
    ) -> dict[str, FieldValues]:
        spec, thermal, clocks = self.spec, self.spec.thermal, self.spec.clocks
        bucket = math.floor(t)
        load = min(1.0, 0.75 * sm + 0.25 * memutil)
        power = self.spec.idle_power_watts + (self.max_power - spec.idle_power_watts) * load
        power = min(power * (1.0 + 0.015 * unit_noise(self.noise_key, bucket)),
                    spec.power_limit_watts)
        if self.last_power is not None:
            self.energy += (self.last_power + power) / 2.0 * dt
            self.nvlink_bytes += (self.last_sm + sm) / 2.0 * dt * (
                spec.nvlink.bytes_per_second if spec.nvlink else 0.0)
        self.last_power, self.last_sm = power, sm
        if self.temp_curve is not None:
            temp = self.temp_curve.at(t)
        else:
            temp = thermal.idle_celsius + (thermal.load_celsius - thermal.idle_celsius) * load
            temp += 0.6 * unit_noise(self.noise_key ^ 0x5A5A, bucket)
        temp = float(round(temp))
        sw_thermal = temp >= thermal.slowdown_celsius
        hw_thermal = temp >= thermal.hw_slowdown_celsius
        sm_mhz = clocks.sm_max_mhz if busy or sm >= 0.01 else clocks.sm_idle_mhz
        if hw_thermal:
            sm_mhz *= clocks.hw_thermal_clock_ratio
        elif sw_thermal:
            sm_mhz *= clocks.sw_thermal_clock_ratio
        power_capped = power >= 0.98 * spec.power_limit_watts
        # The state seen now is charged for the whole interval since the last sample.
        if sw_thermal:
            self.violation["thermal"] += dt
        if power_capped:
            self.violation["power"] += dt
        active = {
            "gpu_idle": sm < 0.01,
            "sw_power_cap": power_capped,
            "sw_thermal_slowdown": sw_thermal,
            "hw_thermal_slowdown": hw_thermal,
        }
        reasons: dict[tuple[str, ...], float] = {
            (r,): 1.0 if active.get(r, False) else 0.0 for r in CLOCK_EVENT_REASONS
        }
        fan_span = max(thermal.hw_slowdown_celsius - thermal.idle_celsius, 1.0)
        fan = min(1.0, max(0.3, 0.3 + 0.7 * (temp - thermal.idle_celsius) / fan_span))
        free = max(spec.memory_total - spec.memory_reserved - mem_used, 0.0)
        values: dict[str, FieldValues] = {
            "utilization_gpu": {(): sm},
            "utilization_memory": {(): memutil},
            "utilization_encoder": {(): enc},
            "utilization_decoder": {(): dec},
            "memory_total": {(): float(spec.memory_total)},
            "memory_used": {(): float(mem_used)},
            "memory_free": {(): float(free)},
            "memory_reserved": {(): float(spec.memory_reserved)},
            "temperature_gpu": {(): temp},
            "temperature_memory": {(): temp + thermal.memory_offset_celsius},
            "power_usage": {(): round(power, 3)},
            "energy": {(): round(self.energy, 3)},
            "clock_sm": {(): float(round(sm_mhz)) * 1e6},
            "clock_memory": {(): clocks.memory_mhz * 1e6},
            "fan_speed": {(): round(fan, 2)},
            "performance_state": {(): _PSTATE_BUSY if busy else _PSTATE_IDLE},
            "clock_event_reason": reasons,
            "violation_time": {(p,): round(v, 6) for p, v in self.violation.items()},
            "pcie_replay": {(): float(math.floor(spec.pcie_replay_per_hour * t / 3600.0))},
        }
        if self.links:
            values["nvlink_bytes"] = {
                (str(link), direction): (
                    0.0 if link in self.down_links
                    else float(math.floor(self.nvlink_bytes * self.link_factor[link]))
                )
                for link in range(self.links) for direction in ("transmit", "receive")
            }
        if self.dcgm is not None:
            values.update(self._dcgm_values(self.dcgm, sm, memutil))
        return values

    def _instance_util(self, t: float) -> dict[int, tuple[float, float]]:
        """gpu_instance_id -> (SM, memory) utilisation of its live processes, capped at 1:
        hidden from NVML inside MIG, but what DCGM's per-instance profiling measures."""
        out: dict[int, tuple[float, float]] = {}
        for p in self.procs:
            if p.gi is None or not p.start <= t < p.end:
                continue
            vals = p.constant_values if p.constant_sample is not None else p.values(t - p.start)
            sm, mem = out.get(p.gi, (0.0, 0.0))
            out[p.gi] = (min(sm + vals[1], 1.0), min(mem + vals[2], 1.0))
        return out

    def _instance_prof(self, util: tuple[float, float]) -> dict[str, float]:
        """One MIG instance's DCGM profiling fields (none without simulated DCGM)."""
        if self.dcgm is None:
            return {}
        return {key: v[()] for key, v in self._dcgm_values(self.dcgm, *util).items()}

    @staticmethod
    def _dcgm_values(d: DcgmSpec, sm: float, memutil: float) -> dict[str, FieldValues]:
        # The scenario's ratios relative to SM (or memory) utilisation.
        return {
            "prof_gr_engine_active": {(): sm * d.gr_engine_active},
            "prof_sm_active": {(): sm * d.sm_active},
            "prof_sm_occupancy": {(): sm * d.sm_occupancy},
            "prof_pipe_tensor_active": {(): sm * d.pipe_tensor_active},
            "prof_dram_active": {(): memutil * d.dram_active},
            "prof_pipe_fp64_active": {(): sm * d.pipe_fp64_active},
            "prof_pipe_fp32_active": {(): sm * d.pipe_fp32_active},
            "prof_pipe_fp16_active": {(): sm * d.pipe_fp16_active},
            "prof_pcie_tx_bytes": {(): d.pcie_tx_bytes_per_second * memutil},
            "prof_pcie_rx_bytes": {(): d.pcie_rx_bytes_per_second * memutil},
        }

    def _slow_values(self, t: float) -> dict[str, FieldValues]:
        spec = self.spec
        hours = t / 3600.0
        values: dict[str, FieldValues] = {"power_limit": {(): spec.power_limit_watts}}
        if spec.ecc is not None:
            corr = math.floor(spec.ecc.corrected_per_hour * hours)
            unc = math.floor(spec.ecc.uncorrected_per_hour * hours) + self.dbe_count
            values["ecc_errors"] = {
                _ECC_KEYS[0]: float(corr),
                _ECC_KEYS[1]: float(unc),
                _ECC_KEYS[2]: float(spec.ecc.aggregate_corrected + corr),
                _ECC_KEYS[3]: float(spec.ecc.aggregate_uncorrected + unc),
            }
        if spec.retired_pages is not None:
            retired = spec.retired_pages
            values["retired_pages"] = {
                ("single_bit_ecc",): float(retired.single_bit_ecc),
                ("double_bit_ecc",): float(retired.double_bit_ecc + self.dbe_count),
            }
            pending = retired.pending or self.dbe_count
            values["retired_pages_pending"] = {(): 1.0 if pending else 0.0}
        if spec.remapped_rows is not None:
            remapped = spec.remapped_rows
            values["remapped_rows"] = {
                ("correctable",): float(remapped.correctable),
                ("uncorrectable",): float(remapped.uncorrectable + self.dbe_count),
            }
            pending = remapped.pending or self.dbe_count
            values["remapped_rows_pending"] = {(): 1.0 if pending else 0.0}
            values["remapped_rows_failure"] = {(): 1.0 if remapped.failure else 0.0}
        if spec.nvlink is not None:
            errs = spec.nvlink.errors
            rates = (errs.replay_per_hour, errs.recovery_per_hour, errs.crc_flit_per_hour,
                     errs.crc_data_per_hour)
            values["nvlink_up"] = {
                (str(link),): 0.0 if link in self.down_links else 1.0
                for link in range(self.links)
            }
            values["nvlink_errors"] = {
                (str(link), kind): float(math.floor(rate * hours))
                for link in range(self.links)
                for kind, rate in zip(_NVLINK_ERROR_TYPES, rates, strict=True)
            }
        assert set(values) <= SLOW_KEYS, set(values) - SLOW_KEYS
        return values
