"""Chargeback from Elasticsearch / OpenSearch: aggregations over the records the search
sink indexed (one document per audit record, `_id` = record id), never a scroll of the
records themselves.

Three composite aggregations, each paged with `after_key`, and one count; every request
body is recorded in `SourceData.queries` as canonical JSON (sorted keys), prefixed with
the index searched:

- usage: `process` records of attributed processes, by (user, project, GPU name, UTC
  day; as in the archive source, a record at T counts for (start, end] and for the day
  of T - 1 ms): sums of `gpu_seconds` (used), `busy_gpu_seconds`, `energy_joules`, and the
  `gpu_seconds` of records whose own utilisation (`values.utilization_ratio`) is < 5 %
  (idle-held);
- unattributed: `unattributed` records by (GPU name, day), in three filters: `free` (no
  process at all on the GPU: idle fleet time and energy), `beside` (no unowned process,
  owners on the GPU: the energy their processes do not explain, added to the owners of
  that model and day in proportion to their energy, as the archive adds it per GPU)
  and `unknown` (held by unowned processes): the unattributed owner;
- fleet: `gpu` records by (GPU name, day): up `gpu_seconds` and `energy_joules`, down
  `elapsed_seconds`, and integrated power (`values.power_usage_watts x
  elapsed_seconds`, a script sum) for the cross-check. MIG instance records
  (`gpu.uuid` `MIG-...`) are left out: their parent's record has the energy;
- simulated: how many records in the period are `simulated: true` (left out of the
  three above unless `include_simulated`).

Version 3 usage records (the interval trail: one record per GPU and holder) carry the
bill's sums themselves, so two more aggregations add them up exactly: per (user, project,
GPU name, day) the holders' `s`, `c`, `b`, `i`, `e`, `pe` (records with `s`), and per
(GPU name, day) the GPUs' `gs`, `gd`, `gi`, `ge`, `gpe` (records with `gs`); a GPU's held
and busy time are its holders' charged and busy sums. Both trails may share an index
(an upgrade): each aggregation selects its own kinds.

Completeness (as the archive source states it): per host and stream, by aggregation,
the lowest and highest `seq` in the period and their count (`count == max - min + 1`:
none missing inside; more: the same seq twice), the highest seq before the period (the
chain must go on from it: min == before + 1, or min == 1 when nothing came before) and
the lowest after it (max == after - 1; none: the period is still open). Streams with
records in the period before and none in this one are listed as silent. A gap refuses
the bill unless --allow-gaps.

What aggregations cannot give exactly for version 1 and 2 records, and what is done
instead (in `notes`):
- used: the sum over process records, so an owner with several processes on one GPU
  counts each (the archive counts the GPU once);
- charged: per (GPU name, day), the owners' used time scaled to the time held by owners
  (up time - free - held only by unknown processes), so charged + unattributed + idle
  adds up to the fleet exactly; a GPU shared by several owners is split in proportion
  to their used time over that day, not per interval as the archive does;
- idle-held: by the process's own utilisation, not the GPU's;
- the owners' power cross-check: their energy share of the fleet's integrated power;
- allocated: not known (records carry no allocation); the column is empty.
There is no hash check here (the records' hashes are not recomputed: `audit verify --sink`
does that on a read-back); `verified` is None. Seq contiguity is checked (above).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from chargeback.model import UNATTRIBUTED, Fleet, Owner, Request, SourceData, Usage
from chargeback.sources.search_chains import completeness as prove
from chargeback.sources.search_query import (
    UNKNOWN_MODEL,
    SearchClient,
    SearchSettings,
    SearchUnavailable,
    _day,
    _Pager,
    _value,
    fleet3_body,
    fleet_body,
    simulated_body,
    unattributed_body,
    usage3_body,
    usage_body,
)


def _add(store: dict[Any, Any], key: Any, item: Any) -> None:
    if key in store:
        store[key].add(item)
    else:
        store[key] = item


def read_search(
    req: Request,
    settings: SearchSettings,
    client: SearchClient | None = None,
    progress: Callable[[int], None] | None = None,
) -> SourceData:
    """Aggregate the period's records in the search backend into a SourceData.

    `client`: for tests (an in-process server is reached through the real client built
    from `settings` when None). `progress(1)` is called after each request.
    Raises SearchUnavailable (naming the backend) when it cannot be reached or fails,
    and when the period holds no usage at all.
    """
    own = client is None
    client = client if client is not None else connect(settings)
    data = SourceData(source=settings.kind, start=req.start, end=req.end,
                      simulated_included=req.include_simulated, allocation_known=False)
    data.inputs[settings.kind] = settings.describe()
    pager = _Pager(client, settings, data, progress)
    try:
        # per (model, day): owners' used, free, unknown-held
        used_md: dict[tuple[str, str], float] = {}
        owner_rows: list[tuple[Owner, str, str, Usage]] = []
        for b in pager.buckets(usage_body, req):
            k = b["key"]
            owner: Owner = (k.get("user"), k.get("project"))
            model = k.get("model") or UNKNOWN_MODEL
            day = _day(k.get("day"))
            used = _value(b, "used")
            u = Usage(used_gpu_seconds=used, busy_gpu_seconds=_value(b, "busy"),
                      idle_held_gpu_seconds=_value(b, "idle", "seconds"),
                      energy_joules=_value(b, "energy"))
            owner_rows.append((owner, model, day, u))
            used_md[model, day] = used_md.get((model, day), 0.0) + used
        free_md: dict[tuple[str, str], tuple[float, float]] = {}
        beside_md: dict[tuple[str, str], float] = {}
        unknown: list[tuple[str, str, Usage]] = []
        for b in pager.buckets(unattributed_body, req):
            k = b["key"]
            model, day = k.get("model") or UNKNOWN_MODEL, _day(k.get("day"))
            free_md[model, day] = (_value(b, "free", "seconds"), _value(b, "free", "energy"))
            beside_md[model, day] = _value(b, "beside", "energy")
            secs = _value(b, "unknown", "seconds")
            unknown.append((model, day, Usage(
                used_gpu_seconds=secs, charged_gpu_seconds=secs,
                energy_joules=_value(b, "unknown", "energy"))))
        fleet_md: dict[tuple[str, str], Fleet] = {}
        for b in pager.buckets(fleet_body, req):
            k = b["key"]
            model, day = k.get("model") or UNKNOWN_MODEL, _day(k.get("day"))
            f = Fleet(gpu_seconds=_value(b, "up", "seconds"),
                      down_gpu_seconds=_value(b, "down", "seconds"),
                      energy_joules=_value(b, "up", "energy"),
                      power_energy_joules=_value(b, "up", "power"))
            _add(fleet_md, (model, day), f)
        v3_owner_rows: list[tuple[Owner, str, str, Usage]] = []
        held3: dict[tuple[str, str], list[float]] = {}  # (model, day) -> [held, busy]
        for b in pager.buckets(usage3_body, req):
            k = b["key"]
            owner3: Owner = (k.get("user"), k.get("project"))
            model, day = k.get("model") or UNKNOWN_MODEL, _day(k.get("day"))
            used = _value(b, "s")
            u = Usage(used_gpu_seconds=used, charged_gpu_seconds=_value(b, "c"),
                      busy_gpu_seconds=_value(b, "b"),
                      idle_held_gpu_seconds=_value(b, "i"),
                      energy_joules=_value(b, "e") / 1000.0,
                      power_energy_joules=_value(b, "pe") / 1000.0)
            v3_owner_rows.append((owner3, model, day, u))
            hb = held3.setdefault((model, day), [0.0, 0.0])
            hb[0] += u.charged_gpu_seconds
            hb[1] += u.busy_gpu_seconds
        fleet3: dict[tuple[str, str], Fleet] = {}
        for b in pager.buckets(fleet3_body, req):
            k = b["key"]
            model, day = k.get("model") or UNKNOWN_MODEL, _day(k.get("day"))
            fleet3[model, day] = Fleet(
                gpu_seconds=_value(b, "gs"), down_gpu_seconds=_value(b, "gd"),
                idle_held_gpu_seconds=_value(b, "gi"), energy_joules=_value(b, "ge") / 1000.0,
                power_energy_joules=_value(b, "gpe") / 1000.0)
        sim = pager.ask(simulated_body(req)).get("hits", {}).get("total", {})
        simulated = int(sim.get("value", 0)) if isinstance(sim, Mapping) else int(sim or 0)
        completeness = prove(pager, req)
    finally:
        if own:
            client.close()
    if not req.include_simulated:
        data.simulated_excluded = simulated
    if completeness.gaps and not req.allow_gaps:
        raise SearchUnavailable(
            f"{settings.describe()}: records are missing: the bill cannot be proven complete "
            "(pass --allow-gaps to bill anyway, stamped incomplete everywhere):\n  - "
            + "\n  - ".join(completeness.gaps))
    completeness.allowed = bool(completeness.gaps)
    data.completeness = completeness
    if not owner_rows and not fleet_md and not unknown and not v3_owner_rows and not fleet3:
        why = (f"{simulated} simulated record(s) only (--include-simulated bills them)"
               if simulated and not req.include_simulated else "no usage record")
        raise SearchUnavailable(
            f"{settings.describe()}: no usage for {req.start.isoformat()} .. "
            f"{req.end.isoformat()}: {why}")
    unknown_md = {(m, d): u.used_gpu_seconds for m, d, u in unknown}
    for (model, day), f in fleet_md.items():
        free_s = free_md.get((model, day), (0.0, 0.0))[0]
        f.held_gpu_seconds = max(0.0, f.gpu_seconds - free_s)
    # the energy owners' processes left on the `unattributed` record of their GPUs: theirs
    energy_md: dict[tuple[str, str], list[Usage]] = {}
    for _, model, day, u in owner_rows:
        energy_md.setdefault((model, day), []).append(u)
    for md, rest in beside_md.items():
        owners_here = energy_md.get(md)
        if not rest or not owners_here:
            continue
        total = sum(u.energy_joules for u in owners_here)
        for u in owners_here:
            u.energy_joules += rest * (u.energy_joules / total if total > 0
                                       else 1.0 / len(owners_here))
    for owner, model, day, u in owner_rows:
        fm = fleet_md.get((model, day))
        total_used = used_md[model, day]
        u.charged_gpu_seconds = u.used_gpu_seconds
        if fm is not None:
            if total_used > 0:
                by_owners = max(0.0, fm.held_gpu_seconds - unknown_md.get((model, day), 0.0))
                u.charged_gpu_seconds = u.used_gpu_seconds * by_owners / total_used
            if fm.energy_joules > 0:
                u.power_energy_joules = fm.power_energy_joules * u.energy_joules / fm.energy_joules
            fm.busy_gpu_seconds += u.busy_gpu_seconds
            fm.idle_held_gpu_seconds += u.idle_held_gpu_seconds
        _record(data, owner, model, day, u)
    for model, day, u in unknown:
        fm = fleet_md.get((model, day))
        if fm is not None and fm.energy_joules > 0:
            u.power_energy_joules = fm.power_energy_joules * u.energy_joules / fm.energy_joules
        if u.used_gpu_seconds or u.energy_joules:
            _record(data, UNATTRIBUTED, model, day, u)
    for owner3, model, day, u in v3_owner_rows:
        _record(data, owner3, model, day, u)
    for (model, day), f in fleet3.items():
        held, busy = held3.get((model, day), [0.0, 0.0])
        f.held_gpu_seconds, f.busy_gpu_seconds = held, busy
        _add(fleet_md, (model, day), f)
    for (model, day), f in sorted(fleet_md.items()):
        _add(data.fleet, model, _copy_fleet(f))
        entry = data.days.setdefault(day, ({}, Fleet()))
        entry[1].add(f)
    data.notes.extend([
        f"{settings.kind}: used = sum of process records (an owner's processes on one GPU "
        "each count); charged = used scaled per GPU model and day to the time held by "
        "owners; idle-held by the process's own utilisation; allocated not known (records "
        "carry no allocation): the column is empty",
        f"{settings.kind}: no hash-chain verification (an index keeps no order); verify "
        "the archive or `gpu-audit audit verify` the sink's read-back",
    ])
    return data


def _copy_fleet(f: Fleet) -> Fleet:
    c = Fleet()
    c.add(f)
    return c


def _record(data: SourceData, owner: Owner, model: str, day: str, u: Usage) -> None:
    total = data.usage.get((owner, model))
    if total is None:
        total = data.usage[owner, model] = Usage()
    total.add(u)
    owners = data.days.setdefault(day, ({}, Fleet()))[0]
    if owner in owners:
        owners[owner].add(u)
    else:
        d = Usage()
        d.add(u)
        owners[owner] = d


# --- the real clients ----------------------------------------------------------------


class _ElasticClient:
    def __init__(self, s: SearchSettings) -> None:
        import elasticsearch  # noqa: PLC0415 - the optional extra, only when used

        from gpu_audit.tls import elastic_transport_kwargs  # noqa: PLC0415

        kw: dict[str, Any] = {"request_timeout": s.timeout_s, "max_retries": 0}
        if s.cloud_id:
            kw["cloud_id"] = s.cloud_id
        else:
            kw["hosts"] = list(s.hosts)
        if s.username is not None and s.password is not None:
            kw["basic_auth"] = (s.username, s.password)
        if s.api_key is not None:
            kw["api_key"] = s.api_key
        kw.update(elastic_transport_kwargs(s.tls, ["https://"] if s.cloud_id else s.hosts,
                                           f"{s.kind}: tls"))
        self._es = elasticsearch.Elasticsearch(**kw)

    def search(self, index: str, body: dict[str, Any]) -> Mapping[str, Any]:
        resp = self._es.search(index=index, ignore_unavailable=True, allow_no_indices=True,
                               **body)
        out: Mapping[str, Any] = resp.body
        return out

    def close(self) -> None:
        self._es.close()


class _OpenSearchClient:
    def __init__(self, s: SearchSettings) -> None:
        import opensearchpy  # noqa: PLC0415 - the optional extra, only when used

        from gpu_audit.tls import ssl_context, uses_tls  # noqa: PLC0415

        kw: dict[str, Any] = {"hosts": list(s.hosts), "timeout": s.timeout_s,
                              "max_retries": 0}
        if s.username is not None and s.password is not None:
            kw["http_auth"] = (s.username, s.password)
        if uses_tls(s.tls, s.hosts):
            kw["use_ssl"] = True
            kw["ssl_context"] = ssl_context(s.tls, f"{s.kind}: tls")
        self._os = opensearchpy.OpenSearch(**kw)

    def search(self, index: str, body: dict[str, Any]) -> Mapping[str, Any]:
        out: Mapping[str, Any] = self._os.search(
            index=index, body=body,
            params={"ignore_unavailable": "true", "allow_no_indices": "true"})
        return out

    def close(self) -> None:
        self._os.close()


def connect(settings: SearchSettings) -> SearchClient:
    """The official client for the backend kind (its library is an optional extra)."""
    try:
        if settings.kind == "elasticsearch":
            return _ElasticClient(settings)
        if settings.kind == "opensearch":
            return _OpenSearchClient(settings)
    except ImportError as exc:
        raise SearchUnavailable(
            f"{settings.kind}: its client library is not installed ({exc.name}); "
            f"pip install 'gpu-audit[{settings.kind}]'") from None
    raise SearchUnavailable(f"unknown search backend {settings.kind!r}")
