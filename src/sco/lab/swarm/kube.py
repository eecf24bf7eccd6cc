"""A simulated Kubernetes API for the swarm: what `KubernetesNodes` calls of
`CoreV1Api`, and the two informers it reads, over nodes and pods in memory.

Pods of a partition's workload run on its Ready, schedulable nodes, a few per
node; some carry `sco.io/do-not-disrupt`, and a disruption budget holds
evictions that would leave too few running. An evicted or deleted pod is
replaced by a pending one, as its controller would. The workload grows and
shrinks over time (`workload`); a pod no node has room for is pending and
marked unschedulable, as the scheduler marks it, which is what sco's intake
reads as demand. The Kubernetes client's
own `ApiException` is raised, so sco's error handling runs as against a real
API server (the client is the `kubernetes` extra).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sco.adapters.kubernetes.connect import api_error
from sco.adapters.kubernetes.demand import KubeDemandSpec, KubePartition, KubernetesDemandSource
from sco.adapters.kubernetes.nodes import DO_NOT_DISRUPT, DRAIN_REASON, KubernetesNodes
from sco.adapters.kubernetes.pods import INSTALLATION_LABEL, PARTITION_LABEL
from sco.domain.demand import HANDBACK
from sco.domain.installation import DEFAULT_INSTALLATION
from sco.lab.swarm.promises import Breaches
from sco.lab.swarm.spec import BLUE, START_S
from sco.lab.workload.kubecluster import CacheInformer, ListResponse

if TYPE_CHECKING:
    from sco.domain.pools import Pool
    from sco.ports import Clock, DemandSource, SchedulerCluster, ServerView

Json = dict[str, Any]


def kube_installation(name: str) -> str:
    """The swarm's installation under test runs its Kubernetes partitions as the
    default installation (its nodes carry no installation label, as those of an sco
    from before installations had names); another installation is named."""
    return DEFAULT_INSTALLATION if name == BLUE else name


UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
KUBE_STALE_S = 30.0  # demand is unavailable once the informers fail this long (sco's default)
_TAKES_ALL = ("reclaim_notice", HANDBACK)  # drains that take do-not-disrupt pods too


@dataclass(frozen=True, slots=True)
class Lost:
    """A pod a node's end took with it (not evicted or deleted before)."""

    pod: str
    node: str
    at: float


@dataclass
class SimKube:
    """One cluster serving one sco partition (label `sco.io/partition=<partition>`)."""

    partition: str
    now: Callable[[], float]
    workload: tuple[tuple[float, int], ...] = ()  # (from when, nodes' worth of pods)
    protected: int = 0  # of its pods, those do-not-disrupt
    cpus: int = 4  # a node's allocatable CPUs
    pods_per_node: int = 2
    min_available: int = 1  # the workload's disruption budget
    available: bool = True
    nodes_by_name: dict[str, Json] = field(default_factory=dict)
    pods: dict[str, Json] = field(default_factory=dict)  # by name (one namespace)
    lost: list[Lost] = field(default_factory=list)
    told: dict[str, float] = field(default_factory=dict)  # node -> first told of a reclaim
    registered: dict[str, float] = field(default_factory=dict)  # node -> when it joined
    calls: int = 0  # calls that change something: a dry run must make none
    breaches: Breaches = field(default_factory=Breaches)  # what sco did against a promise
    refused: int = 0  # calls refused while it was away (a fault's effect)
    _next: int = 0

    away_since: float | None = None  # the API server is away since

    def __post_init__(self) -> None:
        self.node_informer = Watch(self, lambda: list(self.nodes_by_name.values()), "nodes")
        self.pod_informer = Watch(self, lambda: list(self.pods.values()), "pods")

    # ------------------------------------------------------------ CoreV1Api

    def _reach(self) -> None:
        if not self.available:
            self.refused += 1
            from urllib3.exceptions import HTTPError

            raise HTTPError("connection refused: the API server is away")

    def patch_node(self, name: str, body: Json) -> Json:
        self._reach()
        node = self.nodes_by_name.get(name)
        if node is None:
            raise api_error(404, "Not Found")
        self.calls += 1
        meta = body.get("metadata") or {}
        if (body.get("spec") or {}).get("unschedulable"):
            why = (meta.get("annotations") or {}).get(DRAIN_REASON, "")
            pinned = [p for p in self.running_on(name) if self._protected(p)]
            self.breaches.look("pinned_not_picked", bool(pinned) and why not in _TAKES_ALL,
                               f"node {name} cordoned ({why or 'no reason'}) running "
                               f"do-not-disrupt {', '.join(pinned)}")  # fmt: skip
        node["metadata"].setdefault("labels", {}).update(meta.get("labels") or {})
        node["metadata"].setdefault("annotations", {}).update(meta.get("annotations") or {})
        node["spec"].update(body.get("spec") or {})
        if (meta.get("annotations") or {}).get(DRAIN_REASON) == "reclaim_notice":
            self.told.setdefault(name, self.now())
        return node

    def delete_node(self, name: str) -> None:
        self._reach()
        if self.nodes_by_name.pop(name, None) is None:
            raise api_error(404, "Not Found")
        self.calls += 1
        for pod in [p for p in self.pods.values() if p["spec"].get("nodeName") == name]:
            self._replace(pod, lost=True)

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Json) -> None:  # noqa: ARG002 (one namespace)
        self._reach()
        pod = self.pods.get(name)
        if pod is None:
            raise api_error(404, "Not Found")
        running = [p for p in self.pods.values() if p["spec"].get("nodeName")]
        if len(running) - 1 < self.min_available:
            raise api_error(429, "Too Many Requests")  # the budget holds it
        self.calls += 1
        self._disrupted(name, "evicted")
        self._replace(pod, lost=False)

    def delete_namespaced_pod(self, name: str, namespace: str) -> None:  # noqa: ARG002
        self._reach()
        pod = self.pods.get(name)
        if pod is None:
            raise api_error(404, "Not Found")
        self.calls += 1
        self._disrupted(name, "deleted")
        self._replace(pod, lost=False)

    def _disrupted(self, pod: str, how: str) -> None:
        """sco ends `pod`: if do-not-disrupt, only for a reclaim or a handback."""
        on = self.pods[pod]["spec"].get("nodeName") or ""
        node = self.nodes_by_name.get(on, {})
        why = ((node.get("metadata") or {}).get("annotations") or {}).get(DRAIN_REASON, "")
        detail = f"do-not-disrupt pod {pod} {how} on {on} ({why or 'no drain'})"
        self.breaches.look(
            "pinned_left_alone", self._protected(pod) and why not in _TAKES_ALL, detail
        )

    def _protected(self, pod: str) -> bool:
        notes = self.pods[pod]["metadata"].get("annotations") or {}
        return bool(notes.get(DO_NOT_DISRUPT) == "true")

    def list_pod_for_all_namespaces(
        self, field_selector: str = "", _preload_content: bool = True, **_: Any
    ) -> ListResponse:
        self._reach()
        on = field_selector.removeprefix("spec.nodeName=")
        items = [p for p in self.pods.values() if p["spec"].get("nodeName") == on]
        return ListResponse(json.dumps({"items": items}).encode())

    # ------------------------------------------------------------ the world's side

    def scale(self, n: int) -> None:
        """The workload's owner sets it to `n` pods: new ones pending, the first
        `protected` do-not-disrupt; fewer, the newest go first, pending before
        running (the owner's choice, not a loss)."""
        pinned = sum(1 for p in self.pods if self._protected(p))
        for _ in range(n - len(self.pods)):
            pin = pinned < self.protected
            self._new_pod(protected=pin)
            pinned += pin
        if len(self.pods) > n:
            newest = sorted(self.pods, key=lambda p: (bool(self.pods[p]["spec"].get("nodeName")),
                                                      -int(p.rsplit("-", 1)[1])))  # fmt: skip
            for name in newest[: len(self.pods) - n]:
                del self.pods[name]

    def register(self, name: str, server_id: str, installation: str = BLUE) -> None:
        """A server booted and its kubelet registered it, Ready, with the partition's
        labels (as user data gives them: a named installation's too)."""
        if name in self.nodes_by_name:
            return
        self.registered[name] = self.now()
        stamp = datetime.fromtimestamp(self.now(), UTC).isoformat().replace("+00:00", "Z")
        labels = {PARTITION_LABEL: self.partition}
        if kube_installation(installation) != DEFAULT_INSTALLATION:
            labels[INSTALLATION_LABEL] = installation
        self.nodes_by_name[name] = {
            "metadata": {"name": name, "labels": labels},
            "spec": {"providerID": f"openstack:///{server_id}"},
            "status": {
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp}],
                "allocatable": {"cpu": str(self.cpus), "pods": "110"},
            },
        }

    def server_gone(self, name: str) -> None:
        """The kubelet went with its server: NotReady, and what ran there is lost."""
        node = self.nodes_by_name.get(name)
        if node is None:
            return
        node["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        for pod in [p for p in self.pods.values() if p["spec"].get("nodeName") == name]:
            self._replace(pod, lost=True)

    def step(self) -> None:
        """The workload takes its size of the moment; pending pods are bound to Ready,
        schedulable nodes with room."""
        # Away, calls are refused, and the informers serve their cache while failing.
        self.away_since = None if self.available else (self.away_since or self.now())
        t = self.now() - START_S
        size = [n for at, n in self.workload if at <= t]
        if size:
            self.scale(size[-1] * self.pods_per_node)
        load: dict[str, int] = {}
        for p in self.pods.values():
            on = p["spec"].get("nodeName")
            if on:
                load[on] = load.get(on, 0) + 1
        for pod in self.pods.values():
            if pod["spec"].get("nodeName"):
                continue
            for name, node in self.nodes_by_name.items():
                if self._takes_work(node) and load.get(name, 0) < self.pods_per_node:
                    pod["spec"]["nodeName"] = name
                    pod["status"] = {"phase": "Running"}
                    load[name] = load.get(name, 0) + 1
                    break

    def _takes_work(self, node: Json) -> bool:
        ready = any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in node["status"]["conditions"]
        )
        return ready and not node["spec"].get("unschedulable")

    def _new_pod(self, protected: bool) -> None:
        self._next += 1
        notes = {DO_NOT_DISRUPT: "true"} if protected else {}
        name = f"work-{self._next}"
        share = self.cpus / self.pods_per_node
        self.pods[name] = {
            "metadata": {
                "name": name,
                "namespace": "work",
                "labels": {"app": "work"},
                "annotations": notes,
            },
            "spec": {
                "containers": [{"name": "c", "resources": {"requests": {"cpu": str(share)}}}],
                "nodeSelector": {PARTITION_LABEL: self.partition},
            },
            "status": {
                "phase": "Pending",
                "conditions": [UNSCHEDULABLE],
            },
        }

    def _replace(self, pod: Json, lost: bool) -> None:
        """The pod ends; its controller makes a pending one in its place."""
        name = pod["metadata"]["name"]
        on = pod["spec"].get("nodeName")
        if lost and on:
            self.lost.append(Lost(name, on, self.now()))
        del self.pods[name]
        self._new_pod(protected=bool(pod["metadata"]["annotations"]))

    # ------------------------------------------------------------ for the invariants

    def running_on(self, name: str) -> list[str]:
        return [n for n, p in self.pods.items() if p["spec"].get("nodeName") == name]

    def told_reclaim_at(self, name: str) -> float | None:
        return self.told.get(name)

    def out_by_sco(self, name: str) -> bool:
        """Whether sco cordoned the node (its order to leave is on it)."""
        node = self.nodes_by_name.get(name)
        if node is None:
            return False
        notes = node["metadata"].get("annotations") or {}
        return bool(node["spec"].get("unschedulable")) and "sco.io/drain-by" in notes

    def fingerprint(self) -> tuple[object, ...]:
        return (
            self.calls,
            tuple(
                (n, json.dumps(v["metadata"], sort_keys=True), bool(v["spec"].get("unschedulable")))
                for n, v in self.nodes_by_name.items()
            ),
            tuple((n, p["spec"].get("nodeName")) for n, p in self.pods.items()),
        )


class Watch(CacheInformer):
    """An informer over the simulated API server: its cache is always what the
    cluster holds (a watch loses nothing here), and it fails while the server is
    away, for as long as it is."""

    def __init__(self, sim: SimKube, source: Callable[[], list[Json]], name: str) -> None:
        super().__init__(source, name)
        self.sim = sim

    def failing_for(self) -> float:
        since = self.sim.away_since
        if since is None:
            return 0.0
        self.last_error = "connection refused: the API server is away"
        return self.sim.now() - since


class KubeCaller:
    """One installation's client of a cluster it may share with another: what it
    changes on a Node (labels, a cordon, a delete) or a pod (an eviction, a delete)
    must be on a Node of its own installation's servers (`own_nodes_only`)."""

    def __init__(self, sim: SimKube, installation: str, owner: Callable[[str], str | None]) -> None:
        self.sim = sim
        self.installation = installation
        self.owner = owner  # server id -> its installation, as the cloud says

    def _mine(self, node: str, what: str) -> None:
        spec = (self.sim.nodes_by_name.get(node) or {}).get("spec") or {}
        server = str(spec.get("providerID", "")).rsplit("/", 1)[-1]
        owner = self.owner(server) if server else None
        self.sim.breaches.look("own_nodes_only", owner not in (None, self.installation),
                               f"{self.installation} {what} {owner}'s node {node}")  # fmt: skip

    def patch_node(self, name: str, body: Json) -> Json:
        self._mine(name, "patched")
        return self.sim.patch_node(name, body)

    def delete_node(self, name: str) -> None:
        self._mine(name, "deleted")
        self.sim.delete_node(name)

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Json) -> None:
        self._mine(self._node_of(name), f"evicted pod {name} from")
        self.sim.create_namespaced_pod_eviction(name, namespace, body)

    def delete_namespaced_pod(self, name: str, namespace: str) -> None:
        self._mine(self._node_of(name), f"deleted pod {name} from")
        self.sim.delete_namespaced_pod(name, namespace)

    def list_pod_for_all_namespaces(self, field_selector: str = "", **kwargs: Any) -> ListResponse:
        return self.sim.list_pod_for_all_namespaces(field_selector, **kwargs)

    def _node_of(self, pod: str) -> str:
        return str((self.sim.pods.get(pod) or {}).get("spec", {}).get("nodeName") or "")


def kube_partition(partition: str, installation: str, cpus: int) -> KubePartition:
    """An installation's partition in the swarm's cluster, as sco's config gives it."""
    return KubePartition(
        {PARTITION_LABEL: partition},
        {"cpu": str(cpus), "pods": "110"},
        installation=kube_installation(installation),
    )


def kube_intake(
    twin: SimKube,
    spec: KubeDemandSpec,
    listing: Callable[[str], Sequence[ServerView]],
    pools: Sequence[Pool],
) -> DemandSource:
    """sco's Kubernetes intake over the cluster's informers: the workload's pending
    pods are the partition's demand (no Events written: the world keeps none)."""
    return KubernetesDemandSource(
        twin.pod_informer,  # type: ignore[arg-type]
        twin.node_informer,  # type: ignore[arg-type]
        [spec],
        stale_s=KUBE_STALE_S,
        listing=listing,
        pools=pools,
    )


def kube_plane(
    core: KubeCaller,
    twin: SimKube,
    kube: KubePartition,
    listing: Callable[[str], Sequence[ServerView]],
    clock: Clock,
    pools: Sequence[Pool],
    grace_s: float,
) -> SchedulerCluster:
    """sco's Kubernetes node plane of the partition, through `core`."""
    return KubernetesNodes(
        core,
        twin.node_informer,  # type: ignore[arg-type]
        twin.pod_informer,  # type: ignore[arg-type]
        clock,
        grace_s,
        {kube.labels[PARTITION_LABEL]: kube},
        listing,
        pools,
    )
