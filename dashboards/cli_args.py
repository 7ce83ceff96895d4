"""The `gpu-audit dashboards push` arguments and entry point, kept apart from push.py so
building the command line imports neither grafana-client nor the dashboards' builders."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dashboards.defaults import DEFAULT_FOLDER, DEFAULT_FOLDER_UID
from gpu_audit.errors import EXIT_FAILURE, EXIT_OK, EXIT_USAGE


def add_push_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--grafana", metavar="URL", help="Grafana base URL.")
    p.add_argument("--grafana-folder", default=DEFAULT_FOLDER, metavar="TITLE",
                   help=f"Folder title (default {DEFAULT_FOLDER}).")
    p.add_argument("--grafana-folder-uid", default=DEFAULT_FOLDER_UID, metavar="UID",
                   help=f"Folder uid, created when missing (default {DEFAULT_FOLDER_UID}).")
    p.add_argument("--grafana-token-file", type=Path, metavar="FILE",
                   help="Service-account token (else GRAFANA_TOKEN).")
    p.add_argument("--grafana-password-file", type=Path, metavar="FILE",
                   help="Password for GRAFANA_USER (else GRAFANA_PASSWORD).")
    p.add_argument("--kibana", metavar="URL", help="Kibana base URL.")
    p.add_argument("--kibana-space", metavar="SPACE", help="Kibana space (default space).")
    p.add_argument("--kibana-api-key-file", type=Path, metavar="FILE",
                   help="Encoded API key (else KIBANA_API_KEY).")
    p.add_argument("--kibana-password-file", type=Path, metavar="FILE",
                   help="Password for KIBANA_USER (else KIBANA_PASSWORD).")


def push_command(args: argparse.Namespace) -> int:
    if not args.grafana and not args.kibana:
        print("gpu-audit dashboards push: give --grafana URL and/or --kibana URL",
              file=sys.stderr)
        return EXIT_USAGE
    try:
        from dashboards import push
    except ImportError as exc:
        print(f"gpu-audit dashboards push: {exc.name} is not installed: "
              "pip install 'gpu-audit[dashboards]'", file=sys.stderr)
        return EXIT_USAGE
    try:
        for line in push.run(args):
            print(line)
    except push.PushError as exc:
        print(f"gpu-audit dashboards push: {exc}", file=sys.stderr)
        return EXIT_FAILURE
    return EXIT_OK
