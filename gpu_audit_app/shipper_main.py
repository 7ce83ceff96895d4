"""`python -m gpu_audit_app.shipper_main --config FILE`: the standalone shipper without
the rest of the CLI (it was `python -m shipper`, which a component cannot offer: loading
the whole configuration is the app layer's job).

It reads a spool another process writes, delivers to the configured sinks, and stops
cleanly on SIGTERM/SIGINT (exit 0). `gpu-audit shipper` is the user-facing command; this
entry point exists so tests and operators can run the engine alone. It never writes the
spool and never prints a secret (configuration errors name variables and files only).
It reads the configuration exactly as `gpu-audit shipper` does (file, then the
GPU_AUDIT__* environment overrides), through the one loader both use.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gpu_audit.errors import EXIT_USAGE, ConfigError
from gpu_audit.logredact import setup_logging
from gpu_audit_app.config import config_seal_key, load_settings
from shipper.standalone import run_shipper


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_audit_app.shipper_main",
                                     description=__doc__)
    parser.add_argument("--config", type=Path, help="gpu-audit YAML configuration file")
    args = parser.parse_args(argv)
    try:
        config = load_settings(args.config)
        setup_logging(config.log_level)
        return run_shipper(config, seal_key=config_seal_key(config))
    except ConfigError as exc:
        print(exc.render(), file=sys.stderr)
        return EXIT_USAGE


if __name__ == "__main__":
    sys.exit(main())
