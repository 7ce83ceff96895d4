"""Node-local GPU job launcher: fair priority queue, preemption that checkpoints first,
exact resume, requeue and identity injection. A component: imports core (gpu_audit) only.
"""
