"""Transitional: `gpu_audit_app.chargeback_main.readers` for `gpu-audit capacity`
(gpu_audit_app/capacity_main.py imports it from here) until the capacity modules move
into their own package and import gpu_audit_app.chargeback.main directly; then this
module goes. It must never hold code of its own."""

from gpu_audit_app.chargeback.main import readers

__all__ = ["readers"]
