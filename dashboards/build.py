"""Build every dashboard and write its JSON into dashboards/grafana/ (committed).

    python -m dashboards.build            # write dashboards/grafana/*.json
    python -m dashboards.build --check    # exit 1 when the committed JSON is stale

tests/dashboards/test_generated.py fails when the committed files differ from what this
builds, so the JSON can never drift from the code.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from grafana_foundation_sdk.builders import dashboard
from grafana_foundation_sdk.cog.encoder import JSONEncoder

from dashboards import fleet, hardware, node, pipeline, users, waste

GRAFANA_DIR = Path(__file__).resolve().parent / "grafana"

BUILDERS: dict[str, Callable[[], dashboard.Dashboard]] = {
    "fleet": fleet.build,
    "node": node.build,
    "users": users.build,
    "waste": waste.build,
    "hardware": hardware.build,
    "pipeline": pipeline.build,
}


def build_all() -> dict[str, dict[str, Any]]:
    """file stem -> dashboard JSON model."""
    out: dict[str, dict[str, Any]] = {}
    for name, build in BUILDERS.items():
        model: dict[str, Any] = json.loads(JSONEncoder(sort_keys=True).encode(build().build()))
        out[name] = model
    return out


def render(model: dict[str, Any]) -> str:
    return json.dumps(model, indent=2, sort_keys=True) + "\n"


def stale_files(directory: Path = GRAFANA_DIR) -> list[str]:
    """The dashboards whose committed JSON differs from what the code builds, and any
    JSON file there that no builder makes."""
    built = {f"{name}.json": render(model) for name, model in build_all().items()}
    problems = [name for name, text in built.items()
                if not (directory / name).is_file() or (directory / name).read_text() != text]
    problems += [p.name for p in sorted(directory.glob("*.json")) if p.name not in built]
    return problems


def write_all(directory: Path = GRAFANA_DIR) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, model in build_all().items():
        path = directory / f"{name}.json"
        path.write_text(render(model))
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.build", description=__doc__)
    parser.add_argument("--check", action="store_true", help="Fail when the JSON is stale.")
    parser.add_argument("--out", type=Path, default=GRAFANA_DIR)
    args = parser.parse_args(argv)
    if args.check:
        stale = stale_files(args.out)
        if stale:
            print("stale dashboard JSON (run python -m dashboards.build): " + ", ".join(stale),
                  file=sys.stderr)
            return 1
        return 0
    for path in write_all(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
