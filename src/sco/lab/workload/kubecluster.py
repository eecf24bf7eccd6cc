"""A Kubernetes cluster on the lab's clock, for replaying services and jobs of pods:
the API server (what sco's `KubernetesNodes` calls of `CoreV1Api`, and the pod and
node informers it and `KubernetesDemandSource` read), the scheduler and the
workloads' controllers.

- The scheduler binds pending pods, oldest first, to the first Ready, uncordoned
  node whose free room (allocatable less the requests of what runs there) holds
  the pod's requests and whose labels match its nodeSelector. A pod it cannot
  bind is marked Unschedulable, which is what sco's intake counts as demand.
- A job's pod ends after `run_s` of work. A service's replica runs until its
  `stop_s` (or the end).
- A pod evicted or deleted by sco (a drain: its node was cordoned, then its pods
  evicted, and at the deadline deleted) is told with SIGTERM: a job's pod saves
  its work and a new pod resumes it; nothing is lost. A pod whose node goes
  without a word loses the work since it started (or since its last checkpoint,
  with `checkpoint_s`). Either way its controller makes a new pending pod.

What the pods' users feel is kept per pod across its restarts (`PodLedger`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sco.adapters.kubernetes.connect import api_error
from sco.adapters.kubernetes.pods import CLASS_LABEL, node_room, request_of
from sco.decide.binpack import Size
from sco.lab.workload.kubefile import PodWork

Json = dict[str, Any]
NAMESPACE = "work"
_UNSCHEDULABLE = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}]


@dataclass
class PodLedger:
    work: PodWork
    pod: str = ""  # the pod that stands for it now
    state: str = "Pending"  # Pending, Running, Succeeded, Stopped (a service's end)
    node: str = ""
    started_at: float | None = None
    pending_since: float = 0.0
    waited_s: float = 0.0
    done_s: float = 0.0  # a job's work kept over restarts
    ran_s: float = 0.0  # time running, over all its runs
    restarts: int = 0
    lost_s: float = 0.0  # pod-seconds of work lost with nodes
    ended_at: float | None = None


@dataclass
class CacheInformer:
    """What sco's Kubernetes code reads of an informer: its cache, always in sync."""

    source: Callable[[], list[Json]]
    name: str
    synced: bool = True
    last_error: str = ""

    def items(self) -> list[Json]:
        return self.source()

    def get(self, namespace: str, name: str) -> Json | None:
        for obj in self.source():
            meta = obj["metadata"]
            if meta.get("namespace", "") == namespace and meta["name"] == name:
                return obj
        return None

    def failing_for(self) -> float:
        return 0.0


@dataclass
class ListResponse:
    data: bytes


@dataclass
class KubeCluster:
    partition_labels: dict[str, str]  # what a node of the partition registers with
    allocatable: dict[str, str]
    now: Callable[[], float]
    checkpoint_s: float | None = None
    origin: float = 0.0  # the replay's start: a workload's times count from it
    nodes_by_name: dict[str, Json] = field(default_factory=dict)
    pods: dict[str, Json] = field(default_factory=dict)  # live pods, by name
    ledger: dict[str, PodLedger] = field(default_factory=dict)  # by PodWork.key
    lost: list[tuple[float, float]] = field(default_factory=list)  # (when, pod-seconds)
    up_node_s: float = 0.0  # node-seconds of nodes deleted
    busy_cpu_s: float = 0.0  # requested CPU-seconds of pods stopped running
    _joined: dict[str, float] = field(default_factory=dict)  # node -> registered
    _gone: dict[str, float] = field(default_factory=dict)  # node -> its server went
    _by_pod: dict[str, str] = field(default_factory=dict)  # pod -> ledger key
    _gen: int = 0

    def __post_init__(self) -> None:
        self.node_informer = CacheInformer(lambda: list(self.nodes_by_name.values()), "nodes")
        self.pod_informer = CacheInformer(lambda: list(self.pods.values()), "pods")
        self._cpus = node_room({"status": {"allocatable": self.allocatable}}).cpus

    # ------------------------------------------------------------ CoreV1Api

    def patch_node(self, name: str, body: Json) -> Json:
        node = self.nodes_by_name.get(name)
        if node is None:
            raise api_error(404, "Not Found")
        meta = body.get("metadata") or {}
        node["metadata"].setdefault("labels", {}).update(meta.get("labels") or {})
        node["metadata"].setdefault("annotations", {}).update(meta.get("annotations") or {})
        node["spec"].update(body.get("spec") or {})
        return node

    def delete_node(self, name: str) -> None:
        if self.nodes_by_name.pop(name, None) is None:
            raise api_error(404, "Not Found")
        self.up_node_s += self._gone.pop(name, self.now()) - self._joined.pop(name)
        for pod in [p for p in self.pods.values() if p["spec"].get("nodeName") == name]:
            self._end_run(pod["metadata"]["name"], told=False)

    def create_namespaced_pod_eviction(self, name: str, namespace: str, body: Json) -> None:  # noqa: ARG002
        self.delete_namespaced_pod(name, namespace)

    def delete_namespaced_pod(self, name: str, namespace: str) -> None:  # noqa: ARG002
        if name not in self.pods:
            raise api_error(404, "Not Found")
        self._end_run(name, told=True)

    def list_pod_for_all_namespaces(
        self, field_selector: str = "", _preload_content: bool = True, **_: Any
    ) -> ListResponse:
        on = field_selector.removeprefix("spec.nodeName=")
        items = [p for p in self.pods.values() if p["spec"].get("nodeName") == on]
        return ListResponse(json.dumps({"items": items}).encode())

    # ------------------------------------------------------------ the world's side

    def submit(self, work: PodWork) -> None:
        self.ledger[work.key] = PodLedger(work, pending_since=self.now())
        self._new_pod(work.key)

    def register(self, name: str, server_id: str, labels: dict[str, str]) -> None:
        """A server booted and its kubelet registered it, Ready, with its labels."""
        if name in self.nodes_by_name:
            return
        now = self.now()
        stamp = datetime.fromtimestamp(now, UTC).isoformat().replace("+00:00", "Z")
        self._joined[name] = now
        self.nodes_by_name[name] = {
            "metadata": {"name": name, "labels": {**self.partition_labels, **labels}},
            "spec": {"providerID": f"openstack:///{server_id}"},
            "status": {
                "allocatable": dict(self.allocatable),
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": stamp}],
            },
        }

    def server_gone(self, name: str) -> None:
        """The kubelet went with its server: NotReady, and what ran there is lost."""
        node = self.nodes_by_name.get(name)
        if node is None or name in self._gone:
            return
        self._gone[name] = self.now()
        node["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
        for pod in [p for p in self.pods.values() if p["spec"].get("nodeName") == name]:
            self._end_run(pod["metadata"]["name"], told=False)

    def next_event_time(self) -> float | None:
        """When a running job's pod ends or a service's replica is due to stop."""
        times = [t for t in (self._due(x) for x in self.ledger.values()) if t is not None]
        return min(times, default=None)

    def _due(self, x: PodLedger) -> float | None:
        if x.state == "Running" and x.work.is_job and x.started_at is not None:
            return x.started_at + (x.work.run_s or 0.0) - x.done_s
        if x.state in ("Running", "Pending") and x.work.stop_s is not None:
            return x.work.stop_s + self.origin
        return None

    def step(self) -> bool:
        """Pods whose work is done (or whose service stopped) end; then the scheduler
        binds what it can. True when a pod ended or was bound."""
        now = self.now()
        ended = [x for x in self.ledger.values() if (t := self._due(x)) is not None and t <= now]
        for x in ended:
            self._finish(x, now)
        return self._schedule(now) or bool(ended)

    # ------------------------------------------------------------ scheduling

    def _schedule(self, now: float) -> bool:
        rooms = self._rooms()
        bound = False
        for name, pod in list(self.pods.items()):
            if pod["spec"].get("nodeName"):
                continue
            need = request_of(pod)
            want = pod["spec"].get("nodeSelector") or {}
            for node, room in rooms.items():
                labels = self.nodes_by_name[node]["metadata"].get("labels") or {}
                if all(labels.get(k) == v for k, v in want.items()) and need.fits(room):
                    rooms[node] = room.less(need)
                    self._bind(name, node, now)
                    bound = True
                    break
            else:
                pod["status"]["conditions"] = _UNSCHEDULABLE
        return bound

    def _rooms(self) -> dict[str, Size]:
        rooms = {
            name: node_room(node)
            for name, node in sorted(self.nodes_by_name.items())
            if _takes_work(node)
        }
        for pod in self.pods.values():
            on = pod["spec"].get("nodeName")
            if on in rooms:
                rooms[on] = rooms[on].less(request_of(pod))
        return rooms

    def _bind(self, pod: str, node: str, now: float) -> None:
        self.pods[pod]["spec"]["nodeName"] = node
        self.pods[pod]["status"] = {"phase": "Running"}
        x = self.ledger[self._by_pod[pod]]
        x.state, x.node, x.started_at = "Running", node, now
        x.waited_s += now - x.pending_since

    def _finish(self, x: PodLedger, now: float) -> None:
        end = self._due(x) or now
        if x.state == "Running":
            self._ran(x, end)
        x.state, x.ended_at = ("Succeeded" if x.work.is_job else "Stopped"), end
        if x.work.is_job:
            x.done_s = x.work.run_s or 0.0
        self.pods.pop(x.pod, None)
        self._by_pod.pop(x.pod, None)

    def _ran(self, x: PodLedger, at: float) -> None:
        assert x.started_at is not None
        x.ran_s += at - x.started_at
        self.busy_cpu_s += (at - x.started_at) * request_of(self.pods[x.pod]).cpus

    def _end_run(self, pod: str, told: bool) -> None:
        """The pod's run ends before its work did: told (SIGTERM), a job's pod keeps
        its work; else the work since its last checkpoint is lost. A new pod follows."""
        x = self.ledger[self._by_pod.pop(pod)]
        now = self.now()
        if x.state == "Running" and x.started_at is not None:
            self._ran(x, now)
            ran = now - x.started_at
            kept = ran if told else self._checkpointed(ran)
            if x.work.is_job:
                x.done_s += kept
                if ran > kept:
                    x.lost_s += ran - kept
                    self.lost.append((now, (ran - kept) * self._node_share(x)))
            x.restarts += 1
        del self.pods[pod]
        x.state, x.node, x.started_at, x.pending_since = "Pending", "", None, now
        self._new_pod(x.work.key)

    def _checkpointed(self, ran: float) -> float:
        if self.checkpoint_s is None:
            return 0.0
        return math.floor(ran / self.checkpoint_s) * self.checkpoint_s

    def _node_share(self, x: PodLedger) -> float:
        """The share of a node the pod holds (its CPU request over a node's CPUs)."""
        from sco.adapters.kubernetes.pods import quantity

        return quantity(x.work.cpu) / self._cpus if self._cpus else 1.0

    def _new_pod(self, key: str) -> None:
        self._gen += 1
        x = self.ledger[key]
        w = x.work
        name = f"{key.replace('/', '-')}-{self._gen}"
        selector = {CLASS_LABEL: "guaranteed"} if w.guaranteed else {}
        self.pods[name] = {
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {"app": w.workload}},
            "spec": {
                "containers": [
                    {"name": "c", "resources": {"requests": {"cpu": w.cpu, "memory": w.memory}}}
                ],
                **({"nodeSelector": selector} if selector else {}),
            },
            "status": {"phase": "Pending", "conditions": _UNSCHEDULABLE},
        }
        x.pod = name
        self._by_pod[name] = key

    # ------------------------------------------------------------ the ledger's sums

    def utilisation(self, end: float) -> float | None:
        """CPU requested by running pods over CPU of nodes up, by `end`."""
        up = self.up_node_s + sum(self._gone.get(n, end) - t for n, t in self._joined.items())
        busy = self.busy_cpu_s + sum(
            (end - x.started_at) * request_of(self.pods[x.pod]).cpus
            for x in self.ledger.values()
            if x.state == "Running" and x.started_at is not None
        )
        cpu_s = up * self._cpus
        return busy / cpu_s if cpu_s > 0 else None


def _takes_work(node: Json) -> bool:
    ready = any(
        c.get("type") == "Ready" and c.get("status") == "True" for c in node["status"]["conditions"]
    )
    return ready and not node["spec"].get("unschedulable")
