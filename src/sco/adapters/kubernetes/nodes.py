"""Kubernetes nodes as sco's node plane (`sco.ports.SchedulerCluster`, extra `kubernetes`).

- A server is a node once a Node whose `providerID` ends in its server id (the
  OpenStack cloud provider's `openstack:///<id>`) is Ready; it joined when it
  became Ready.
- A drain cordons the node, then every cycle evicts its pods through the Eviction
  API, which a PodDisruptionBudget may refuse (429): such a pod is tried again
  next cycle. From `drain_by` less `grace_s` on (but not before half the time
  from the drain to its deadline has passed), what remains is deleted: a
  reclaim's deadline is hard. DaemonSet pods are left to go with the node.
- Pods annotated `sco.io/do-not-disrupt: "true"` are left alone by sco's own
  moves (a drain for any reason but a reclaim), never by a reclaim.
- A node is drained when it is cordoned and runs nothing but DaemonSet pods. A
  voluntary drain that only protected pods hold is not drained; its note says
  which pods hold it. A node running protected pods is `pinned`: the acquirer
  never picks it for a voluntary move, and a voluntary drain of it waits for
  those pods past its deadline.
- Given the provider's listing (`listing`) and the partitions' node labels
  (`partitions`), a node that joins is labelled as its server: the partition's
  labels (`sco.io/partition=<name>` unless they say otherwise), its capacity
  class (`sco.io/capacity-class`), its pool (`sco.io/pool`) and its hall
  (`topology.kubernetes.io/zone`), and a spot node of a partition with
  `spot_taint` gets the `sco.io/capacity-class=spot:NoSchedule` taint. The
  kubelet should register with them already (user data), so that no pod lands
  before they are there; sco puts back what is missing. A Node whose server is
  no longer listed is deleted if sco labelled it or listed its server for the
  partition within the last `REMEMBER_S` (a kubelet may register just before
  its server goes, too late for sco's labels).

A drain's deadline and reason are annotations on its Node (`sco.io/drain-by`,
`sco.io/drain-reason`): a restarted sco reads them back and goes on draining.

Pods and nodes come from informers (`sco.adapters.kubernetes.informer`), except
the pods of a draining node, which are listed from the server each cycle (one
list by `spec.nodeName` per draining node) so that a pod the cache has not seen yet
cannot let its node pass as drained. Calls go through the official client's
`CoreV1Api`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sco.adapters.kubernetes.demand import KubePartition
from sco.adapters.kubernetes.informer import Informer
from sco.adapters.kubernetes.pods import (
    CLASS_LABEL,
    PARTITION_LABEL,
    POOL_LABEL,
    SPOT_TAINT,
    ZONE_LABEL,
    Json,
    is_daemon,
    is_over,
    pod_name,
    pods_by_node,
    ready_since,
    server_of,
)
from sco.domain.pools import CapacityClass, Pool
from sco.domain.times import utc
from sco.ports import Clock, NodeView, SchedulerUnavailable, ServerView

log = logging.getLogger(__name__)

DO_NOT_DISRUPT = "sco.io/do-not-disrupt"
DRAIN_BY = "sco.io/drain-by"  # a draining node's deadline (epoch seconds)
DRAIN_REASON = "sco.io/drain-reason"  # and the reason code sco drains it for
RECLAIM = "reclaim_notice"  # the reason code of a drain for a reclaim (acquirer's Reason)
_GONE = NodeView(joined=False, drained=False)
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
REMEMBER_S = 3600.0  # how long a server once listed still makes its Node sco's


@dataclass
class _Drain:
    partition: str
    node: str
    drain_by: float
    reclaim: bool
    deleted: list[str]
    kept: list[str]
    hard_at: float  # from then on what remains is deleted


class KubernetesNodes:
    def __init__(
        self,
        core: Any,
        nodes: Informer,
        pods: Informer,
        clock: Clock,
        grace_s: float = 30.0,
        partitions: Mapping[str, KubePartition] | None = None,
        listing: Callable[[str], Sequence[ServerView]] | None = None,
        pools: Sequence[Pool] = (),
    ) -> None:
        """`core`: a `kubernetes.client.CoreV1Api`. Without `listing`, every node
        that is a server counts for every partition, and none is labelled or
        deleted."""
        self.core = core
        self._nodes = nodes
        self._pods = pods
        self.clock = clock
        self.grace_s = grace_s
        self.partitions = dict(partitions or {})
        self._listing = listing
        self._pools = {p.id: p for p in pools}
        self._drains: dict[str, _Drain] = {}  # server id -> its drain
        self._left: dict[str, list[Any]] = {}  # server id -> pods its drain left, by `tend`
        self._listed: dict[str, dict[str, float]] = {}  # partition -> server id -> last listed

    # ------------------------------------------------------------ SchedulerCluster

    def nodes(self, partition: str) -> Mapping[str, NodeView]:
        """The partition's servers that are nodes, by server id; reads only (a dry run
        calls it on a real cluster). Raises SchedulerUnavailable when the API server
        cannot be reached or refuses."""
        with _unavailable():
            return self._nodes_now(partition)

    def tend(self, partition: str, servers: Sequence[ServerView] | None) -> None:
        """Go on with every drain (evictions; at the hard time, deletes), cloud or no
        cloud; with a listing, also delete the Nodes of servers that are gone and put
        back missing labels."""
        with _unavailable():
            by_server = self._by_server()
            if servers is not None and self._listing is not None:
                listed = {v.server_id: v for v in servers}
                self._remember(partition, listed)
                self._forget_gone(partition, listed, by_server)
                by_server = {sid: n for sid, n in by_server.items() if sid in listed}
                for sid, node in by_server.items():
                    self._label(partition, listed[sid], node)
            self._resume_drains(partition, by_server)
            for sid, d in list(self._drains.items()):
                # Only the partition's own drains: another partition's, another
                # leader's or another installation's cordoned Nodes are theirs to tend.
                if sid in by_server and d.partition == partition:
                    self._left[sid] = self._advance(d, self._pods_on(d.node))

    def _nodes_now(self, partition: str) -> Mapping[str, NodeView]:
        by_server = self._by_server()
        if self._listing is not None:
            listed = {v.server_id for v in self._listing(partition)}
            by_server = {sid: n for sid, n in by_server.items() if sid in listed}
        running = pods_by_node(self._pods.items())
        left, self._left = self._left, {}
        for sid, d in self._drains.items():
            if sid in by_server:
                # What runs on a draining node is read from the server, not the cache:
                # a pod the cache has not seen yet must not let its node pass as drained
                # (what `tend` just left there, or a fresh list).
                running[d.node] = left[sid] if sid in left else self._pods_on(d.node)
        out: dict[str, NodeView] = {}
        for sid, node in by_server.items():
            name = node["metadata"]["name"]
            ready_at = ready_since(node)
            work = [p for p in running.get(name, []) if not is_daemon(p)]
            drain = self._drains.get(sid)
            cordoned = bool((node.get("spec") or {}).get("unschedulable"))
            order = _order(node)
            out[sid] = NodeView(
                joined=ready_at is not None,
                drained=cordoned and drain is not None and not work,
                joined_at=ready_at,
                busy=bool(work),
                pinned=any(_protected(p) for p in work),
                note=_note(drain),
                leaving=cordoned and order is not None,
                reclaim_by=order[0] if order is not None and order[1] == RECLAIM else None,
            )
        every = self._by_server()
        self._drains = {s: d for s, d in self._drains.items() if s in every}
        return out

    # ------------------------------------------------------------ labels and leaving

    def _label(self, partition: str, server: ServerView, node: Json) -> None:
        """Put back the labels and taint the node should carry, if any is missing."""
        labels, taint = self._wanted(partition, server)
        meta = node.get("metadata") or {}
        have = meta.get("labels") or {}
        missing = {k: v for k, v in labels.items() if have.get(k) != v}
        taints = list((node.get("spec") or {}).get("taints") or [])
        untainted = taint is not None and not any(
            t.get("key") == taint["key"] and t.get("effect") == taint["effect"] for t in taints
        )
        if not missing and not untainted:
            return
        patch: dict[str, Any] = {"metadata": {"labels": missing}} if missing else {}
        if untainted:
            patch["spec"] = {"taints": [*taints, taint]}
        self.core.patch_node(meta["name"], patch)
        log.info("node %s (server %s) labelled: %s%s", meta["name"], server.server_id,
                 ", ".join(f"{k}={v}" for k, v in missing.items()) or "-",
                 " and tainted" if untainted else "")  # fmt: skip

    def _wanted(self, partition: str, server: ServerView) -> tuple[dict[str, str], Json | None]:
        part = self.partitions.get(partition)
        labels = self._part(partition).identity()
        pool = self._pools.get(server.pool)
        parts = server.pool.split("/")
        hall = pool.hall if pool is not None else (parts[1] if len(parts) >= 3 else "")
        labels[POOL_LABEL] = label_value(server.pool.replace("/", "."))
        if hall:
            labels[ZONE_LABEL] = label_value(hall)
        taint = None
        if pool is not None:
            labels[CLASS_LABEL] = pool.capacity_class.value
            if pool.capacity_class is CapacityClass.SPOT and part is not None and part.spot_taint:
                taint = {"key": SPOT_TAINT.key, "value": SPOT_TAINT.value,
                         "effect": SPOT_TAINT.effect}  # fmt: skip
        return labels, taint

    def _part(self, partition: str) -> KubePartition:
        """The partition's settings; by default its nodes carry
        `sco.io/partition=<name>`."""
        part = self.partitions.get(partition) or KubePartition({}, {})
        if part.labels:
            return part
        return dataclasses.replace(part, labels={PARTITION_LABEL: label_value(partition)})

    def _remember(self, partition: str, listed: Mapping[str, ServerView]) -> None:
        now = self.clock.now()
        seen = self._listed.setdefault(partition, {})
        for sid in [s for s, at in seen.items() if now - at > REMEMBER_S]:
            del seen[sid]
        seen.update(dict.fromkeys(listed, now))

    def _forget_gone(
        self, partition: str, listed: Mapping[str, ServerView], by_server: Mapping[str, Json]
    ) -> None:
        """Delete this partition's Nodes whose servers are gone: no cloud controller
        does it for servers it does not know. A Node is the partition's if sco
        labelled it (its labels and a pool's) or listed its server lately; a node of
        a server sco never listed nor labelled is never deleted."""
        from kubernetes.client.exceptions import ApiException

        part = self._part(partition)
        seen = self._listed.get(partition, {})
        for sid, node in by_server.items():
            labelled = POOL_LABEL in _labels(node) and part.owns(node)
            if sid in listed or not (labelled or sid in seen):
                continue
            name = node["metadata"]["name"]
            try:
                self.core.delete_node(name)
            except ApiException as e:
                if e.status != 404:
                    raise
            log.info("partition %s: node %s deleted: its server %s is gone", partition, name, sid)

    def drain(self, partition: str, server_id: str, drain_by: float, reason: str = "") -> None:
        node = self._by_server().get(server_id)
        if node is None:
            return  # never a node: nothing to drain
        name = node["metadata"]["name"]
        # The deadline and the reason live on the Node, so a restarted sco goes on.
        notes = {DRAIN_BY: f"{drain_by:.3f}", DRAIN_REASON: reason or "leaving"}
        with _unavailable():
            self.core.patch_node(
                name, {"metadata": {"annotations": notes}, "spec": {"unschedulable": True}}
            )
        self._drains[server_id] = self._new_drain(partition, name, drain_by, reason)
        log.info("node %s cordoned: %s, leave by %s", name, reason or "leaving", utc(drain_by))

    def _new_drain(self, partition: str, node: str, drain_by: float, reason: str) -> _Drain:
        # Deletes start a grace before the deadline, but never before half of the
        # drain's time has gone to evictions (a short drain is not all deletes).
        now = self.clock.now()
        hard_at = max(drain_by - self.grace_s, now + (drain_by - now) / 2)
        return _Drain(partition, node, drain_by, reason == RECLAIM, [], [], hard_at)

    def _resume_drains(self, partition: str, by_server: Mapping[str, Json]) -> None:
        """Drains a previous sco process began on the partition's Nodes (those
        carrying its labels, or of servers listed for it lately), read back from them."""
        part, seen = self._part(partition), self._listed.get(partition, {})
        for sid, node in by_server.items():
            notes = (node.get("metadata") or {}).get("annotations") or {}
            cordoned = (node.get("spec") or {}).get("unschedulable")
            if sid in self._drains or not cordoned or DRAIN_BY not in notes:
                continue
            if not (part.owns(node) or sid in seen):
                continue
            try:
                drain_by = float(notes[DRAIN_BY])
            except ValueError:
                continue  # not ours to read: the acquirer's deadline still holds
            name = node["metadata"]["name"]
            self._drains[sid] = self._new_drain(
                partition, name, drain_by, notes.get(DRAIN_REASON, "")
            )
            log.info("node %s: drain resumed, leave by %s", name, utc(drain_by))

    # ------------------------------------------------------------ draining

    def _advance(self, d: _Drain, pods: list[Any]) -> list[Any]:
        """One cycle of a drain over the pods on its node; returns those still there."""
        hard = self.clock.now() >= d.hard_at
        left = []
        for pod in pods:
            if is_daemon(pod):
                left.append(pod)
                continue
            key = pod_name(pod)
            if not d.reclaim and _protected(pod):
                if key not in d.kept:
                    d.kept.append(key)
                left.append(pod)
            elif hard:
                self._delete(pod, d)
            elif not self._evict(pod):
                left.append(pod)
        return left

    def _evict(self, pod: Any) -> bool:
        """Ask the Eviction API; False while a disruption budget refuses."""
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        body = {"metadata": {"name": meta["name"], "namespace": meta["namespace"]}}
        try:
            self.core.create_namespaced_pod_eviction(meta["name"], meta["namespace"], body)
        except ApiException as e:
            if e.status == 429:
                log.info("eviction of %s refused by a disruption budget", pod_name(pod))
                return False
            if e.status != 404:
                raise
        return True

    def _delete(self, pod: Any, d: _Drain) -> None:
        from kubernetes.client.exceptions import ApiException

        meta = pod["metadata"]
        try:
            self.core.delete_namespaced_pod(meta["name"], meta["namespace"])
        except ApiException as e:
            if e.status != 404:
                raise
        if pod_name(pod) not in d.deleted:
            d.deleted.append(pod_name(pod))
            log.warning("pod %s deleted at node %s's deadline", pod_name(pod), d.node)

    # ------------------------------------------------------------ reading

    def _by_server(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for node in self._nodes.items():
            server = server_of(node)
            if server:
                out[server] = node
        return out

    def _pods_on(self, node: str) -> list[Any]:
        response = self.core.list_pod_for_all_namespaces(
            field_selector=f"spec.nodeName={node}", _preload_content=False
        )
        pods = json.loads(response.data).get("items") or []
        return [p for p in pods if not is_over(p)]


@contextmanager
def _unavailable() -> Iterator[None]:
    """The API server's refusals and silences as the port's SchedulerUnavailable: the
    controller then degrades the partition and deletes nothing."""
    from kubernetes.client.exceptions import ApiException
    from urllib3.exceptions import HTTPError

    try:
        yield
    except (ApiException, HTTPError, OSError) as e:
        raise SchedulerUnavailable(f"kubernetes: {type(e).__name__}: {e}") from None


def label_value(text: str) -> str:
    """A label value: at most 63 of letters, digits, '-', '_' and '.', alphanumeric at
    both ends."""
    return _LABEL_UNSAFE.sub("-", text)[:63].strip("-_.")


def _labels(node: Json) -> Mapping[str, str]:
    return (node.get("metadata") or {}).get("labels") or {}


def _order(node: Json) -> tuple[float, str] | None:
    """(deadline, reason code) of the order to leave sco put on a Node, if any."""
    notes = (node.get("metadata") or {}).get("annotations") or {}
    if DRAIN_BY not in notes:
        return None
    try:
        return float(notes[DRAIN_BY]), str(notes.get(DRAIN_REASON, ""))
    except (TypeError, ValueError):
        return None


def _protected(pod: Any) -> bool:
    notes = (pod.get("metadata") or {}).get("annotations") or {}
    return str(notes.get(DO_NOT_DISRUPT, "")).lower() == "true"


def _note(d: _Drain | None) -> str:
    if d is None:
        return ""
    parts = []
    if d.deleted:
        parts.append(f"pods deleted at the deadline: {', '.join(d.deleted)}")
    if d.kept:
        parts.append(f"left alone ({DO_NOT_DISRUPT}): {', '.join(d.kept)}")
    return "; ".join(parts)
