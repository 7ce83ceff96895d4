"""Where the exporter's RSS goes at start-up, and what config validation costs.

1. The exporter process's imports, one step at a time, in a fresh interpreter of an
   installed (non-editable) gpu-audit: RSS added by each (the stdlib HTTP/TLS stack that
   prometheus_client pulls in, prometheus_client, PyYAML, orjson, pydantic, the config
   models, the audit producer, the exporter, the NVML binding).
2. Validation libraries on the same synthetic configuration (35 frozen models of 12
   fields with unknown keys refused, each validated once, the size of gpu-audit's
   configuration): pydantic against msgspec, each in a fresh interpreter, RSS and how
   many of an input's three problems each names in one validation (gpu-audit reports
   every problem of a configuration at once); msgspec is installed into its own venv
   (.bench-cache/msgspec-venv), never into the project.

    .venv/bin/python bench/bench_import_rss.py [--venv .bench-cache/gpu-audit-venv-branch]
        [--json bench/results/import_rss.json]

The default --venv is the one bench_peer.py installs the checkout into.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peerlib import CACHE

STEPS = ["http.server", "prometheus_client", "yaml", "orjson", "pydantic", "pydantic.main",
         "gpu_audit.config_section", "gpu_audit.audit", "shipper.config",
         "gpu_audit_app.config", "exporter.app", "gpu_audit_app.run", "pynvml",
         "exporter.backends.nvml"]

STEP_PROGRAM = """
import importlib, json, re, sys
def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
out = [("interpreter", rss())]
prev = out[0][1]
for m in sys.argv[1:]:
    importlib.import_module(m)
    now = rss()
    out.append((m, now - prev))
    prev = now
print(json.dumps(out))
"""

VALIDATION_PROGRAM = """
import json, re, sys
def rss():
    return int(re.search(r"VmRSS:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
lib = sys.argv[1]
r0 = rss()
# BAD has three problems: two wrong types and an unknown key
BAD = {"f0": "x", "f5": [1], "f_unknown": 1}
if lib == "pydantic":
    import pydantic
    base = "pydantic.BaseModel, frozen=True, extra='forbid'"
    check = lambda c: c.model_validate({"f0": 1})
    def named(c):
        try:
            c.model_validate(BAD)
        except pydantic.ValidationError as exc:
            return [e["msg"] for e in exc.errors()]
        return []
else:
    import msgspec
    base = "msgspec.Struct, frozen=True, forbid_unknown_fields=True"
    check = lambda c: msgspec.convert({"f0": 1}, c)
    def named(c):
        try:
            msgspec.convert(BAD, c)
        except msgspec.ValidationError as exc:
            return [str(exc)]  # one exception, one message: the first problem met
        return []
r1 = rss()
classes = []
for i in range(35):
    ns = {}
    fields = "\\n".join(f"    f{j}: int = {j}" for j in range(12))
    exec(f"import {lib}\\nclass C{i}({base}):\\n{fields}\\n", ns)
    classes.append(ns[f"C{i}"])
    check(classes[-1])
models_kb = rss() - r1
print(json.dumps({"import_kb": r1 - r0, "models_kb": models_kb, "named": named(classes[0])}))
"""


def msgspec_python() -> Path:
    venv = CACHE / "msgspec-venv"
    py = venv / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "msgspec"], check=True)
    return py


def run(python: Path, program: str, *args: str) -> object:
    out = subprocess.run([str(python), "-c", program, *args], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--venv", type=Path, default=CACHE / "gpu-audit-venv-branch")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    py = args.venv / "bin" / "python"
    steps = run(py, STEP_PROGRAM, *STEPS)
    assert isinstance(steps, list)
    print("| import (in order) | RSS added, kB |")
    print("|---|---|")
    for name, kb in steps:
        print(f"| {name} | {kb:,} |")
    total = sum(kb for _, kb in steps)
    print(f"| total | {total:,} |")
    pyd = run(py, VALIDATION_PROGRAM, "pydantic")
    msg = run(msgspec_python(), VALIDATION_PROGRAM, "msgspec")
    assert isinstance(pyd, dict) and isinstance(msg, dict)
    print("\n| 35 frozen models x 12 fields | import, kB | models, kB | total, kB "
          "| problems named for an input with 3 |")
    print("|---|---|---|---|---|")
    for lib, r in (("pydantic", pyd), ("msgspec", msg)):
        print(f"| {lib} | {r['import_kb']:,} | {r['models_kb']:,} | "
              f"{r['import_kb'] + r['models_kb']:,} | {len(r['named'])}: "
              + "; ".join(r["named"]) + " |")
    if args.json:
        args.json.write_text(json.dumps({"steps": steps, "pydantic": pyd, "msgspec": msg},
                                        indent=2) + "\n")


if __name__ == "__main__":
    main()
