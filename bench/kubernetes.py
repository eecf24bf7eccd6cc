"""The Kubernetes intake at scale: pending pods of mixed shapes into nodes to add.

Builds 10,000 unschedulable pods (eight shapes, some asking for GPUs, some for
another node pool's labels, some not tolerating the partition's spot taint) and
2,000 nodes of the partition with some room left, as the API server's JSON, and
runs them through `sco.adapters.kubernetes.pods.intake`: parsing requests,
selectors, affinity and tolerations, then first-fit decreasing into the free room
and new nodes. Prints one JSON line:

    {"pods": 10000, "nodes": 2000, "intake_s": ..., "units": ..., "units_lower_bound": ...}

`units` are the nodes to add. `units_lower_bound` is the larger of two bounds no
packing can beat: `units_lower_bound_sums`, what the resource sums alone demand
(`lower_bound`), and the LP relaxation of the packing itself (`lp_bound`: pods
split fractionally between each node's free room, cut by the (CPU, memory)
frontier whole pods can reach there, and new nodes).

    .venv/bin/python bench/kubernetes.py [--pods 10000] [--nodes 2000] [--seed 0]
"""

from __future__ import annotations

import sys
from pathlib import Path

# Run as a script, this file's folder comes first on the path, and its name would
# hide the official `kubernetes` package that the intake imports.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]

import argparse  # noqa: E402
import functools  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import random  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

from sco.adapters.kubernetes.pods import NodeShape, Taint, intake, node_room, request_of  # noqa: E402
from sco.decide.binpack import Size  # noqa: E402
from sco.decide.optimal import highs_banner_to_stderr  # noqa: E402

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


def frontier(room: Size, shapes: list[Size]) -> list[tuple[float, float]]:
    """The upper concave envelope of the (CPU, memory) whole pods of `shapes` can take
    together of `room` (GPUs respected), as its corner points by rising CPU: no
    packing on that node uses a pair above it. Bitsets of reachable memory per CPU
    amount and GPU count, over the shapes' common steps."""
    fits = [s for s in shapes if s.fits(room)]
    if not fits:
        return [(0.0, 0.0)]
    gpu = "nvidia.com/gpu"
    milli = [round(s.cpus * 1000) for s in fits]
    mb = [round(s.memory_mb) for s in fits]
    c_step, m_step = functools.reduce(math.gcd, milli), functools.reduce(math.gcd, mb)
    c_top, m_top = int(room.cpus * 1000 // c_step), int(room.memory_mb // m_step)
    g_top = room.gres.get(gpu, 0)
    cu, mu, gu = (
        [m // c_step for m in milli],
        [m // m_step for m in mb],
        [s.gres.get(gpu, 0) for s in fits],
    )
    mask = (1 << (m_top + 1)) - 1
    reach = [[0] * (g_top + 1) for _ in range(c_top + 1)]  # [cpu][gpus]: bitset of memory
    reach[0][0] = 1
    for c in range(c_top + 1):
        for g in range(g_top + 1):
            bits = reach[c][g]
            if not bits:
                continue
            for a, m, k in zip(cu, mu, gu, strict=True):
                if c + a <= c_top and g + k <= g_top:
                    reach[c + a][g + k] |= (bits << m) & mask
    points = []
    for c in range(c_top + 1):
        bits = 0
        for g in range(g_top + 1):
            bits |= reach[c][g]
        if bits:
            points.append((c * c_step / 1000, (bits.bit_length() - 1) * m_step))
    hull: list[tuple[float, float]] = []
    best = -1.0
    for c, m in sorted(points, key=lambda p: (-p[0], -p[1])):  # memory by falling CPU
        if m > best:  # no other point has as much CPU and more memory
            best = m
            hull.append((c, m))
    hull.reverse()
    upper: list[tuple[float, float]] = []
    for pt in hull:  # the concave envelope of the staircase
        while len(upper) >= 2 and _cross(upper[-2], upper[-1], pt) >= 0:
            upper.pop()
        upper.append(pt)
    return upper


def _cross(o: tuple[float, float], a: tuple[float, float], b: tuple[float, float]) -> float:
    return (a[0] - o[0]) * (b[1] - o[1]) - (a[1] - o[1]) * (b[0] - o[0])


def lp_bound(slices: list[Size], free: list[Size], room: Size) -> int:
    """The LP relaxation of the packing itself: pods of each shape split (fractionally)
    between the free room of each node (every resource of each node respected) and
    new nodes, whose resources are summed. The least number of new nodes it admits
    is a lower bound no packing can beat, tighter than the sums when the free room's
    CPU and memory do not match the pods' (solved with HiGHS, the `eval` extra)."""
    import highspy
    import numpy as np

    counts: dict[Size, int] = {}
    for s in slices:
        counts[s] = counts.get(s, 0) + 1
    shapes = list(counts)

    def amounts(s: Size) -> list[float]:
        return [s.cpus, s.memory_mb, *(float(s.gres.get(g, 0)) for g in sorted(room.gres))]

    need = [amounts(s) for s in shapes]
    cols: list[tuple[int, int]] = []  # (free node, shape); the new nodes' share is y_k
    for n, f in enumerate(free):
        cols += [(n, k) for k, s in enumerate(shapes) if s.fits(f)]
    x0, y0, big = 0, len(cols), len(cols) + len(shapes)  # big: the number of new nodes
    n_cols = big + 1
    entries: list[tuple[int, int, float]] = []  # (row, column, value)
    lower: list[float] = []
    upper: list[float] = []
    inf = highspy.kHighsInf
    by_node: dict[int, list[int]] = {}
    for c, (n, _) in enumerate(cols):
        by_node.setdefault(n, []).append(c)
    for n, members in by_node.items():  # each free node's room, per resource
        caps = amounts(free[n])
        corners = frontier(free[n], shapes)
        # No whole pods take more CPU and memory there together than some mix of them
        # could: the frontier's facets cut the fractional LP (validly).
        caps[0] = min(caps[0], corners[-1][0])
        caps[1] = min(caps[1], corners[0][1])
        for (c1, m1), (c2, m2) in itertools.pairwise(corners):
            a, b = m1 - m2, c2 - c1  # a * cpu + b * memory <= a * c1 + b * m1
            row = len(lower)
            entries += [(row, x0 + c, a * need[cols[c][1]][0] + b * need[cols[c][1]][1])
                        for c in members]  # fmt: skip
            lower.append(-inf)
            upper.append(a * c1 + b * m1)
        for r, cap in enumerate(caps):
            row = len(lower)
            entries += [(row, x0 + c, need[cols[c][1]][r]) for c in members if need[cols[c][1]][r]]
            lower.append(-inf)
            upper.append(max(0.0, cap))
    for k, count in enumerate(counts.values()):  # every pod placed somewhere
        row = len(lower)
        entries += [(row, x0 + c, 1.0) for c, (_, kk) in enumerate(cols) if kk == k]
        entries.append((row, y0 + k, 1.0))
        lower.append(float(count))
        upper.append(float(count))
    for r, cap in enumerate(amounts(room)):  # new nodes hold what goes there
        if cap <= 0:
            continue
        row = len(lower)
        entries += [(row, y0 + k, need[k][r]) for k in range(len(shapes)) if need[k][r]]
        entries.append((row, big, -cap))
        lower.append(-inf)
        upper.append(0.0)
    lp = highspy.HighsLp()
    lp.num_col_ = n_cols
    lp.num_row_ = len(lower)
    cost = np.zeros(n_cols)
    cost[big] = 1.0
    lp.col_cost_ = cost
    lp.col_lower_ = np.zeros(n_cols)
    lp.col_upper_ = np.full(n_cols, inf)
    lp.row_lower_ = np.array(lower)
    lp.row_upper_ = np.array(upper)
    rows_a = np.array([e[0] for e in entries], dtype=np.int32)
    cols_a = np.array([e[1] for e in entries], dtype=np.int32)
    vals_a = np.array([e[2] for e in entries])
    order = np.lexsort((rows_a, cols_a))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_ = np.searchsorted(cols_a[order], np.arange(n_cols + 1)).astype(np.int32)
    lp.a_matrix_.index_ = rows_a[order]
    lp.a_matrix_.value_ = vals_a[order]
    with highs_banner_to_stderr():
        h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.passModel(lp)
    h.run()
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"the packing LP: {h.modelStatusToString(h.getModelStatus())}")
    return math.ceil(h.getInfo().objective_function_value - 1e-6)


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
    bound_lp = lp_bound(counted, free, shape.room)
    print(json.dumps({
        "pods": args.pods,
        "nodes": args.nodes,
        "intake_s": round(intake_s, 3),
        "units": got.new_nodes,
        "units_lower_bound": max(bound_sums, bound_lp),
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
    main()
