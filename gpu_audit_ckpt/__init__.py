"""Job-side checkpoint helper for training scripts (standard library only).

Imported inside a user's training environment; it must never import gpu_audit or any
other part of gpu-audit, nor any third-party package except numpy/torch when present.
"""
