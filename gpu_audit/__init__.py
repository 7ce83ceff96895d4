"""gpu-audit: GPU usage auditing for shared clusters."""

__version__ = "0.1.0"
