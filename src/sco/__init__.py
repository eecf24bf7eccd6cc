"""sco — Spot Capacity Orchestrator."""

__version__ = "0.1.0"
