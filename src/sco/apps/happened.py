"""What happened to each partition lately, from its recorded transitions: reclaims with
notice and without, replacements and how long they took to be ready, drains and how
they ended, creates that failed. `sco explain` and the status page both say it."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field

from sco.ports import HistoryRow

WINDOW_S = 3600.0  # "lately": the last hour


@dataclass
class Happened:
    since: float
    reclaims_noticed: int = 0  # reclaim notices received
    reclaims_unannounced: int = 0  # servers gone without our delete, and no notice seen
    creates: int = 0
    replacements: int = 0  # of the creates, those replacing a reclaimed instance
    ready: int = 0  # nodes that joined their scheduler
    ready_s: list[float] = field(default_factory=list)  # request to ready, where both seen
    drains: int = 0
    drained_in_time: int = 0  # left their scheduler before the deadline
    drains_at_deadline: int = 0  # deleted at the deadline, still in their scheduler
    failed: int = 0

    @property
    def reclaims(self) -> int:
        return self.reclaims_noticed + self.reclaims_unannounced

    def as_dict(self) -> dict[str, float | int | None]:
        out: dict[str, float | int | None] = {
            k: v for k, v in asdict(self).items() if k != "ready_s"
        }
        out["ready_p50_s"] = round(statistics.median(self.ready_s), 1) if self.ready_s else None
        out["ready_max_s"] = round(max(self.ready_s), 1) if self.ready_s else None
        return out

    def sentence(self) -> str:
        """One line, as the operator reads it."""
        parts = [
            f"{self.reclaims_noticed} reclaims with notice, {self.reclaims_unannounced} without",
            f"{self.creates} creates ({self.replacements} replacing reclaimed)",
        ]
        ready = f"{self.ready} ready"
        if self.ready_s:
            ready += (
                f" (request to ready p50 {statistics.median(self.ready_s):.0f} s, "
                f"max {max(self.ready_s):.0f} s)"
            )
        parts.append(ready)
        parts.append(
            f"{self.drains} drains: {self.drained_in_time} left in time, "
            f"{self.drains_at_deadline} at the deadline"
        )
        parts.append(f"{self.failed} failed")
        return "; ".join(parts)


def happened(rows: Iterable[HistoryRow], since: float) -> dict[str, Happened]:
    """Per partition, what its transitions at or after `since` say (oldest first)."""
    out: dict[str, Happened] = defaultdict(lambda: Happened(since))
    requested: dict[str, float] = {}
    noticed: set[str] = set()
    for r in rows:
        if r.at < since:
            continue
        h = out[r.partition]
        if r.from_state is None and r.to_state == "requested":
            h.creates += 1
            h.replacements += r.code == "replace_reclaimed"
            requested[r.instance_id] = r.at
        elif r.trigger == "reclaim_notice":
            h.reclaims_noticed += 1
            noticed.add(r.instance_id)
        elif r.trigger == "server_vanished":
            gone_noticed = r.instance_id in noticed or r.from_state == "noticed"
            h.reclaims_unannounced += not gone_noticed
        elif r.trigger == "node_joined":
            h.ready += 1
            if r.instance_id in requested:
                h.ready_s.append(r.at - requested[r.instance_id])
        elif r.trigger == "drain_requested":
            h.drains += 1
        elif r.trigger == "delete_sent" and r.from_state == "draining":
            h.drained_in_time += r.code == "node_drained"
            h.drains_at_deadline += r.code == "drain_deadline"
        if r.to_state == "failed":
            h.failed += 1
    return dict(out)
