"""Behaviour of the Prometheus renderer: content, identity keying, caps, escaping."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from exporter.exposition.compat import (
    CAMEL_CASE_COMPLAINT,
    COMPAT_NAMES,
    COUNTER_IN_NAME_COMPLAINT,
    promtool_complaints,
)
from exporter.exposition.render import Renderer, RenderOptions, render_snapshot
from exporter.exposition.textformat import fmt_value
from gpu_audit.model.attribution import UNKNOWN, AttributedProcess, Attribution
from gpu_audit.model.snapshot import Snapshot
from tests.exporter.exposition.goldens import check_golden, promtool_check
from tests.exporter.exposition.snapshots import GIB, UUID0, UUID1, alice, proc, small_snapshot


def samples(body: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def named(body: bytes, name: str) -> list[tuple[dict[str, str], float]]:
    return [(dict(k[1]), v) for k, v in samples(body).items() if k[0] == name]


@pytest.mark.parametrize(("golden", "opts"), [
    ("small.prom", RenderOptions()),
    ("small_compat.prom", RenderOptions(dcgm_compat=True)),
])
def test_golden_exposition(golden: str, opts: RenderOptions) -> None:
    """The exposition of the hand-built snapshot matches the checked-in golden file."""
    check_golden(golden, render_snapshot(small_snapshot(), opts, now=0.0).body)


def compat_families(body: bytes) -> dict[str, set[str]]:
    """name -> label names of every dcgm-exporter compat family in an exposition."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(body.decode()):
        if family.name in COMPAT_NAMES:
            for s in family.samples:
                out.setdefault(family.name, set()).update(s.labels)
    return out


def assert_promtool_verdict(body: bytes) -> None:
    """Native names: promtool is silent. Compat names: exactly the complaints the profile
    documents (camelCase modelName on every compat family, the _COUNTER name), nothing
    else."""
    rc, out = promtool_check(body)
    expected = promtool_complaints(compat_families(body))
    assert set(out.strip().splitlines()) - {""} == expected
    assert rc == (3 if expected else 0)  # 3: promtool found lint problems


@pytest.mark.parametrize("opts", [RenderOptions(), RenderOptions(pid_label=True)])
def test_promtool_accepts_native_exposition(opts: RenderOptions) -> None:
    """promtool check metrics passes with no output on the native names."""
    rc, out = promtool_check(render_snapshot(small_snapshot(), opts).body)
    assert (rc, out) == (0, "")


@pytest.mark.parametrize("opts", [RenderOptions(dcgm_compat=True),
                                  RenderOptions(pid_label=True, dcgm_compat=True)])
def test_compat_promtool_complaints_are_exactly_the_documented_ones(opts: RenderOptions) -> None:
    """The compat profile emits dcgm-exporter's modelName label and PCIE_REPLAY_COUNTER
    name by default; promtool's complaints are exactly those, one kind per family."""
    body = render_snapshot(small_snapshot(), opts).body
    assert 'modelName="NVIDIA A100-SXM4-80GB"' in body.decode()
    assert b"DCGM_FI_DEV_PCIE_REPLAY_COUNTER{" in body
    rc, out = promtool_check(body)
    kinds = {line.split(" ", 1)[1] for line in out.strip().splitlines()}
    assert rc == 3 and kinds == {CAMEL_CASE_COMPLAINT, COUNTER_IN_NAME_COMPLAINT}
    assert_promtool_verdict(body)


def test_compat_promtool_clean_option_is_strictly_clean() -> None:
    """With promtool_clean the two rejected artefacts are left out and promtool is silent."""
    opts = RenderOptions(dcgm_compat=True, dcgm_promtool_clean=True)
    body = render_snapshot(small_snapshot(), opts).body
    assert b"modelName" not in body and b"PCIE_REPLAY_COUNTER" not in body
    assert b"DCGM_FI_DEV_GPU_UTIL{" in body
    assert promtool_check(body) == (0, "")


def test_down_gpu_and_unsupported_fields() -> None:
    """A down GPU gets gpu_up 0, gpu_info and its XID counter but no field values; an
    unsupported field is never emitted and shows 0 in gpu_field_supported."""
    body = render_snapshot(small_snapshot(), RenderOptions()).body
    s = samples(body)
    sim = ("simulated", "true")  # the snapshot is simulated: every GPU series says so
    assert s[("gpu_up", (("gpu", "1"), sim, ("uuid", UUID1)))] == 0
    assert s[("gpu_up", (("gpu", "0"), sim, ("uuid", UUID0)))] == 1
    assert not any(lbl.get("uuid") == UUID1 for lbl, _ in named(body, "gpu_utilization_ratio"))
    assert named(body, "gpu_xid_errors_total") == [
        ({"gpu": "0", "uuid": UUID0, "simulated": "true", "xid": "13"}, 2.0),
        ({"gpu": "1", "uuid": UUID1, "simulated": "true", "xid": "79"}, 1.0)]
    assert b"gpu_fan_speed_ratio{" not in body
    assert b"# HELP gpu_fan_speed_ratio" not in body  # no empty families
    fs = {lbl["field"]: v for lbl, v in named(body, "gpu_field_supported")}
    assert fs["gpu_fan_speed_ratio"] == 0 and fs["gpu_utilization_ratio"] == 1
    assert not any(lbl["uuid"] == UUID1 for lbl, _ in named(body, "gpu_field_supported"))
    info = named(body, "gpu_info")
    assert {lbl["simulated"] for lbl, _ in info} == {"true"}


def test_processes_keyed_by_identity_and_summed() -> None:
    """Two processes of one identity become one series: memory summed, utilisation summed
    and capped at 1, count 2; no pid label by default."""
    snap = small_snapshot()
    extra = AttributedProcess(UUID0, proc(103, GIB, 0.6), alice())
    snap = dataclasses.replace(snap, processes={UUID0: (*snap.processes[UUID0], extra)})
    body = render_snapshot(snap, RenderOptions()).body
    mem = {lbl["user"]: v for lbl, v in named(body, "gpu_process_memory_used_bytes")}
    assert mem["alice"] == 17 * GIB
    sm = {lbl["user"]: v for lbl, v in named(body, "gpu_process_sm_utilization_ratio")}
    assert sm["alice"] == 1.0  # 0.4 + 0.3 + 0.6 capped
    count = {lbl["user"]: v for lbl, v in named(body, "gpu_processes")}
    assert count["alice"] == 3
    assert b"pid=" not in body


def test_pid_label_is_opt_in() -> None:
    """With pid_label every process is its own series carrying its pid."""
    body = render_snapshot(small_snapshot(), RenderOptions(pid_label=True)).body
    pids = sorted(lbl["pid"] for lbl, _ in named(body, "gpu_process_memory_used_bytes"))
    assert pids == ["101", "102", "201", "301"]


def test_vanished_process_series_are_not_rendered() -> None:
    """A process gone from the next snapshot leaves no series behind."""
    r = Renderer(RenderOptions())
    first = r.render(small_snapshot()).body
    assert b'user="bob"' in first
    snap = small_snapshot()
    gone = tuple(ap for ap in snap.processes[UUID0] if ap.attribution.user != "bob")
    second = r.render(dataclasses.replace(snap, processes={UUID0: gone})).body
    assert b'user="bob"' not in second


def test_series_cap_keeps_biggest_and_counts_the_rest() -> None:
    """Above the cap the biggest label sets by memory stay; the rest are counted per GPU."""
    snap = small_snapshot()
    procs = tuple(AttributedProcess(UUID0, proc(1000 + i, (i + 1) * GIB),
                                    Attribution(user=f"u{i}", sources={"user": "owner"}))
                  for i in range(10))
    snap = dataclasses.replace(snap, processes={UUID0: procs})
    r = render_snapshot(snap, RenderOptions(max_process_series_per_gpu=3))
    users = sorted(lbl["user"] for lbl, _ in named(r.body, "gpu_process_memory_used_bytes"))
    assert users == ["u7", "u8", "u9"]
    assert dict(r.dropped_process_series) == {UUID0: 7}
    assert render_snapshot(snap, RenderOptions()).dropped_process_series == {}


def test_unattributed_math() -> None:
    """Unattributed memory = used - attributed process memory; utilisation likewise;
    the unknown process (Xorg) counts as unattributed."""
    body = render_snapshot(small_snapshot(), RenderOptions()).body
    (_, mem), = named(body, "gpu_unattributed_memory_bytes")
    assert mem == (30 - 20) * GIB
    (_, util), = named(body, "gpu_unattributed_utilization_ratio")
    assert util == pytest.approx(0.9 - 0.8)


def test_unattributed_floors_at_zero() -> None:
    """When attributed processes report more than the GPU, unattributed is 0, not negative."""
    snap = small_snapshot()
    big = (AttributedProcess(UUID0, proc(1, 100 * GIB, 0.99), alice()),)
    body = render_snapshot(dataclasses.replace(snap, processes={UUID0: big}),
                           RenderOptions()).body
    assert named(body, "gpu_unattributed_memory_bytes")[0][1] == 0
    assert named(body, "gpu_unattributed_utilization_ratio")[0][1] == 0


def test_allocation_view_one_series_per_job_with_source() -> None:
    """gpu_allocation_info has one series per (GPU, job identity), naming the source of the
    job (else of the user); unattributed processes have none."""
    body = render_snapshot(small_snapshot(), RenderOptions()).body
    alloc = named(body, "gpu_allocation_info")
    assert sorted((lbl["user"], lbl["job"], lbl["source"]) for lbl, _ in alloc) == [
        ("alice", "42", "jobmap"), ("bob", "", "owner")]


def test_nan_and_inf_never_emitted() -> None:
    """NaN/Inf values are treated as not measured: dropped, never printed."""
    snap = small_snapshot()
    g0 = snap.gpus[0]
    values = dict(g0.values)
    values["temperature_gpu"] = {(): math.nan}
    values["power_usage"] = {(): math.inf}
    values["utilization_gpu"] = {(): -math.inf}
    procs = (AttributedProcess(UUID0, proc(5, None, math.nan), alice()),)
    snap = dataclasses.replace(snap, gpus=(dataclasses.replace(g0, values=values),
                                           snap.gpus[1]), processes={UUID0: procs},
                               sample_duration_seconds=math.nan)
    body = render_snapshot(snap, RenderOptions(dcgm_compat=True)).body.decode()
    values_text = [ln.rsplit(" ", 1)[1] for ln in body.splitlines() if not ln.startswith("#")]
    assert all(math.isfinite(float(v)) for v in values_text)
    assert not {"NaN", "+Inf", "-Inf"} & set(values_text)
    assert "gpu_temperature_celsius{" not in body
    assert_promtool_verdict(body.encode())


def test_value_formatting() -> None:
    """Integers print without exponent noise; fractions round-trip; NaN/Inf give None."""
    assert fmt_value(85899345920.0) == "85899345920"
    assert fmt_value(3) == "3"
    assert fmt_value(True) == "1"
    assert fmt_value(0.1) == "0.1"
    assert float(fmt_value(1e20) or "x") == 1e20
    assert fmt_value(math.nan) is None and fmt_value(-math.inf) is None


label_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
# Control characters drawn often (NUL, ESC, TAB, CR, DEL, C1's CSI) mixed with any text.
control_text = st.text(
    st.sampled_from(["\x00", "\x1b", "\t", "\r", "\x7f", "\x9b", "\n"])
    | st.characters(blacklist_categories=("Cs",)), max_size=30)


def readable(value: str) -> str:
    """What a label value should read as after rendering: every control character but
    the newline (which the format escapes) replaced with U+FFFD."""
    return "".join("\ufffd" if (ord(c) < 0x20 and c != "\n") or 0x7F <= ord(c) <= 0x9F
                   else c for c in value)


@settings(max_examples=150, deadline=None)
@given(user=label_text, name=label_text, host=label_text)
def test_label_escaping_round_trips(user: str, name: str, host: str) -> None:
    """Any label value (quotes, backslashes, newlines, unicode) parses back unchanged,
    control characters replaced."""
    snap = small_snapshot()
    procs = (AttributedProcess(UUID0, proc(7, 3 * GIB, name=name),
                               Attribution(user=user, sources={"user": "environ"})),)
    snap = dataclasses.replace(snap, processes={UUID0: procs}, host=host)
    body = render_snapshot(snap, RenderOptions(dcgm_compat=True)).body
    (lbl, value), = named(body, "gpu_process_memory_used_bytes")
    assert (lbl["user"], lbl["process_name"], value) == (readable(user), readable(name),
                                                         3 * GIB)
    hosts = {lbl["Hostname"] for lbl, _ in named(body, "DCGM_FI_DEV_GPU_UTIL")}
    assert hosts == {readable(host)}


@settings(max_examples=200, deadline=None)
@given(user=control_text, name=control_text, host=control_text,
       compat=st.booleans())
def test_no_control_character_reaches_the_exposition(user: str, name: str, host: str,
                                                     compat: bool) -> None:
    """NUL, ESC, DEL, C1 and every other control character from a process name, a user
    or the host never reach the exposition: each line is printable text."""
    snap = small_snapshot()
    procs = (AttributedProcess(UUID0, proc(7, 3 * GIB, name=name),
                               Attribution(user=user, sources={"user": "environ"})),)
    snap = dataclasses.replace(snap, processes={UUID0: procs}, host=host)
    body = render_snapshot(snap, RenderOptions(dcgm_compat=compat)).body
    for line in body.decode("utf-8").split("\n"):
        assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in line), repr(line)
    (lbl, _), = named(body, "gpu_process_memory_used_bytes")
    assert lbl["process_name"] == readable(name)


def test_nul_and_escape_in_a_process_name_are_replaced() -> None:
    """The issue's case: a process named with a NUL and an ANSI escape renders as
    U+FFFD in their place, and promtool accepts the exposition."""
    snap = small_snapshot()
    procs = (AttributedProcess(UUID0, proc(7, GIB, name="evil\x00\x1b[31mred"), UNKNOWN),)
    body = render_snapshot(dataclasses.replace(snap, processes={UUID0: procs}),
                           RenderOptions()).body
    assert b"\x00" not in body and b"\x1b" not in body
    assert 'process_name="evil\ufffd\ufffd[31mred"'.encode() in body
    assert promtool_check(body)[0] == 0


def test_invalid_unicode_label_still_gives_utf8() -> None:
    """A surrogate-escaped value (undecodable /proc bytes) is replaced, not a crash."""
    snap = small_snapshot()
    procs = (AttributedProcess(UUID0, proc(7, GIB, name="bad\udcff"), UNKNOWN),)
    body = render_snapshot(dataclasses.replace(snap, processes={UUID0: procs}),
                           RenderOptions()).body
    body.decode("utf-8")
    assert b'process_name="bad?"' in body


def test_series_count_matches_samples() -> None:
    """gpu_audit_series equals the number of samples in the body (itself included)."""
    r = render_snapshot(small_snapshot(), RenderOptions(dcgm_compat=True))
    assert r.series == len(samples(r.body))
    assert samples(r.body)[("gpu_audit_series", ())] == r.series


def test_compat_values_scaled_and_last_xid_remembered() -> None:
    """Compat names carry dcgm-exporter units; the last XID code survives later cycles
    whose snapshots carry no new XID events."""
    r = Renderer(RenderOptions(dcgm_compat=True))
    body = r.render(small_snapshot()).body
    s = {k[0]: v for k, v in samples(body).items()
         if k[0].startswith("DCGM") and ("gpu", "0") in k[1]}
    assert s["DCGM_FI_DEV_GPU_UTIL"] == 90
    assert s["DCGM_FI_DEV_FB_USED"] == 10 * 1024  # GPU 0 is in MIG mode: per instance
    assert s["DCGM_FI_DEV_SM_CLOCK"] == 1410
    assert s["DCGM_FI_DEV_XID_ERRORS"] == 13
    later = small_snapshot()
    g0 = dataclasses.replace(later.gpus[0], new_xids=(), xid_totals={13: 2, 31: 1})
    body2 = r.render(dataclasses.replace(later, gpus=(g0, later.gpus[1]))).body
    assert named(body2, "DCGM_FI_DEV_XID_ERRORS")[0][1] == 13


def _sim_snapshots(name: str) -> list[Snapshot]:
    from exporter.sim.backend import SimBackend
    from exporter.sim.scenario import load_scenario

    t0 = 1_800_000_000.0
    backend = SimBackend(load_scenario(name), time_scale=60.0, clock=lambda: t0)
    info = backend.open()
    snaps = []
    for cycle in range(6):
        now = t0 + cycle * 30.0
        gpus = tuple(backend.sample(now, slow=cycle % 3 == 0))
        procs = {}
        for g in gpus:
            aps = []
            for p in g.processes:
                env = p.identity.environ if p.identity else {}
                att = Attribution(user=env.get("USER", ""), project=env.get("PROJECT_NAME", ""),
                                  job=env.get("JOB_ID", ""),
                                  sources={k: "environ" for k, e in (("user", "USER"),
                                           ("project", "PROJECT_NAME"), ("job", "JOB_ID"))
                                           if env.get(e)})
                aps.append(AttributedProcess(g.uuid, p, att))
            procs[g.uuid] = tuple(aps)
        snaps.append(Snapshot(timestamp=now, host="sim-node", backend=info, gpus=gpus,
                              processes=procs, interval_seconds=5.0, cycle=cycle,
                              error_counts=dict(backend.error_counts())))
    return snaps


def _shipped() -> tuple[str, ...]:
    try:
        from exporter.sim.scenario import SHIPPED
    except ImportError:  # the simulator is written by another helper in parallel
        return ("busy", "idle", "leak", "hot", "xid", "mig", "large")
    return SHIPPED


@pytest.mark.parametrize("scenario", _shipped())
@pytest.mark.parametrize("compat", [False, True], ids=["canonical", "dcgm_compat"])
def test_promtool_accepts_every_shipped_scenario(scenario: str, compat: bool) -> None:
    """Every shipped scenario renders to an exposition promtool accepts without output
    on the native names, and with exactly the documented complaints in compat mode."""
    renderer = Renderer(RenderOptions(dcgm_compat=compat))
    for snap in _sim_snapshots(scenario):
        body = renderer.render(snap).body
        if compat:
            assert_promtool_verdict(body)
        else:
            assert promtool_check(body) == (0, ""), scenario
        assert b"simulated=\"true\"" in body


def test_docs_match_generated() -> None:
    """docs/METRICS.md is exactly what `python -m exporter.exposition.docs` generates."""
    from exporter.exposition.docs import DEFAULT_PATH, generate

    assert DEFAULT_PATH.read_text(encoding="utf-8") == generate(), \
        "docs/METRICS.md is stale: run python -m exporter.exposition.docs"


def test_docs_name_every_family() -> None:
    """Every catalogue metric and fixed family appears in the generated reference."""
    from exporter.exposition.docs import generate
    from exporter.exposition.families import FAMILIES
    from gpu_audit.model.fields import CATALOGUE

    text = generate()
    for name in [m.name for m in CATALOGUE] + [f.name for f in FAMILIES]:
        assert f"`{name}`" in text


def test_docs_check_cli_fails_on_stale_file(tmp_path: Path) -> None:
    """`python -m exporter.exposition.docs --check`: exit 1 on a stale file, 0 once regenerated."""
    from exporter.exposition.docs import main

    target = tmp_path / "METRICS.md"
    target.write_text("stale\n", encoding="utf-8")
    assert main(["--check", "--path", str(target)]) == 1
    assert main(["--path", str(target)]) == 0
    assert main(["--check", "--path", str(target)]) == 0
