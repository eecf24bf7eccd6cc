"""Deterministic simulation testing of the whole control plane (`sco lab swarm`).

In the spirit of FoundationDB's simulator and TigerBeetle's VOPR: one seed is one
world (a region, its partitions and their schedulers, two replicas of sco and
perhaps a second installation) and one schedule of faults at every port; sco's
real controller, node planes, signal pump, watcher, scorer and lease logic run on
its simulated clock, and named invariants are checked as it goes. A failing seed
replays exactly, and its schedule shrinks to the fewest faults that still fail.
"""
