"""gpu_owner_info: exactly one series per GPU that has an owner, so the hardware alerts'
owner join (alerts/promql.py with_owner) is never many-to-many; a GPU that is down keeps
the owners it had when it was last read."""

from __future__ import annotations

import dataclasses

from exporter.exposition.render import RenderOptions, render_snapshot
from exporter.owners import owner_label_values, owners_of
from gpu_audit.model.attribution import UNKNOWN, AttributedProcess, Attribution
from tests.exporter.exposition.snapshots import GIB, UUID0, UUID1, alice, proc, small_snapshot
from tests.exporter.exposition.test_render import named


def test_one_series_per_gpu_with_every_owner_comma_separated() -> None:
    """GPU 0 holds alice's job 42 (two processes) and bob's pod (no project, no job):
    one series, each label's distinct values sorted and joined; the unattributed process
    names nobody; GPU 1 (down, no recorded owners) has none."""
    body = render_snapshot(small_snapshot(), RenderOptions()).body
    rows = named(body, "gpu_owner_info")
    assert rows == [({"gpu": "0", "uuid": UUID0, "simulated": "true", "user": "alice,bob",
                      "project": "vision", "job": "42", "slurm_job": ""}, 1.0)]


def test_a_down_gpu_keeps_the_owners_it_had_when_last_read() -> None:
    """GPU 1 is down and has no processes: its series comes from the snapshot's
    `last_owners` (the inventory's record), with the owner's values as they were."""
    snap = dataclasses.replace(small_snapshot(),
                               last_owners={UUID1: (("ivan", "climate", "5150", "5150"),)})
    rows = {lbl["uuid"]: lbl for lbl, _ in named(render_snapshot(snap, RenderOptions()).body,
                                                  "gpu_owner_info")}
    assert rows[UUID1] == {"gpu": "1", "uuid": UUID1, "simulated": "true", "user": "ivan",
                           "project": "climate", "job": "5150", "slurm_job": "5150"}


def test_an_up_gpu_ignores_last_owners_and_an_unowned_gpu_has_no_series() -> None:
    """Owners of a GPU that is up are its processes' now, never a stale record; a GPU
    only unattributed processes use has no series at all (not an empty owner)."""
    snap = small_snapshot()
    only_unknown = (AttributedProcess(UUID0, proc(7, GIB), UNKNOWN),)
    snap = dataclasses.replace(snap, processes={UUID0: only_unknown},
                               last_owners={UUID0: (("mallory", "x", "y", ""),)})
    assert named(render_snapshot(snap, RenderOptions()).body, "gpu_owner_info") == []


def test_owner_values_skip_empty_fields_and_identities_without_an_owner() -> None:
    """A container-only identity is nobody to tell; empty fields do not leave stray
    commas; no owner gives no label values."""
    procs = [AttributedProcess(UUID0, proc(1, GIB), alice("9")),
             AttributedProcess(UUID0, proc(2, GIB), Attribution(container_id="abc")),
             AttributedProcess(UUID0, proc(3, GIB), Attribution(user="carol"))]
    owners = owners_of(procs)
    assert owners == (("alice", "vision", "9", ""), ("carol", "", "", ""))
    assert owner_label_values(owners) == ("alice,carol", "vision", "9", "")
    assert owner_label_values(()) is None
