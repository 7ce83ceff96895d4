"""The README's "Demo: the first ten minutes", run as written.

The test reads every block marked `<!-- demo:step NAME -->` from README.md and feeds
them, in order, to ONE bash session (`-euo pipefail`) started at the repository root,
as a reader pastes them into one shell: the README's text, not a copy. Between steps it
checks what the step did. The only things it sets are the environment variables the
demo's first block documents (GPU_AUDIT_DEMO_DIR and the four addresses), so the demo
writes into the test's temp dir and listens on free loopback ports.

Checked: the start step leaves two `gpu-audit run`, Prometheus and Alertmanager
running; the alerts step ends with GpuHeldIdle (dave, GPU 1) and GpuMemoryLeak (frank,
GPU 0) active in Alertmanager (amtool's output and the API); the chargeback step writes a
bill with rows for the idle node's users and its replay says byte-identical; the stop
step leaves none of the demo's processes alive and the shell exits 0. Whatever happens,
the shell's process group (the demo's background jobs are in it: a non-interactive shell
has no job control) is stopped before the test ends.

Screenshots (headless Chromium): Prometheus' alerts page with the demo's alerts firing
and the demo's chargeback report, into the temp dir always, and into docs/img/ when
GPU_AUDIT_UPDATE_SCREENSHOTS=1 (then commit them). A blank page fails the test.
"""

from __future__ import annotations

import csv
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import chromium
from tests.netutil import free_port, http_get
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["setup", "start", "alerts", "chargeback", "stop"]
ALERTS_DEADLINE_S = 150  # both alerts need about a minute of wall time at 60x
STEP_TIMEOUT_S = 120
UPDATE = os.environ.get("GPU_AUDIT_UPDATE_SCREENSHOTS") == "1"

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def demo_steps(text: str) -> list[tuple[str, str]]:
    """(name, script) of every marked block of the demo section, in README order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(
        r"<!-- demo:step (\S+) -->\n```sh\n(.*?)```", text, re.S)]


def test_demo_blocks_are_marked() -> None:
    """The demo section has exactly the marked steps the test runs, and no unmarked
    shell block a reader would run but the test would not."""
    text = (ROOT / "README.md").read_text()
    assert "## Demo: the first ten minutes" in text
    section = text.split("## Demo: the first ten minutes", 1)[1].split("\n## ", 1)[0]
    assert [name for name, _ in demo_steps(section)] == STEPS
    assert section.count("```sh") == len(STEPS)


def test_quick_start_is_still_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    first = re.search(r"```sh\n(.*?)```", section, re.S)
    assert first is not None
    commands = [line.split(" #", 1)[0].strip() for line in first.group(1).splitlines()]
    assert [c for c in commands if c] == ["make run", "make test"]


def _alive(pid: int) -> bool:
    """Running (a zombie counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _group(pgid: int) -> list[int]:
    """Live processes of process group `pgid`."""
    members = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":
                members.append(int(entry.name))
    return members


class Shell:
    """One bash session reading the demo's steps from a pipe, as a terminal would."""

    def __init__(self, env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(["bash", "-euo", "pipefail"], cwd=ROOT, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.decode(errors="replace"))
        self.lines.put(None)

    def step(self, name: str, script: str, timeout: float, logs: Callable[[], str]) -> str:
        """Run one step; its output, or fail naming the step with the demo's logs."""
        assert self.proc.stdin is not None
        token = f"--- demo step {name} done {uuid.uuid4().hex}"
        self.proc.stdin.write(f"{script}\necho '{token}'\n".encode())
        self.proc.stdin.flush()
        out: list[str] = []
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"README demo step {name!r} ran over {timeout} s:\n"
                                     f"{''.join(out)[-3000:]}\n{logs()}") from None
            if line is None:
                rc = self.proc.wait(10)
                raise AssertionError(f"README demo step {name!r} failed: the shell exited "
                                     f"{rc}:\n{''.join(out)[-3000:]}\n{logs()}")
            if line.rstrip("\n") == token:
                return "".join(out)
            out.append(line)

    def close(self) -> int:
        """End the session (EOF on its input): its exit status."""
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return self.proc.wait(30)

    def kill(self) -> None:
        """SIGTERM the session's process group, SIGKILL what is left after 20 s."""
        pgid = self.proc.pid
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            deadline = time.monotonic() + 20
            while _group(pgid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if not _group(pgid):
                break
        if self.proc.poll() is None:
            self.proc.wait(10)


class Demo:
    def __init__(self, tmp: Path) -> None:
        self.dir = tmp / "demo"
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GPU_AUDIT__", "GPU_AUDIT_DEMO_"))}
        env.update({
            "GPU_AUDIT_DEMO_DIR": str(self.dir),
            "GPU_AUDIT_DEMO_PROMETHEUS": f"127.0.0.1:{free_port()}",
            "GPU_AUDIT_DEMO_ALERTMANAGER": f"127.0.0.1:{free_port()}",
            "GPU_AUDIT_DEMO_IDLE_NODE": f"127.0.0.1:{free_port()}",
            "GPU_AUDIT_DEMO_LEAK_NODE": f"127.0.0.1:{free_port()}",
        })
        self.env = env
        self.steps = dict(demo_steps((ROOT / "README.md").read_text()))
        self.shell = Shell(env)

    def url(self, which: str) -> str:
        return "http://" + self.env[f"GPU_AUDIT_DEMO_{which}"]

    def run(self, name: str, timeout: float = STEP_TIMEOUT_S) -> str:
        return self.shell.step(name, self.steps[name], timeout, self.logs)

    def started(self) -> list[int]:
        """The demo's live processes (the shell itself left out)."""
        return [p for p in _group(self.shell.proc.pid) if p != self.shell.proc.pid]

    def logs(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text(errors='replace')[-1500:]}"
                         for log in sorted(self.dir.glob("*.log")))


@pytest.fixture
def demo(tmp_path: Path) -> Iterator[Demo]:
    for binary in ("prometheus", "prometheus-alertmanager", "amtool"):
        if shutil.which(binary) is None:
            pytest.skip(f"{binary} not installed (scripts/setup --test installs it)")
    if not (ROOT / ".venv/bin/gpu-audit").exists():
        pytest.skip("no .venv/bin/gpu-audit: the demo runs after `make run`'s setup")
    d = Demo(tmp_path)
    try:
        yield d
    finally:
        d.shell.kill()


def _not_blank(png: Path) -> None:
    _, _, rows = chromium.png_pixels(png)
    values = [b for row in rows[::8] for b in row[::24]]
    mean = sum(values) / len(values)
    variance = sum((v - mean) ** 2 for v in values) / len(values)
    assert variance > 100, f"{png} looks blank (pixel variance {variance:.0f})"


def _keep(png: Path, name: str) -> None:
    _not_blank(png)
    if UPDATE:
        shutil.copyfile(png, ROOT / "docs/img" / name)


def test_readme_demo(demo: Demo, tmp_path: Path) -> None:
    demo.run("setup")
    demo.run("start")
    wait_for(lambda: len(demo.started()) == 4, 30,
             "two gpu-audit run, prometheus and alertmanager running")
    wait_for(lambda: http_get(demo.url("PROMETHEUS") + "/-/ready")[0] == 200, 60,
             "the demo's Prometheus ready")

    out = demo.run("alerts", timeout=ALERTS_DEADLINE_S)
    assert "GpuHeldIdle" in out and "GpuMemoryLeak" in out, out
    status, body = http_get(demo.url("ALERTMANAGER") + "/api/v2/alerts?active=true")
    assert status == 200, body
    firing = {(a["labels"]["alertname"], a["labels"].get("user"), a["labels"].get("gpu"))
              for a in json.loads(body)}
    assert ("GpuHeldIdle", "dave", "1") in firing, firing
    assert ("GpuMemoryLeak", "frank", "0") in firing, firing

    # Prometheus' alerts page (Debian's package serves the classic UI)
    alerts_png = tmp_path / "prometheus-alerts.png"
    chromium.screenshot_url(demo.url("PROMETHEUS") + "/classic/alerts", alerts_png,
                            width=1200, height=1650)
    # firing rules are drawn in Bootstrap's danger fill: three of them (~55k px a row)
    firing_fill = chromium.count_colors(alerts_png, ["#f8d7da"])["#f8d7da"]
    assert firing_fill > 100_000, f"the alerts page shows no firing rules ({firing_fill} px)"
    _keep(alerts_png, "prometheus-alerts.png")

    out = demo.run("chargeback")
    assert "byte-identical" in out, out
    assert len(demo.started()) == 2, "the nodes stopped, Prometheus and Alertmanager not"
    bill = demo.dir / "bill"
    with (bill / "chargeback.csv").open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert rows, "the bill has no rows"
    assert {"dave", "erin"} <= {v for row in rows for v in row.values()}, rows[:5]
    report_png = tmp_path / "demo-chargeback-report.png"
    chromium.screenshot(bill / "report.html", report_png, width=1000, height=1400)
    _keep(report_png, "demo-chargeback-report.png")

    demo.run("stop")
    assert demo.started() == [], "processes left after the stop step"
    assert demo.shell.close() == 0
