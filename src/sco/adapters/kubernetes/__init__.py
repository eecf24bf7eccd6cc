"""Kubernetes: partition leases as coordination.k8s.io/v1 Leases (extra `kubernetes`)."""
