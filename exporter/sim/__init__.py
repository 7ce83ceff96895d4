"""The GPU simulator: scenario files played as a GpuBackend, for demos and tests.

Used only when asked for by name (`--backend sim --scenario NAME|FILE`); everything it
produces is marked simulated. See exporter/sim/README.md for the scenario schema.

This package must never import a vendor GPU library or be used as a silent fallback.
"""
