"""`gpu-audit rules render --params FILE --out DIR`: write the rule files of a params file.

The arguments and the command only; the app layer's parser owns the entry point (there is
no `python -m alerts`: one command line, one place)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from alerts.params import load_params
from alerts.render import write_rules
from gpu_audit.errors import EXIT_OK, EXIT_USAGE, ConfigError


def add_render_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--params", type=Path, required=True, metavar="FILE",
                   help="Params file (alerts/params/production.yaml, fast.yaml or a copy).")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="Directory for recording.yaml and alerts.yaml (created if needed).")


def render_command(args: argparse.Namespace) -> int:
    try:
        params = load_params(args.params)
    except ConfigError as exc:
        print(f"gpu-audit rules render: {exc.render()}", file=sys.stderr)
        return EXIT_USAGE
    for path in write_rules(params, args.params.name, args.out):
        print(path)
    return EXIT_OK

