"""Secrets of the sinks: moved to core (gpu_audit/credentials.py) so that chargeback's
search source reads them the same way; re-exported here for the sinks."""

from gpu_audit.credentials import only_one_of, resolve_secret

__all__ = ["only_one_of", "resolve_secret"]
