"""The lab: worlds made rather than met (simulated regions, schedulers and faults), for
trying sco's real control plane on them."""
