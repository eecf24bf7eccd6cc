"""The Kubernetes intake at scale: pending pods of mixed shapes into nodes to add.

Builds 10,000 unschedulable pods (eight shapes, some asking for GPUs, some for
another node pool's labels, some not tolerating the partition's spot taint) and
2,000 nodes of the partition with some room left, as the API server's JSON, and
runs them through `sco.adapters.kubernetes.pods.intake`: parsing requests,
selectors, affinity and tolerations, then first-fit decreasing into the free room
and new nodes. Prints one JSON line:

    {"pods": 10000, "nodes": 2000, "intake_s": ..., "units": ..., "units_lower_bound": ...}

`units` are the nodes to add. `units_lower_bound` is the fewest new nodes any
packing needs, proven by HiGHS on the exact integer program of the packing
(`optimum_bound`, computed apart from the intake and not timed); beside it,
`units_lower_bound_sums` is what the resource sums alone demand (`lower_bound`).

    .venv/bin/python bench/kube_intake.py [--pods 10000] [--nodes 2000] [--seed 0]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder comes first on the path, and its name would
# hide the official `kubernetes` package that the intake imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from sco.adapters.kubernetes.pods import NodeShape, Taint, intake, node_room, request_of  # noqa: E402
from sco.decide.binpack import Size  # noqa: E402
from sco.decide.optimal import highs_banner_to_stderr  # noqa: E402
from sco_harness.services import stop_on_signals  # noqa: E402

ALLOCATABLE = {"cpu": "31500m", "memory": "120Gi", "pods": "110", "nvidia.com/gpu": "4"}
LABELS = {
    "sco.io/partition": "gpu",
    "sco.io/class": "spot",
    "topology.kubernetes.io/zone": "hall-1",
}
SPOT_TAINT = Taint("sco.io/spot", "true", "NoSchedule")
# (cpu, memory, gpus, weight): a few shapes, as deployments' replicas are alike.
SHAPES = [
    ("250m", "512Mi", 0, 30),
    ("500m", "1Gi", 0, 20),
    ("1", "2Gi", 0, 15),
    ("2", "8Gi", 0, 10),
    ("4", "16Gi", 0, 8),
    ("8", "30Gi", 1, 7),
    ("3", "12Gi", 1, 6),
    ("16", "60Gi", 2, 4),
]


def pod(i: int, rng: random.Random) -> dict[str, Any]:
    cpu, mem, gpus, _ = rng.choices(SHAPES, weights=[s[3] for s in SHAPES])[0]
    limits = {"nvidia.com/gpu": str(gpus)} if gpus else {}
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "app",
                "resources": {"requests": {"cpu": cpu, "memory": mem}, "limits": limits},
            },
            {"name": "sidecar", "resources": {"requests": {"cpu": "50m", "memory": "64Mi"}}},
        ],
        "tolerations": [{"key": "sco.io/spot", "operator": "Exists", "effect": "NoSchedule"}],
    }
    roll = rng.random()
    if roll < 0.05:
        spec["nodeSelector"] = {"sco.io/partition": "cpu-only"}  # another pool's
    elif roll < 0.08:
        spec["tolerations"] = []  # does not tolerate spot
    elif roll < 0.30:
        spec["affinity"] = {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [
                            {"key": "sco.io/partition", "operator": "In", "values": ["gpu"]}
                        ]}
                    ]
                }
            }
        }  # fmt: skip
    return {
        "metadata": {"name": f"p{i}", "namespace": "work"},
        "spec": spec,
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}],
        },
    }


def node(i: int, rng: random.Random) -> tuple[dict[str, Any], Size]:
    """A node of the partition and the room its running pods leave."""
    doc = {"metadata": {"name": f"n{i}", "labels": LABELS}, "status": {"allocatable": ALLOCATABLE}}
    room = node_room(doc)
    used = Size(room.cpus * rng.uniform(0.7, 1.0), room.memory_mb * rng.uniform(0.7, 1.0),
                {"pods": rng.randint(5, 60), "nvidia.com/gpu": rng.randint(2, 4)})  # fmt: skip
    left = room.less(used)
    return doc, Size(max(0.0, left.cpus), max(0.0, left.memory_mb),
                     {g: max(0, n) for g, n in left.gres.items()})  # fmt: skip


def lower_bound(slices: list[Size], free: list[Size], room: Size) -> int:
    """Nodes no packing can do with fewer of: per resource, what the pods request
    beyond what the free room could take, over a node's room, rounded up; the largest.

    Free room is counted only as far as any pods could use it: none on a node where
    the smallest pod does not fit, and no more CPU than its free memory could go
    with (every pod asks at least the least memory per CPU of all), nor more memory
    than its free CPU could go with."""
    if not slices:
        return 0
    least_cpu = min(s.cpus for s in slices)
    least_mb = min(s.memory_mb for s in slices)
    mb_per_cpu = [s.memory_mb / s.cpus for s in slices if s.cpus > 0]
    lo, hi = min(mb_per_cpu), max(mb_per_cpu)
    cpu_free = mb_free = 0.0
    for f in free:
        if f.cpus < least_cpu or f.memory_mb < least_mb or f.gres.get("pods", 0) < 1:
            continue
        cpu_free += min(f.cpus, f.memory_mb / lo)
        mb_free += min(f.memory_mb, f.cpus * hi)
    need = [
        (sum(s.cpus for s in slices) - cpu_free) / room.cpus,
        (sum(s.memory_mb for s in slices) - mb_free) / room.memory_mb,
    ]
    for g, cap in room.gres.items():
        asked = sum(s.gres.get(g, 0) for s in slices) - sum(f.gres.get(g, 0) for f in free)
        need.append(asked / cap)
    return max(0, math.ceil(max(need)))


def optimum_bound(slices: list[Size], free: list[Size], room: Size, at_most: int) -> int:
    """The fewest new nodes any packing needs, as HiGHS proves it (the `eval` extra):
    the exact integer program of placing the counted pods in the nodes' free room
    and in up to `at_most` new nodes (whole pods; every resource of every node). It
    is solved to optimality in seconds here; should a time limit stop it first, its
    proven dual bound is returned, still a bound no packing beats."""
    import highspy
    import numpy as np

    counts: dict[Size, int] = {}
    for s in slices:
        counts[s] = counts.get(s, 0) + 1
    shapes = list(counts)
    gres = sorted(room.gres)

    def amounts(s: Size) -> list[float]:
        return [s.cpus, s.memory_mb, *(float(s.gres.get(g, 0)) for g in gres)]

    need = [amounts(s) for s in shapes]
    bins = [*free, *([room] * at_most)]
    cols = [(b, k) for b, f in enumerate(bins) for k, s in enumerate(shapes) if s.fits(f)]
    used0 = len(cols)  # then one 0/1 column per new node: is it used
    n_cols = used0 + at_most
    inf = highspy.kHighsInf
    h = _highs()
    h.setOptionValue("time_limit", 300.0)
    cost = np.zeros(n_cols)
    cost[used0:] = 1.0
    upper = np.full(n_cols, inf)
    upper[used0:] = 1.0
    h.addVars(n_cols, np.zeros(n_cols), upper)
    h.changeColsCost(n_cols, np.arange(n_cols, dtype=np.int32), cost)
    h.changeColsIntegrality(
        n_cols, np.arange(n_cols, dtype=np.int32), np.full(n_cols, highspy.HighsVarType.kInteger)
    )
    by_bin: dict[int, list[int]] = {}
    by_shape: dict[int, list[int]] = {}
    for c, (b, k) in enumerate(cols):
        by_bin.setdefault(b, []).append(c)
        by_shape.setdefault(k, []).append(c)
    for b, members in by_bin.items():  # each node's room, per resource
        new = b >= len(free)
        for r, cap in enumerate(amounts(bins[b])):
            idx = [c for c in members if need[cols[c][1]][r]]
            val = [need[cols[c][1]][r] for c in idx]
            if new:  # a new node holds nothing unless it is used
                idx.append(used0 + b - len(free))
                val.append(-cap)
            if idx:
                h.addRow(-inf, 0.0 if new else cap, len(idx), np.array(idx, dtype=np.int32),
                         np.array(val))  # fmt: skip
    for k, count in enumerate(counts.values()):  # every counted pod placed once
        idx = by_shape[k]
        h.addRow(count, count, len(idx), np.array(idx, dtype=np.int32), np.ones(len(idx)))
    for j in range(at_most - 1):  # new nodes are used in order (no symmetric twins)
        pair = np.array([used0 + j, used0 + j + 1], dtype=np.int32)
        h.addRow(0.0, inf, 2, pair, np.array([1.0, -1.0]))
    h.run()
    return math.ceil(h.getInfo().mip_dual_bound - 1e-6)


def _highs() -> Any:
    import highspy

    with highs_banner_to_stderr():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    return h


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=10_000)
    ap.add_argument("--nodes", type=int, default=2_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    pods = [pod(i, rng) for i in range(args.pods)]
    nodes = [node(i, rng) for i in range(args.nodes)]
    wire = json.dumps({"items": pods})  # what a list of pods is, on the wire
    free = [room for _, room in nodes]
    t0 = time.perf_counter()
    listed = json.loads(wire)["items"]
    shape = NodeShape(node_room({"status": {"allocatable": ALLOCATABLE}}), LABELS, (SPOT_TAINT,))
    got = intake(listed, shape, free)
    intake_s = time.perf_counter() - t0
    counted = [request_of(p) for p in listed if not _refused(p, got)]
    bound_sums = lower_bound(counted, free, shape.room)
    bound = optimum_bound(counted, free, shape.room, got.new_nodes)
    print(json.dumps({
        "pods": args.pods,
        "nodes": args.nodes,
        "intake_s": round(intake_s, 3),
        "units": got.new_nodes,
        "units_lower_bound": max(bound_sums, bound),
        "units_lower_bound_sums": bound_sums,
        "counted": got.counted,
        "unfit": len(got.unfit),
    }))  # fmt: skip


def _refused(pod: dict[str, Any], got: Any) -> bool:
    meta = pod["metadata"]
    return f"{meta['namespace']}/{meta['name']}" in _unfit_names(got)


_cache: dict[int, set[str]] = {}


def _unfit_names(got: Any) -> set[str]:
    key = id(got)
    if key not in _cache:
        _cache[key] = {name for name, _ in got.unfit}
    return _cache[key]


if __name__ == "__main__":
    with stop_on_signals():
        main()
