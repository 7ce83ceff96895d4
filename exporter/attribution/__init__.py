"""Attribution: who each GPU process belongs to (user, project, job, container, pod,
Slurm job) and which source said so. See docs/ATTRIBUTION.md.

Import the pieces from their modules (exporter.attribution.resolver.Resolver, ...); this
package init stays empty so that importing one pulls in no other. The answers' types
(Attribution, AttributedProcess, the identity fields and source names) are core's data
model: gpu_audit.model.attribution.
"""
