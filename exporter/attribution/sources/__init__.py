"""Attribution sources: each one answers some identity fields of a GPU process.

The resolver asks an ordered list of `AttributionSource`s, the first source that knows a
field winning it (docs/ATTRIBUTION.md). The interface is `base.py`; each source is a
module of its own: `environ.py`, `cgroup.py`, `owner.py` (the process itself),
`kubelet.py` (the kubelet's pod-resources map) and `jobmap.py` (the job-mapping
directory, read by exporter/attribution/jobmap.py). Which name builds which source is
exporter/attribution/registry.py, the one place a source is added (docs/CONTRIBUTING.md
has the recipe). A source must never raise for one process, never block and never
return anything but cleaned, bounded values (base.py says how).
"""
