"""The GPU inventory: a GPU lost before a restart is still reported lost after it, with
its XIDs and owner; the file survives crashes at every write step, and hostile or broken
files are a warning and an empty inventory, never a crash."""

from __future__ import annotations

import json
import logging
import os
import pwd
from pathlib import Path

import pytest

from exporter import inventory_store
from exporter.exposition.render import RenderOptions, render_snapshot
from exporter.inventory import MISSING, Inventory, open_inventory
from exporter.inventory_store import FILE_NAME, InventoryStore
from gpu_audit.errors import LockHeld
from gpu_audit.model.attribution import AttributedProcess, Attribution
from gpu_audit.model.samples import BackendInfo, GpuInfo, GpuSample, ProcessSample
from gpu_audit.model.snapshot import Snapshot
from tests.exporter.exposition.test_render import named
from tests.smallfs import small_filesystem

G0, G1 = "GPU-00000000-aaaa", "GPU-11111111-bbbb"
IVAN = Attribution(user="ivan", project="climate", job="5150", slurm_job_id="5150")


def _gpu(uuid: str, index: int, *, up: bool = True, xids: dict[int, int] | None = None,
         last: float | None = None, procs: tuple[ProcessSample, ...] = ()) -> GpuSample:
    return GpuSample(GpuInfo(uuid=uuid, index=index, name="NVIDIA A100"), up=up,
                     error=None if up else "gpu_lost", processes=procs,
                     values={"utilization_gpu": {(): 0.5}} if up else {},
                     xid_totals=xids or {}, xid_last_timestamp=last)


def _snap(*gpus: GpuSample, owner: Attribution | None = None, t: float = 1000.0) -> Snapshot:
    procs = {g.uuid: tuple(AttributedProcess(g.uuid, p, owner) for p in g.processes)
             for g in gpus if owner is not None}
    return Snapshot(timestamp=t, host="n1", backend=BackendInfo(name="nvml"), gpus=gpus,
                    processes=procs)


def _lose_gpu1(directory: Path) -> None:
    """An exporter's life: GPU 1 runs ivan's job, then falls off the bus with XID 79."""
    inv = open_inventory(directory, "hardware")
    inv.annotate(_snap(_gpu(G0, 0), _gpu(G1, 1, procs=(ProcessSample(pid=7),)), owner=IVAN))
    inv.annotate(_snap(_gpu(G0, 0), _gpu(G1, 1, up=False, xids={79: 1}, last=1001.0), t=1001))
    inv.close()


def test_a_gpu_lost_before_a_restart_is_still_lost_after_it(tmp_path: Path) -> None:
    """After the restart the backend no longer enumerates GPU 1: it is reported down
    (gpu_up 0), with its XID 79 and the owner it had when last read, and rendered so."""
    _lose_gpu1(tmp_path / "inv")
    inv = open_inventory(tmp_path / "inv", "hardware")
    snap = inv.annotate(_snap(_gpu(G0, 0), t=2000))
    lost = next(g for g in snap.gpus if g.uuid == G1)
    assert (lost.up, lost.error, lost.info.index, dict(lost.xid_totals)) == (
        False, MISSING, 1, {79: 1})
    assert lost.xid_last_timestamp == 1001.0
    assert snap.last_owners == {G1: (("ivan", "climate", "5150", "5150"),)}
    body = render_snapshot(snap, RenderOptions()).body
    assert ({"gpu": "1", "uuid": G1}, 0.0) in named(body, "gpu_up")
    assert ({"gpu": "1", "uuid": G1, "xid": "79"}, 1.0) in named(body, "gpu_xid_errors_total")
    assert ({"gpu": "1", "uuid": G1, "user": "ivan", "project": "climate", "job": "5150",
             "slurm_job": "5150"},
            1.0) in named(body, "gpu_owner_info")
    inv.close()
    # and again after a second restart: still there
    again = open_inventory(tmp_path / "inv", "hardware")
    assert not next(g for g in again.annotate(_snap(_gpu(G0, 0))).gpus if g.uuid == G1).up
    again.close()


def test_xid_totals_continue_across_a_restart(tmp_path: Path) -> None:
    """A new process starts counting at 0: the recorded totals are added, so the counter
    goes on (2 XID 13 before, 1 after: 3) instead of resetting."""
    inv = open_inventory(tmp_path, "hardware")
    inv.annotate(_snap(_gpu(G0, 0, xids={13: 2}, last=10.0)))
    inv.close()
    inv = open_inventory(tmp_path, "hardware")
    assert dict(inv.annotate(_snap(_gpu(G0, 0))).gpus[0].xid_totals) == {13: 2}
    g = inv.annotate(_snap(_gpu(G0, 0, xids={13: 1, 31: 1}, last=20.0))).gpus[0]
    assert (dict(g.xid_totals), g.xid_last_timestamp) == ({13: 3, 31: 1}, 20.0)
    inv.close()


def test_a_gpu_back_in_enumeration_is_up_again(tmp_path: Path) -> None:
    """The lost GPU enumerates again after a reset: reported as the backend reads it,
    and recorded up."""
    _lose_gpu1(tmp_path)
    inv = open_inventory(tmp_path, "hardware")
    snap = inv.annotate(_snap(_gpu(G0, 0), _gpu(G1, 1)))
    assert [g.up for g in snap.gpus] == [True, True] and not snap.last_owners
    assert inv.recorded() == {G0: True, G1: True}
    inv.close()


def test_another_source_and_unidentified_slots_are_not_recorded(tmp_path: Path) -> None:
    """A simulator scenario's GPUs are not reported lost by the real backend (or by
    another scenario); a slot NVML could not identify ("unknown-index-N") is never
    recorded, or it would be reported lost forever once identified."""
    inv = open_inventory(tmp_path, "sim:xid")
    inv.annotate(_snap(_gpu(G1, 1), GpuSample(GpuInfo(uuid="unknown-index-2", index=2),
                                              up=False, error="gpu_lost")))
    inv.close()
    assert [g["uuid"] for g in json.loads((tmp_path / FILE_NAME).read_text())["gpus"]] == [G1]
    inv = open_inventory(tmp_path, "hardware")
    assert [g.uuid for g in inv.annotate(_snap(_gpu(G0, 0))).gpus] == [G0]
    inv.close()


def test_a_second_exporter_is_refused(tmp_path: Path) -> None:
    """One exporter per inventory directory: the second gets LockHeld naming the first."""
    first = open_inventory(tmp_path, "hardware")
    with pytest.raises(LockHeld) as err:
        open_inventory(tmp_path, "hardware")
    assert f"pid {os.getpid()}" in str(err.value)
    first.close()


@pytest.mark.parametrize(("content", "why"), [
    (b"{not json", "not JSON"),
    (b'{"version": 2, "source": "hardware", "gpus": []}', "version 2"),
    (b'{"version": 1, "source": "hardware", "gpus": [{"uuid": "../../etc", "index": -1,'
     b' "up": "yes"}]}', "gpus.0.uuid"),
    (b'{"version": 1, "source": "hardware", "gpus": [{"uuid": "GPU-a", "index": 0, '
     b'"up": false}, {"uuid": "GPU-a", "index": 1, "up": false}]}', "listed twice"),
    (b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (b" " * (inventory_store.MAX_BYTES + 1), "larger than"),
    (b"\xff\xfe garbage", "not JSON"),
])
def test_a_bad_file_is_a_warning_and_an_empty_inventory(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, content: bytes, why: str) -> None:
    """Whatever the file holds, the exporter starts with an empty inventory and says why
    in one warning; the next save replaces the bad file with a good one."""
    os.chmod(tmp_path, 0o700)
    (tmp_path / FILE_NAME).write_bytes(content)
    with caplog.at_level(logging.WARNING, "gpu_audit.inventory"):
        inv = open_inventory(tmp_path, "hardware")
    assert why in caplog.text
    assert [g.uuid for g in inv.annotate(_snap(_gpu(G0, 0))).gpus] == [G0]
    inv.close()
    assert json.loads((tmp_path / FILE_NAME).read_text())["gpus"][0]["uuid"] == G0


def test_a_symlink_in_place_of_the_file_is_neither_read_nor_followed(tmp_path: Path) -> None:
    """A symlink named like the inventory (to a file the attacker wants read or
    clobbered) is ignored on load and replaced, not written through, on save."""
    target = tmp_path / "precious"
    target.write_text("keep me")
    inv_dir = tmp_path / "inv"
    inv_dir.mkdir(mode=0o700)
    (inv_dir / FILE_NAME).symlink_to(target)
    (inv_dir / (FILE_NAME + ".tmp")).symlink_to(target)
    inv = open_inventory(inv_dir, "hardware")
    inv.annotate(_snap(_gpu(G0, 0)))
    inv.close()
    assert target.read_text() == "keep me"
    assert not (inv_dir / FILE_NAME).is_symlink()


def test_a_directory_others_can_write_or_own_is_not_used(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A directory writable by others (or, as root, owned by another user) could be made
    to hold anything: the inventory then keeps nothing there, says so, and still works in
    memory."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    with caplog.at_level(logging.WARNING, "gpu_audit.inventory"):
        inv = open_inventory(shared, "hardware")
    assert "writable by others" in caplog.text
    assert [g.up for g in inv.annotate(_snap(_gpu(G0, 0))).gpus] == [True]
    inv.close()
    assert not (shared / FILE_NAME).exists()
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, pwd.getpwnam("nobody").pw_uid, -1)
        caplog.clear()
        with caplog.at_level(logging.WARNING, "gpu_audit.inventory"):
            open_inventory(theirs, "hardware").close()
        assert "is owned by uid" in caplog.text
        assert not (theirs / FILE_NAME).exists()


def test_an_unusable_directory_leaves_the_exporter_serving(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A path under a file cannot be created: a warning, and the inventory works in
    memory (the exporter must keep serving, as it does when its spool cannot be)."""
    (tmp_path / "file").write_text("")
    with caplog.at_level(logging.WARNING, "gpu_audit.inventory"):
        inv = open_inventory(tmp_path / "file" / "inv", "hardware")
    assert "GPU inventory not kept" in caplog.text
    inv.annotate(_snap(_gpu(G0, 0)))
    inv.annotate(_snap(_gpu(G0, 0, up=False)))
    inv.close()


class _Dies(BaseException):
    """The process is killed at this point (nothing after it runs, no cleanup)."""


@pytest.mark.parametrize("step", ["open", "write", "fsync", "replace"])
def test_a_crash_at_any_write_step_leaves_the_old_or_the_new_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str) -> None:
    """Killed at each step of the atomic replace, twice in a row: the next start reads
    the previous good document (GPU 1 lost, with XID 79) and saves over the debris."""
    _lose_gpu1(tmp_path)
    real = getattr(inventory_store._DirOps, step)

    def dies(*args: object, **kw: object) -> object:
        raise _Dies

    for _ in range(2):
        inv = open_inventory(tmp_path, "hardware")
        monkeypatch.setattr(inventory_store._DirOps, step, dies)
        with pytest.raises(_Dies):
            inv.annotate(_snap(_gpu(G0, 0, xids={13: 1}, last=5.0)))
        monkeypatch.setattr(inventory_store._DirOps, step, real)
        inv._store.close()  # type: ignore[union-attr]  # the kernel drops the lock of a dead process
    inv = open_inventory(tmp_path, "hardware")
    snap = inv.annotate(_snap(_gpu(G0, 0)))
    assert {g.uuid: (g.up, dict(g.xid_totals)) for g in snap.gpus} == {
        G0: (True, {}), G1: (False, {79: 1})}
    inv.close()
    doc = json.loads((tmp_path / FILE_NAME).read_text())
    assert {g["uuid"] for g in doc["gpus"]} == {G0, G1}


def test_owner_changes_alone_are_written_at_most_every_30_seconds(tmp_path: Path) -> None:
    """Jobs come and go: owner-only changes are saved at most every 30 s; a state change
    (the GPU lost) is saved at once, with the owner of that moment."""
    now = [0.0]
    store = InventoryStore(tmp_path)
    store.open()
    inv = Inventory(store, "hardware", clock=lambda: now[0])
    job = (ProcessSample(pid=1),)

    def owners_on_disk() -> list[str]:
        doc = json.loads((tmp_path / FILE_NAME).read_text())
        return [o["user"] for o in doc["gpus"][0]["owners"]]

    inv.annotate(_snap(_gpu(G0, 0, procs=job), owner=Attribution(user="a")))
    assert owners_on_disk() == ["a"]  # first sight: written
    now[0] = 5
    inv.annotate(_snap(_gpu(G0, 0, procs=job), owner=Attribution(user="b")))
    assert owners_on_disk() == ["a"]
    now[0] = 31
    inv.annotate(_snap(_gpu(G0, 0, procs=job), owner=Attribution(user="c")))
    assert owners_on_disk() == ["c"]
    now[0] = 32
    inv.annotate(_snap(_gpu(G0, 0, procs=job), owner=Attribution(user="d")))
    inv.annotate(_snap(_gpu(G0, 0, up=False)))
    assert owners_on_disk() == ["d"]
    inv.close()


def test_a_full_disk_is_retried_and_never_stops_sampling(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """On a filesystem with no room left, saving fails (one warning), the cycle goes on
    with the inventory in memory, and once there is room again the file is written."""
    with small_filesystem(tmp_path, 64 * 1024) as fs:
        inv_dir = fs / "inv"
        inv = open_inventory(inv_dir, "hardware")
        try:
            filler = fs / "filler"
            fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                for chunk in (65536, 4096, 1):
                    try:
                        while True:
                            os.write(fd, b"\0" * chunk)
                    except OSError:
                        pass
            finally:
                os.close(fd)
            with caplog.at_level(logging.WARNING, "gpu_audit.inventory"):
                for i in range(3):
                    snap = inv.annotate(_snap(_gpu(G0, 0, xids={13: i + 1})))
                    assert snap.gpus[0].xid_totals[13] == i + 1
            assert caplog.text.count("not written") == 1
            assert not (inv_dir / FILE_NAME).exists()
            filler.unlink()
            inv.annotate(_snap(_gpu(G0, 0, xids={13: 4})))
            assert json.loads((inv_dir / FILE_NAME).read_text())["gpus"][0]["xid_totals"] == {
                "13": 4}
        finally:
            inv.close()
