"""Capacity planning: does the site need more GPUs? (docs/CAPACITY.md)

Pure computation over what chargeback's sources measured (per-bin fleet figures) and
what the queues say (waits): installed / down / allocated / busy / held-idle / free
GPU-hours, percentiles of allocated GPUs, demand that waited, the trend and its
forecast, and the finance sentence. It reads no source and no queue itself: the app
layer (gpu_audit_app.capacity.main) hands it plain values. It never imports launcher.
"""
