"""Attribution: who each GPU process belongs to (user, project, job, container, pod,
Slurm job) and which source said so. See docs/ATTRIBUTION.md.

Import the pieces from their modules (exporter.attribution.resolver.Resolver, ...); this
package init stays empty so that importing the data model pulls in no I/O code.
"""
