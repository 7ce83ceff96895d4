"""A GPU lost before a restart is still reported lost after it: a real
`gpu-audit exporter` plays the xid scenario until GPU 1 falls off the bus (XID 79), is
stopped, and starts again on the same node with GPU 1 gone from enumeration. Its
/metrics still says gpu_up 0 for that GPU, with its XID 79 and the owner whose job died,
and the inventory file on disk says the same."""

from __future__ import annotations

import json
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from exporter.sim.scenario import load_scenario
from tests.netutil import http_get
from tests.polling import wait_for
from tests.promstack import Exporter, scenario_without_gpu, start_exporter, wait_ready


def _metrics(exporter: Exporter) -> dict[str, list[tuple[dict[str, str], float]]]:
    status, body = http_get(f"http://{exporter.target}/metrics")
    assert status == 200
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def _of(rows: list[tuple[dict[str, str], float]], uuid: str) -> list[tuple[dict[str, str], float]]:
    return [(labels, v) for labels, v in rows if labels.get("uuid") == uuid]


def test_a_gpu_lost_before_a_restart_stays_lost_with_its_xid_and_owner(tmp_path: Path) -> None:
    """Before: GPU 1 lost (gpu_up 0, XID 79, owner ivan). After a restart in which it is
    not enumerated: the same three facts, from the inventory; the other GPUs are up."""
    lost = load_scenario("xid").gpus[1].info.uuid
    first = start_exporter(tmp_path, "xid", time_scale=600, interval=0.5)
    try:
        wait_ready(first)

        def gpu1_lost() -> bool:
            m = _metrics(first)
            return (_of(m.get("gpu_up", []), lost) == [({"gpu": "1", "uuid": lost,
                                                         "simulated": "true"}, 0.0)]
                    and bool(_of(m.get("gpu_owner_info", []), lost)))

        wait_for(gpu1_lost, 60, "GPU 1 lost, with its owner")
    finally:
        first.stop()
    assert first.proc.returncode == 0

    gone = scenario_without_gpu(tmp_path, "xid", 1)
    second = start_exporter(tmp_path, str(gone), time_scale=600, interval=0.5, node="xid")
    try:
        wait_ready(second)
        m = _metrics(second)
    finally:
        second.stop()
    up = {labels["uuid"]: v for labels, v in m["gpu_up"]}
    assert up.pop(lost) == 0.0
    assert set(up.values()) == {1.0} and len(up) == 3
    assert [(labels["xid"], v) for labels, v in _of(m["gpu_xid_errors_total"], lost)
            if labels["xid"] == "79"] == [("79", 1.0)]
    (owner, _), = _of(m["gpu_owner_info"], lost)
    assert (owner["user"], owner["job"]) == ("ivan", "5150")
    doc = json.loads((tmp_path / "spool-xid" / "inventory" / "gpus.json").read_text())
    recorded = {g["uuid"]: g for g in doc["gpus"]}
    assert doc["source"] == "sim:xid"
    assert (recorded[lost]["up"], recorded[lost]["error"]) == (False, "missing")
    assert recorded[lost]["xid_totals"]["79"] == 1
