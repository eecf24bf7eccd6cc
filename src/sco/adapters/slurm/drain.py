"""A node's own drain out of Slurm, for `sco agent --slurm-node`: the node is set
DRAIN with the deadline in its reason; on a reclaim, the jobs that would not end
by the deadline are requeued `requeue_lead_s` before it (the same rule as the
controller's, `cut_short`); sco's own moves only wait. Done when nothing runs on
the node any more."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from sco.adapters.slurm.nodes import cut_short
from sco.adapters.slurm.tools import SlurmError, SlurmTools
from sco.domain.contracts import Contract
from sco.domain.times import utc

log = logging.getLogger(__name__)


@dataclass
class SlurmDrain:
    tools: SlurmTools
    node: str
    requeue_lead_s: float
    clock: Callable[[], float]
    sleep: Callable[[float], object]
    poll_s: float = 2.0

    def __call__(self, contract: Contract) -> tuple[str, str]:
        """Drain the node by the contract's `drain_by`: (drained or failed, what was done)."""
        drain_by = contract.drain_by
        if drain_by is None:
            return "failed", "the contract names no drain_by"
        reclaim = contract.terms.reclaim
        reason = f"sco: {'reclaim' if reclaim else 'leaving'} by {utc(drain_by)}"
        requeued: list[int] = []
        cannot: set[int] = set()
        try:
            self.tools.drain(self.node, reason)
            while True:
                running = [j for j in self.tools.jobs_on(self.node) if not j.pending]
                if not running:
                    done = f"{self.node} drained"
                    if requeued:
                        done += f"; requeued jobs {', '.join(map(str, requeued))}"
                        done += self._start_now(requeued)
                    if cannot:
                        done += f"; not requeueable: {', '.join(map(str, sorted(cannot)))}"
                    return "drained", done
                now = self.clock()
                if now >= drain_by:
                    left = ", ".join(str(j.job_id) for j in running)
                    return "failed", f"jobs {left} still on {self.node} at drain_by"
                if reclaim and now >= drain_by - self.requeue_lead_s:
                    fresh = [j for j in running if j.job_id not in requeued]
                    due, stuck = cut_short(fresh, {self.node: drain_by})
                    if due:
                        self.tools.requeue(due)
                        requeued += due
                        log.info("agent: requeued %s before %s goes", due, self.node)
                    cannot |= {j.job_id for j, _ in stuck}
                self.sleep(min(self.poll_s, max(0.1, drain_by - now)))
        except SlurmError as e:
            return "failed", f"slurm: {e}"

    def _start_now(self, requeued: list[int]) -> str:
        """Requeued jobs eligible at once, as sco's own requeue makes them: Slurm would
        hold them back for the credential lifetime (120 s), which sco's demand reads as
        no demand, and it would let the replacement go meanwhile."""
        try:
            self.tools.start_now(requeued)
        except SlurmError as e:
            log.info("agent: requeued jobs %s wait for Slurm: %s", requeued, e)
            return f" (held back by Slurm: {e})"
        return " (eligible at once)"
