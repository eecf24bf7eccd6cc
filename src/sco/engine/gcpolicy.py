"""How a sco process collects garbage: the same policy in `sco run`, the lab's
simulations and every worker of a sweep."""

from __future__ import annotations

import gc

# (allocations between collections of the youngest generation, collections of one
# generation between collections of the next, and again for the oldest)
THRESHOLDS = (100_000, 50, 100)


def tune_gc() -> None:
    """Fewer collections for a process that holds tens of thousands of live records.

    CPython's default collects its youngest objects every 700 allocations and walks
    every object the process holds every 100 x 10 of those; a cycle that builds the
    snapshot of 20,000 instances allocates hundreds of thousands of objects, so it
    paid for several walks of the whole heap (bench/cycle.py, 20,000 instances on
    PostgreSQL: cycle p99 0.33 s with the default, 0.15 s with these). What is
    loaded by then (modules, configuration) is frozen out of every walk. Reference
    cycles are still collected, less often."""
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
