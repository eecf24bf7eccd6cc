"""The parts of a Kubernetes cluster the test API server does not play: kubelets that
register a Node for each server that boots, and a scheduler that binds pods.

`KubeletSim` lists the Nova test stack's sco servers: one that is ACTIVE gets a
Node (`providerID: openstack:///<id>`, Ready, the allocatable given), registered
as the user data in docs/kubernetes.md makes a kubelet do: with its capacity class
label and, on spot servers when `spot_taint`, the spot taint (so no pod lands
there before sco sees the node); the partition, pool and zone labels are left
for sco to put on. A server that is gone stops its kubelet; its Node
stays until someone deletes it (sco does). Each step also schedules: a pending pod
goes to the first Ready, schedulable node whose labels, taints and free room allow
it (`sco.adapters.kubernetes.pods`' rules), otherwise it is marked
`PodScheduled=False/Unschedulable`, as kube-scheduler does.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from sco.adapters.kubernetes.pods import (
    CLASS_LABEL,
    SPOT_TAINT,
    NodeShape,
    Taint,
    node_room,
    placement_refusal,
    pods_by_node,
    request_of,
)
from sco_harness.kube_api import KubeApi

UNSCHEDULABLE = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
_READY = {"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T00:00:00Z"}


class KubeletSim:
    def __init__(
        self,
        api: KubeApi,
        servers: Callable[[], list[dict[str, Any]]],
        allocatable: Mapping[str, str],
        spot_taint: bool = False,
        every_s: float = 0.3,
    ) -> None:
        self.api = api
        self.servers = servers
        self.allocatable = dict(allocatable)
        self.spot_taint = spot_taint
        self.every_s = every_s
        self.booted: dict[str, str] = {}  # server id -> node name
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> None:
        try:
            servers = self.servers()
        except Exception:
            return  # the stack is busy: next time
        active = {
            s["id"]: s["metadata"]["sco:class"]
            for s in servers
            if s.get("status") == "ACTIVE" and (s.get("metadata") or {}).get("sco:partition")
        }
        for sid in sorted(set(active) - set(self.booted)):
            name = f"node-{sid[:8]}"
            labels = {"kubernetes.io/hostname": name, CLASS_LABEL: active[sid]}
            spec: dict[str, Any] = {"providerID": f"openstack:///{sid}"}
            if self.spot_taint and active[sid] == "spot":
                spec["taints"] = [{"key": SPOT_TAINT.key, "value": SPOT_TAINT.value,
                                   "effect": SPOT_TAINT.effect}]  # fmt: skip
            self.api.put(
                "nodes",
                {
                    "metadata": {"name": name, "labels": labels},
                    "spec": spec,
                    "status": {"allocatable": self.allocatable, "conditions": [_READY]},
                },
            )
            self.booted[sid] = name
        for sid in set(self.booted) - set(active):
            self.booted.pop(sid)  # its kubelet is gone with it; the Node object stays
        self.schedule()

    def schedule(self) -> None:
        nodes = [n for n in self.api.list("nodes") if _takes_pods(n)]
        pods = self.api.list("pods")
        room = {n["metadata"]["name"]: node_room(n) for n in nodes}
        for name, there in pods_by_node(pods).items():
            for p in there:
                if name in room:
                    room[name] = room[name].less(request_of(p))
        for pod in pods:
            if pod["spec"].get("nodeName"):
                continue
            size = request_of(pod)
            for n in nodes:
                name = n["metadata"]["name"]
                shape = NodeShape(room[name], n["metadata"].get("labels") or {}, _taints(n))
                if not placement_refusal(pod, shape) and size.fits(room[name]):
                    room[name] = room[name].less(size)
                    self._set(pod, name)
                    break
            else:
                if UNSCHEDULABLE not in (pod.get("status") or {}).get("conditions", []):
                    self._set(pod, None)

    def _set(self, pod: dict[str, Any], node: str | None) -> None:
        """Bind a pod (Running and Ready there) or mark it unschedulable, unless it
        changed meanwhile (evicted, deleted, bound)."""
        version = pod["metadata"]["resourceVersion"]

        def change(current: dict[str, Any]) -> dict[str, Any]:
            if current["metadata"]["resourceVersion"] != version:
                return current
            if node is None:
                current["status"] = {"phase": "Pending", "conditions": [UNSCHEDULABLE]}
            else:
                current["spec"]["nodeName"] = node
                ready = {"type": "Ready", "status": "True"}
                current["status"] = {"phase": "Running", "conditions": [ready]}
            return current

        meta = pod["metadata"]
        self.api.update("pods", meta.get("namespace", ""), meta["name"], change)

    def start(self) -> KubeletSim:
        self._thread = threading.Thread(target=self._loop, name="kubelet-sim", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                self.step()
            except Exception as e:  # kept for the test to see; the loop goes on
                self.errors.append(f"{type(e).__name__}: {e}")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)


def _takes_pods(node: dict[str, Any]) -> bool:
    spec = node.get("spec") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True"
                for c in (node.get("status") or {}).get("conditions") or ())  # fmt: skip
    return ready and not spec.get("unschedulable")


def _taints(node: dict[str, Any]) -> tuple[Taint, ...]:
    return tuple(
        Taint(t["key"], t.get("value", ""), t.get("effect", "NoSchedule"))
        for t in (node.get("spec") or {}).get("taints") or ()
    )
