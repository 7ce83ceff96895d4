"""The composition root: the only code that stands above several components.

It assembles the root configuration from each component's section (`config.py`), runs
the `gpu-audit` command line (`cli.py`, `python -m gpu_audit_app`), checks the whole
configuration (`check_config.py`), wires the exporter and the shipper into one process
for `gpu-audit run` (`run.py`), and runs each component alone (`gpu-audit exporter`,
`gpu-audit shipper`). A command group's wiring has a folder of its own (`audit/`,
`chargeback/`, `slurm/`): arguments, files and output, the domain logic staying in its
component. Components never import
it; import-linter's contracts in pyproject.toml enforce that (docs/ARCHITECTURE.md).
"""
