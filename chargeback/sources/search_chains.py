"""The search source's proof of completeness (chargeback.sources.search): per host and
stream, by aggregation, the seqs of the records before, in and after the period (lowest,
highest, how many) and per host and GPU the seconds accounted, turned into the same
statement the archive source makes (docs/CHARGEBACK-SOURCES.md): each chain continuous
from the last record before the period to the first after it, or open; every gap named;
silent streams; the inventory's expected GPU-hours against the observed.

Request bodies and their reading only; the pager (and with it every query recorded in
the manifest) is the search source's. This module never bills.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from chargeback.model import Completeness, Request
from chargeback.sources.search_query import (
    PAGE_SIZE,
    _not_simulated,
    _ns,
    _opt,
    _Pager,
    _sum,
    _terms,
    _value,
)


def chains_body(req: Request, where: str, after: Mapping[str, Any] | None = None,
                ) -> dict[str, Any]:
    """Per host and stream, the seqs of the records `where` ("before", "in", "after")
    the period: lowest, highest, how many, and the newest record's time."""
    start, end = _ns(req.start), _ns(req.end)
    bounds = {"before": {"lte": start}, "in": {"gt": start, "lte": end},
              "after": {"gt": end}}[where]
    composite: dict[str, Any] = {"size": PAGE_SIZE,
                                 "sources": [_terms("host", "host"), _terms("stream", "stream")]}
    if after is not None:
        composite["after"] = dict(after)
    return {
        "size": 0,
        "query": {"bool": {"filter": [{"range": {"time_ns": bounds}}]}},
        "aggs": {"rows": {"composite": composite, "aggs": {
            "min_seq": {"min": {"field": "seq"}}, "max_seq": {"max": {"field": "seq"}},
            "count": {"value_count": {"field": "seq"}},
            "first_ns": {"min": {"field": "time_ns"}},
            "last_ns": {"max": {"field": "time_ns"}}}}},
    }


def _chains_page(where: str, req: Request, after: Mapping[str, Any] | None) -> dict[str, Any]:
    return chains_body(req, where, after)


def inventory_body(req: Request, after: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Per host and GPU (v3 `uuid`, v1/v2 `gpu.uuid`), the up + down seconds accounted."""
    composite: dict[str, Any] = {
        "size": PAGE_SIZE,
        "sources": [_terms("host", "host"), _terms("uuid3", "uuid"),
                    _terms("uuid2", "gpu.uuid")]}
    if after is not None:
        composite["after"] = dict(after)
    return {
        "size": 0,
        "query": {"bool": {
            "filter": [{"range": {"time_ns": {"gt": _ns(req.start), "lte": _ns(req.end)}}},
                       {"terms": {"kind": ["gpu", "usage"]}}],
            "must_not": _not_simulated(req)}},
        "aggs": {"rows": {"composite": composite, "aggs": {
            "gs": _sum("gs"), "gd": _sum("gd"), "up": _sum("gpu_seconds"),
            "down": {"filter": {"term": {"gpu.up": False}},
                     "aggs": {"seconds": _sum("elapsed_seconds")}}}}},
    }


# --- reading the answers ---------------------------------------------------------------

def completeness(pager: _Pager, req: Request) -> Completeness:
    """Every host's stream proven continuous across the period from seq aggregations
    (see the module docstring)."""
    chains: dict[str, dict[tuple[str, str], Mapping[str, Any]]] = {}
    for where in ("before", "in", "after"):
        make = functools.partial(_chains_page, where)
        chains[where] = {(b["key"].get("host") or "", b["key"].get("stream") or ""): b
                         for b in pager.buckets(make, req)}
    comp = Completeness()
    start, end = _ns(req.start), _ns(req.end)
    period = end - start
    for key in sorted(set(chains["in"]) | set(chains["before"])):
        host, stream = key
        name = f"stream {stream} of host {host}"
        inside, before, after = (chains[w].get(key) for w in ("in", "before", "after"))
        if inside is None:
            last_ns = _opt(before, "last_ns")
            if last_ns is not None and start - period < last_ns <= start:
                comp.silent.append(f"{name}: records in the period before, none in this one "
                                   f"(its last: seq {_opt(before, 'max_seq')})")
            continue
        lo, hi = _opt(inside, "min_seq"), _opt(inside, "max_seq")
        count = round(_value(inside, "count"))
        if lo is None or hi is None:
            continue
        gaps_before = len(comp.gaps)
        prev = _opt(before, "max_seq") if before is not None else None
        nxt = _opt(after, "min_seq") if after is not None else None
        if count < hi - lo + 1:
            comp.gaps.append(f"{name}: {hi - lo + 1 - count} seq(s) of {lo}..{hi} missing "
                             "in the period")
        elif count > hi - lo + 1:
            comp.gaps.append(f"{name}: {count - (hi - lo + 1)} seq(s) of {lo}..{hi} indexed "
                             "twice")
        if prev is None and lo != 1:
            comp.gaps.append(f"{name}: no record of it before the period; its first in it is "
                             f"seq {lo}: seq 1..{lo - 1} are not in the index")
        elif prev is not None and lo != prev + 1:
            comp.gaps.append(f"{name}: seq {prev + 1}..{lo - 1} missing between the last "
                             "record before the period and the first in it")
        if nxt is not None and nxt != hi + 1:
            comp.gaps.append(f"{name}: seq {hi + 1}..{nxt - 1} missing between the last "
                             "record in the period and the first after it")
        if len(comp.gaps) > gaps_before:
            comp.chains.append(f"{name}: NOT complete ({len(comp.gaps) - gaps_before} gap(s))")
            continue
        frm = f"seq {prev}" if prev is not None else "seq 1, the start of its chain"
        to = (f"seq {nxt}" if nxt is not None else
              f"its newest record, seq {hi}; the period is still open")
        comp.chains.append(f"{name}: continuous from {frm} to {to} ({count} record(s) in "
                           "the period)")
    # the time each host's chains cover: from the period's start when a record came
    # before it (else their first record), to its end when one came after (else the last)
    cover: dict[str, tuple[int, int]] = {}
    for key2, b in chains["in"].items():
        c_from: int = (start if chains["before"].get(key2) is not None
                       else (_opt(b, "first_ns") or start))
        c_to: int = (end if chains["after"].get(key2) is not None
                     else (_opt(b, "last_ns") or end))
        old = cover.get(key2[0])
        cover[key2[0]] = ((c_from, c_to) if old is None
                          else (min(old[0], c_from), max(old[1], c_to)))
    observed = 0.0
    gpus: set[tuple[str, str]] = set()
    for b in pager.buckets(inventory_body, req):
        k = b["key"]
        host, uuid = k.get("host") or "", k.get("uuid3") or k.get("uuid2")
        if not uuid:
            continue
        gpus.add((host, str(uuid)))
        observed += (_value(b, "gs") + _value(b, "gd") + _value(b, "up")
                     + _value(b, "down", "seconds"))
    expected = 0.0
    for host, _uuid in gpus:
        g_from, g_to = cover.get(host, (start, end))
        expected += (g_to - g_from) / 1e9
    hosts = {h for h, _u in gpus}
    comp.inventory_gpus, comp.inventory_hosts = len(gpus), len(hosts)
    comp.expected_gpu_hours, comp.observed_gpu_hours = expected / 3600.0, observed / 3600.0
    return comp
