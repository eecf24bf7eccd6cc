"""Kubernetes workloads for replay: services and batch jobs of pods, in a short YAML
file (documented in docs/replay.md):

```yaml
node: {cpu: "8", memory: 30Gi}    # one node's allocatable (pods: 110 unless given)
max_nodes: 64                     # the partition's most nodes (default: enough for the peak)
workloads:
  - name: web                     # a Deployment: replicas that run until stop_s
    service: {replicas: 6}
    cpu: "2"
    memory: 4Gi
    start_s: 0                    # default 0
    stop_s: 86400                 # default: to the end of the replay
  - name: nightly                 # a Job: pods that each run run_s, then end
    job: {pods: 24, run_s: 3600}
    cpu: "4"
    memory: 8Gi
    start_s: 7200
    every_s: 86400                # default: once
    guaranteed: true              # only guaranteed nodes (a nodeSelector on the class)
```

Times are seconds from the replay's start. A workload whose pod fits no node is
left out and counted (`larger_than_node`), as are repeats past the window
(`beyond_window`); anything else the file gets wrong is a `WorkloadError` that
names the field.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from sco.adapters.invalid import explain
from sco.lab.workload.swf import WorkloadError

Positive = Annotated[float, Field(gt=0)]
KUBELET_MAX_PODS = "110"  # a node's pods when the file does not say (the kubelet's default)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Service(_Strict):
    replicas: int = Field(ge=1)


class _Job(_Strict):
    pods: int = Field(ge=1)
    run_s: Positive


class _Entry(_Strict):
    name: str = Field(pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", max_length=40)
    service: _Service | None = None
    job: _Job | None = None
    cpu: str | float
    memory: str | float
    start_s: float = Field(default=0.0, ge=0)
    stop_s: Positive | None = None
    every_s: Positive | None = None
    guaranteed: bool = False

    @field_validator("cpu", "memory")
    @classmethod
    def _quantity(cls, v: str | float) -> str | float:
        _amount(v)
        return v


class _File(_Strict):
    node: dict[str, str | float]
    max_nodes: int | None = Field(default=None, ge=1)
    workloads: list[_Entry] = Field(min_length=1)

    @field_validator("node")
    @classmethod
    def _allocatable(cls, v: dict[str, str | float]) -> dict[str, str | float]:
        for name in ("cpu", "memory"):
            if name not in v:
                raise ValueError(f"needs {name}")
        for amount in v.values():
            _amount(amount)
        return v


def _amount(v: str | float) -> float:
    from sco.adapters.kubernetes.pods import quantity  # the `kubernetes` extra

    value = quantity(v)
    if value <= 0:
        raise ValueError(f"must be > 0, got {v!r}")
    return value


@dataclass(frozen=True, slots=True)
class PodWork:
    """One pod to run: a job's (it ends after `run_s` of work) or a service's replica
    (it runs from `start_s` until `stop_s`, None: the end)."""

    key: str  # workload/index, the ledger's name for it across restarts
    workload: str
    start_s: float
    cpu: str
    memory: str
    run_s: float | None = None  # None: a service's replica
    stop_s: float | None = None
    guaranteed: bool = False

    @property
    def is_job(self) -> bool:
        return self.run_s is not None


@dataclass
class KubeWorkload:
    pods: list[PodWork]  # by start
    node: dict[str, str]  # a node's allocatable
    max_nodes: int
    rules: Counter[str] = field(default_factory=Counter)
    entries: int = 0

    @property
    def span_s(self) -> float:
        return max((p.start_s for p in self.pods), default=0.0)

    def default_window_s(self) -> float:
        """Until the last pod could have ended (a day past the last start if only
        services run)."""
        ends = [p.start_s + (p.run_s or 0.0) for p in self.pods if p.is_job]
        ends += [p.stop_s for p in self.pods if p.stop_s is not None]
        return max([self.span_s + 86400.0 * (not ends), *ends])

    def summary(self) -> dict[str, int]:
        return {
            "workloads_read": self.entries,
            "pods_kept": len(self.pods),
            "job_pods": sum(p.is_job for p in self.pods),
            "service_replicas": sum(not p.is_job for p in self.pods),
            **dict(self.rules),
        }


def read_kube_workload(
    path: Path, days: float | None = None, max_nodes: int | None = None
) -> KubeWorkload:
    """`max_nodes` stands for the file's `max_nodes`."""
    try:
        doc = yaml.safe_load(path.read_text())
    except OSError as e:
        raise WorkloadError(f"{path}: cannot read: {e.strerror or e}") from e
    except yaml.YAMLError as e:
        raise WorkloadError(f"{path}: not YAML: {e}") from e
    try:
        spec = _File.model_validate(doc)
    except ValidationError as e:
        where, msg = explain(e, _File)
        raise WorkloadError(f"{path}: {'the file' if where == 'file' else where}: {msg}") from e
    window = None if days is None else days * 86400.0
    node = {"pods": KUBELET_MAX_PODS, **{k: str(v) for k, v in spec.node.items()}}
    workload = KubeWorkload([], node, 0, entries=len(spec.workloads))
    for entry in spec.workloads:
        _expand(entry, node, window, workload)
    if not workload.pods:
        raise WorkloadError(f"{path}: no pod to replay ({dict(workload.rules) or 'none'})")
    workload.pods.sort(key=lambda p: (p.start_s, p.key))
    workload.max_nodes = max_nodes or spec.max_nodes or peak_nodes(workload, window)
    return workload


def _expand(entry: _Entry, node: dict[str, str], window: float | None, into: KubeWorkload) -> None:
    if (entry.service is None) == (entry.job is None):
        raise WorkloadError(f"workload {entry.name}: give one of service or job")
    if _amount(entry.cpu) > _amount(node["cpu"]) or _amount(entry.memory) > _amount(node["memory"]):
        into.rules["larger_than_node"] += 1
        return
    starts = [entry.start_s]
    if entry.every_s is not None:
        bounds = [b for b in (window, entry.stop_s) if b is not None]
        if not bounds:
            raise WorkloadError(f"workload {entry.name}: every_s needs stop_s or --days")
        last = min(bounds)  # repeats end at stop_s, or with the window if that is sooner
        starts = [entry.start_s + k * entry.every_s for k in range(_times(entry, last))]
    count = entry.service.replicas if entry.service else entry.job.pods  # type: ignore[union-attr]
    for n, at in enumerate(starts):
        if window is not None and at >= window:
            into.rules["beyond_window"] += 1
            continue
        for k in range(count):
            into.pods.append(
                PodWork(
                    f"{entry.name}/{n}-{k}",
                    entry.name,
                    at,
                    str(entry.cpu),
                    str(entry.memory),
                    entry.job.run_s if entry.job else None,
                    entry.stop_s if entry.service else None,
                    entry.guaranteed,
                )
            )


def _times(entry: _Entry, last: float) -> int:
    assert entry.every_s is not None
    return max(1, math.ceil((last - entry.start_s) / entry.every_s))


def peak_nodes(workload: KubeWorkload, window: float | None, which: str = "peak") -> int:
    """Nodes the pods' requests fill at their peak (or on average over the window),
    each pod run from its start: what a static cluster is sized to."""
    cpu, mem = _amount(workload.node["cpu"]), _amount(workload.node["memory"])
    end = window if window is not None else workload.default_window_s()
    steps: list[tuple[float, float]] = []
    for p in workload.pods:
        share = max(_amount(p.cpu) / cpu, _amount(p.memory) / mem)
        stop = p.start_s + p.run_s if p.run_s is not None else (p.stop_s or end)
        steps += [(p.start_s, share), (min(stop, end), -share)]
    steps.sort()
    busy = peak = area = last = 0.0
    for t, delta in steps:
        area += busy * (min(t, end) - last)
        last = min(t, end)
        busy += delta
        peak = max(peak, busy)
    size = peak if which == "peak" else area / end if end else peak
    return max(1, math.ceil(size - 1e-9))


def is_kube_workload(path: Path) -> bool:
    return path.suffix.lower() in (".yaml", ".yml")
