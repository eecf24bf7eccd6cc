"""The fault matrix (bench/faults.py, and its short tier in the tests).

Each scenario injects faults into running services under load and returns one
`FaultResult` per fault: what was lost and how long recovery took. The loss
counts are measured, never assumed: an audit of the fleet state's history
chains, of the cloud against the records, of the events committed against
the topic and history, and of every partition's cycles while another one's
dependency was failing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

LOSSES = (
    "lost_transitions",
    "lost_events",
    "duplicate_creates",
    "leaked_servers",
    "stalled_partitions",
)


@dataclass
class FaultResult:
    """One fault's outcome. `recovery_s`: from the fault's end (the service back) to
    the control plane doing its work again, as the scenario defines it and says in
    `recovered_when`; `details` holds what the scenario measured besides."""

    fault: str
    recovery_s: float
    recovered_when: str
    lost_transitions: int = 0
    lost_events: int = 0
    duplicate_creates: int = 0
    leaked_servers: int = 0
    stalled_partitions: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fault": self.fault}
        out |= {k: getattr(self, k) for k in LOSSES}
        out["recovery_s"] = round(self.recovery_s, 2)
        out["recovered_when"] = self.recovered_when
        out |= self.details
        return out


def total(results: Iterable[FaultResult]) -> dict[str, Any]:
    """The matrix's total line: every loss summed, the slowest recovery."""
    rows = list(results)
    out: dict[str, Any] = {"faults": len(rows)}
    out |= {k: sum(getattr(r, k) for r in rows) for k in LOSSES}
    out["max_recovery_s"] = round(max((r.recovery_s for r in rows), default=0.0), 2)
    return out
