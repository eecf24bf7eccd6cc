"""Node-hours by capacity class, read back from Slurm's accounting.

Slurm's accounting (slurmdbd, read with `sacct`) records every run of every job
and the nodes it held; sco's fleet state knows which capacity class each of its
servers was (a node is named after its server). Together they say how many
node-hours a partition's jobs used on spot and on guaranteed capacity, requeued
runs included. Nodes that are not sco's count as `other`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from sco.adapters.slurm.model import Allocation

OTHER = "other"


@dataclass(frozen=True, slots=True)
class Usage:
    since: float
    until: float
    node_hours: dict[str, float] = field(default_factory=dict)  # class -> node-hours
    runs: dict[str, int] = field(default_factory=dict)  # class -> job runs that used it

    def as_dict(self) -> dict[str, object]:
        total = sum(self.node_hours.values())
        return {
            "since": self.since,
            "until": self.until,
            "node_hours": {k: round(v, 4) for k, v in sorted(self.node_hours.items())},
            "runs": dict(sorted(self.runs.items())),
            "total_node_hours": round(total, 4),
        }


def node_hours(
    allocations: Sequence[Allocation],
    classes: Mapping[str, str],
    since: float,
    until: float,
    expand: Callable[[str], list[str]],
) -> Usage:
    """Node-hours of `allocations` within [since, until] by the class of each node
    (`classes`: node name -> class); a run still going counts up to `until`."""
    hours: dict[str, float] = {}
    runs: dict[str, int] = {}
    for a in allocations:
        start = max(a.start, since)
        end = min(a.end if a.end is not None else until, until)
        if end <= start:
            continue
        used: set[str] = set()
        for node in expand(a.nodes):
            cls = classes.get(node, OTHER)
            hours[cls] = hours.get(cls, 0.0) + (end - start) / 3600.0
            used.add(cls)
        for cls in used:
            runs[cls] = runs.get(cls, 0) + 1
    return Usage(since, until, hours, runs)
