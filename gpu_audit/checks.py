"""`gpu-audit check-config`: everything that can be checked without starting anything.

The YAML itself is validated when it is loaded; this adds the files it points to (web
config, scenario, HMAC key) and the shipper's sinks (secrets present, URLs well-formed),
and reports every problem found, across all of them, in one ConfigError.
"""

from __future__ import annotations

import os

from gpu_audit.config import Config
from gpu_audit.errors import ConfigError


def check_all(config: Config) -> None:
    """Raise ConfigError listing every problem; return quietly when all is well."""
    problems: list[str] = []
    ex = config.exporter
    if ex.web_config_file is not None:
        from exporter.webconfig import load_web_config

        try:
            load_web_config(ex.web_config_file)
        except ConfigError as exc:
            problems += [f"exporter.web_config_file {exc.source}: {p}" for p in exc.problems]
    if ex.backend == "sim":
        if not ex.scenario:
            problems.append("exporter.scenario: the sim backend needs a scenario "
                            "(a shipped name such as busy, or a file)")
        else:
            from exporter.sim.scenario import load_scenario

            try:
                load_scenario(ex.scenario)
            except ConfigError as exc:
                problems += [f"exporter.scenario {exc.source}: {p}" for p in exc.problems]
    key_file = config.audit.hmac_key_file
    if key_file is not None and not os.access(key_file, os.R_OK):
        problems.append(f"audit.hmac_key_file: {key_file} is not a readable file")
    problems += spool_path_problems(config)
    if config.shipper.enabled:
        from shipper.check import check_shipper

        problems += check_shipper(config.shipper, config.spool)
    if problems:
        raise ConfigError("configuration", problems)


def spool_path_problems(config: Config) -> list[str]:
    """The spool directory exists as a directory or can be created, on a disk."""
    from gpu_audit.paths import directory_problems

    return directory_problems("spool.directory", config.spool.directory)
