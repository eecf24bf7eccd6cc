"""What Slurm's JSON says of jobs and nodes (OpenAPI v0.0.38, Slurm 22.05), read strictly.

A field that is missing or of the wrong type raises `SlurmBadOutput` naming the
tool and the field: sco never guesses at demand from output it cannot read.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from sco.decide.binpack import Size
from sco.domain.demand import CheckpointError, checkpoint_interval


class SlurmBadOutput(Exception):
    """A Slurm tool answered something that cannot be read; the message says where."""


# The longest hold Slurm puts on a requeued job that sco takes for Slurm's own: its
# credential's lifetime (AuthInfo cred_expire, 120 s by default) and then some. A job
# whose begin time is later was deferred by someone; a site whose cred_expire is longer
# than this waits out Slurm's hold.
REQUEUE_HOLD_MAX_S = 300.0


@dataclass(frozen=True, slots=True)
class Job:
    job_id: int
    state: str  # PENDING, RUNNING, CONFIGURING, COMPLETING
    reason: str  # why pending
    partition: str
    node_count: int
    per_node: Size  # what one of its nodes must hold
    features: str  # its --constraint expression, "" for none
    requeue: bool
    end_time: float | None  # when its time limit ends (running), None when unlimited
    nodes: tuple[str, ...]  # where it runs
    restarts: int = 0  # times it was requeued
    begin_time: float = 0.0  # when it may start (pending); 0: no begin time set
    limit_s: float | None = None  # its time limit; None: unlimited or not said
    comment: str = ""  # its --comment, where it may declare its checkpoints
    node_list: str = ""  # Slurm's NodeList as it says it (of a pending job: a stale one)

    @property
    def pending(self) -> bool:
        return self.state == "PENDING"

    def held_after_requeue(self, now: float) -> bool:
        """Requeued (by sco, its agent, an admin) and held back by Slurm for the
        credential's lifetime (`cred_expire`, 120 s by default): work that runs as soon
        as it may. A begin time further out than Slurm's hold is a deferral someone
        chose (`scontrol update StartTime=`), not Slurm's: the job is not held by a
        requeue, and sco leaves it alone."""
        return (
            self.pending
            and self.restarts > 0
            and self.reason == "BeginTime"
            and not self.deferred(now)
        )

    def deferred(self, now: float) -> bool:
        """Held to a begin time later than any hold of Slurm's own: someone's choice."""
        return self.begin_time > now + REQUEUE_HOLD_MAX_S

    def wants(self, feature: str) -> bool:
        """Whether its constraint names `feature` (as a whole word)."""
        return feature in re.split(r"[^A-Za-z0-9_.-]+", self.features)


_NOT_UP_STATES = frozenset({"down", "future", "unknown"})
_NOT_UP_FLAGS = frozenset({"NOT_RESPONDING", "POWERED_DOWN", "POWERING_UP"})


@dataclass(frozen=True, slots=True)
class SlurmNode:
    name: str
    state: str  # idle, allocated, mixed, down, ...
    flags: frozenset[str]  # DRAIN, NOT_RESPONDING, DYNAMIC_NORM, ...
    features: frozenset[str]
    reason: str
    cpus: int
    alloc_cpus: int
    memory_mb: int
    alloc_memory_mb: int
    partitions: tuple[str, ...]
    last_busy: float
    registered_at: float | None = None  # when its slurmd started (registered)
    # Read many times per cycle over thousands of nodes: worked out once, when read.
    draining: bool = field(init=False, compare=False, repr=False)  # told to drain
    busy: bool = field(init=False, compare=False, repr=False)  # jobs run there
    up: bool = field(init=False, compare=False, repr=False)  # can take work unless draining
    room: Size = field(init=False, compare=False, repr=False)  # CPUs and memory free

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: set once, here
        put(self, "draining", "DRAIN" in self.flags)
        # A node finishing a job (its epilog) reads `idle` with flag COMPLETING in
        # sinfo --json (Slurm 22.05), its CPUs already free: still busy.
        put(
            self,
            "busy",
            self.alloc_cpus > 0
            or self.state in ("allocated", "mixed", "completing")
            or "COMPLETING" in self.flags,
        )
        # Registered and reachable.
        put(self, "up", self.state not in _NOT_UP_STATES and not (self.flags & _NOT_UP_FLAGS))
        put(self, "room", Size(self.cpus - self.alloc_cpus, self.memory_mb - self.alloc_memory_mb))

    @property
    def drained(self) -> bool:
        """Told to drain, and nothing runs there any more."""
        return self.draining and not self.busy


# Slurm prints no integer wider than 64 bits; a wider one is not Slurm's (and not a float).
_INT_LIMIT = 2**64


def _get(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    if key not in doc:
        raise SlurmBadOutput(f"{where}: no {key!r}")
    value = doc[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise SlurmBadOutput(f"{where}: {key!r} is {type(value).__name__}, not the kind expected")
    return _in_range(value, key, where)


def _in_range(value: Any, key: str, where: str) -> Any:
    if isinstance(value, int) and not -_INT_LIMIT < value < _INT_LIMIT:
        raise SlurmBadOutput(f"{where}: {key!r} is out of range ({len(str(value))} digits)")
    return value


def _list(doc: Any, key: str, where: str) -> list[dict[str, Any]]:
    if not isinstance(doc, dict):
        raise SlurmBadOutput(f"{where}: not a JSON object")
    items: list[dict[str, Any]] = _get(doc, key, list, where)
    for k, item in enumerate(items):
        if not isinstance(item, dict):
            raise SlurmBadOutput(f"{where}: {key}[{k}] is not an object")
    errors = doc.get("errors") or []
    if errors:
        first = errors[0] if isinstance(errors, list) else errors
        raise SlurmBadOutput(f"{where}: the tool reported errors: {str(first)[:200]}")
    return items


# Optional fields: absent or null is the default; any other type is an error naming it.


def _opt(doc: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str) -> Any:
    value = doc.get(key)
    if value is None:
        return None
    if not isinstance(value, kind) or (isinstance(value, bool) and bool not in _kinds(kind)):
        raise SlurmBadOutput(f"{where}: {key!r} is {type(value).__name__}, not the kind expected")
    return _in_range(value, key, where)


def _kinds(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _opt_int(doc: dict[str, Any], key: str, where: str) -> int:
    return int(_opt(doc, key, int, where) or 0)


def _opt_time(doc: dict[str, Any], key: str, where: str) -> float:
    """A time in seconds since the epoch (an integer in Slurm's JSON); 0 when unset."""
    return float(_opt(doc, key, int, where) or 0)


def _opt_str(doc: dict[str, Any], key: str, where: str) -> str:
    return str(_opt(doc, key, str, where) or "")


def _opt_strings(doc: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    items = _opt(doc, key, list, where) or []
    if not all(isinstance(i, str) for i in items):
        raise SlurmBadOutput(f"{where}: {key!r} is not a list of strings")
    return tuple(items)


_TRES = re.compile(r"(\w+)=([0-9]+(?:\.[0-9]+)?)([KMGT]?)")
_UNIT_MB = {"": 1.0, "K": 1 / 1024, "M": 1.0, "G": 1024.0, "T": 1024.0 * 1024}


def _tres(text: str) -> dict[str, float]:
    """`cpu=4,mem=2000M,node=2` as numbers (memory in MB)."""
    out: dict[str, float] = {}
    for name, value, unit in _TRES.findall(text):
        out[name] = float(value) * (_UNIT_MB[unit] if name == "mem" else 1.0)
    return out


def _gres(text: str) -> dict[str, int]:
    """`gres:gpu:2` or `gpu:2,gres:nic:1` per node, as counts by name (a type is ignored)."""
    out: dict[str, int] = {}
    for part in filter(None, text.split(",")):
        fields = part.split(":")
        if fields and fields[0] == "gres":
            fields = fields[1:]
        if not fields:
            continue
        last = fields[-1]
        count = last if len(fields) > 1 and last.isascii() and last.isdigit() else "1"
        out[fields[0]] = out.get(fields[0], 0) + int(count)
    return out


# The states sco reads jobs in; squeue may list others (a job just cancelled, with
# its CPUs unset, under --nodelist), which say nothing of demand or of a node's work.
LIVE_STATES = frozenset({"PENDING", "RUNNING", "CONFIGURING", "COMPLETING"})


def parse_jobs(doc: Any, where: str) -> list[Job]:
    jobs: list[Job] = []
    for k, j in enumerate(_list(doc, "jobs", where)):
        at = f"{where}: jobs[{k}]"
        if _get(j, "job_state", str, at) not in LIVE_STATES:
            continue
        node_count = max(1, int(_get(j, "node_count", int, at)))
        cpus = float(_get(j, "cpus", int, at))
        tres = _tres(_opt_str(j, "tres_req_str", at))
        memory = tres.get("mem", 0.0)
        per_node_mem = j.get("memory_per_node")
        if isinstance(per_node_mem, int) and not isinstance(per_node_mem, bool):
            memory = float(_in_range(per_node_mem, "memory_per_node", at)) * node_count
        if not math.isfinite(memory):
            raise SlurmBadOutput(f"{at}: 'tres_req_str' has a memory of no finite size")
        limit = j.get("time_limit")
        end = _opt_time(j, "end_time", at)
        running = _get(j, "job_state", str, at) != "PENDING"
        resources = _opt(j, "job_resources", dict, at) or {}
        allocated = _opt(resources, "allocated_nodes", list, f"{at}.job_resources") or []
        nodes = tuple(
            str(n.get("nodename")) for n in allocated if isinstance(n, dict) and n.get("nodename")
        )
        jobs.append(
            Job(
                job_id=int(_get(j, "job_id", int, at)),
                state=str(j["job_state"]),
                reason=_opt_str(j, "state_reason", at),
                partition=str(_get(j, "partition", str, at)),
                node_count=node_count,
                per_node=Size(
                    cpus / node_count,
                    memory / node_count,
                    _gres(_opt_str(j, "tres_per_node", at)),
                ),
                features=_opt_str(j, "features", at),
                requeue=bool(j.get("requeue", True)),
                end_time=end if running and isinstance(limit, int) and end else None,
                nodes=nodes,
                restarts=_count(j.get("restart_cnt")),
                begin_time=_opt_time(j, "begin_time", at),
                limit_s=_limit_s(limit),
                comment=_opt_str(j, "comment", at),
                node_list=_opt_str(j, "nodes", at),
            )
        )
    return jobs


_UNLIMITED_MIN = 0xFFFFFFFE  # squeue's INFINITE (and NO_VAL) time limits, in minutes


def _limit_s(minutes: object) -> float | None:
    """A job's time limit (squeue gives minutes; a number, or {set, number} later)."""
    if isinstance(minutes, dict):
        minutes = minutes.get("number") if minutes.get("set", True) else None
    if isinstance(minutes, bool) or not isinstance(minutes, int):
        return None
    return 60.0 * minutes if 0 < minutes < _UNLIMITED_MIN else None


CHECKPOINT_KEY = "sco:checkpoint="  # in a job's --comment: `sco:checkpoint=30m`


def checkpoint_s(comment: str) -> float | None:
    """The checkpoint interval a job declares in its comment (`sco:checkpoint=<n>[s|m|h]`,
    among other words), None when it declares none. Raises CheckpointError naming
    what is wrong with a declaration that cannot be read."""
    words = [w for w in comment.split() if w.startswith(CHECKPOINT_KEY)]
    if not words:
        return None
    if len(words) > 1:
        raise CheckpointError(f"{' '.join(words)!r}: declared more than once")
    return checkpoint_interval(words[0][len(CHECKPOINT_KEY) :], words[0])


def _count(value: object) -> int:
    """An optional count Slurm may leave out (older releases) or send as a number."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def parse_nodes(doc: Any, where: str) -> list[SlurmNode]:
    nodes: list[SlurmNode] = []
    for k, n in enumerate(_list(doc, "nodes", where)):
        at = f"{where}: nodes[{k}]"
        features = _opt_str(n, "active_features", at) or _opt_str(n, "features", at)
        started = _opt_time(n, "slurmd_start_time", at)
        nodes.append(
            SlurmNode(
                name=str(_get(n, "name", str, at)),
                state=str(_get(n, "state", str, at)).lower(),
                flags=frozenset(_opt_strings(n, "state_flags", at)),
                features=frozenset(f for f in features.split(",") if f),
                reason=_opt_str(n, "reason", at),
                cpus=int(_get(n, "cpus", int, at)),
                alloc_cpus=_opt_int(n, "alloc_cpus", at),
                memory_mb=_opt_int(n, "real_memory", at),
                alloc_memory_mb=_opt_int(n, "alloc_memory", at),
                partitions=_opt_strings(n, "partitions", at),
                last_busy=_opt_time(n, "last_busy", at),
                registered_at=started or None,
            )
        )
    return nodes


@dataclass(frozen=True, slots=True)
class Allocation:
    """One run of a job as Slurm's accounting recorded it (a requeued job has several)."""

    job_id: int
    nodes: str  # a Slurm hostlist, e.g. `sco-ab[1-2],sco-cd`
    start: float
    end: float | None  # None while it runs


def parse_allocations(doc: Any, where: str) -> list[Allocation]:
    """`sacct --json` jobs that started (those that never ran held no node)."""
    out: list[Allocation] = []
    for k, j in enumerate(_list(doc, "jobs", where)):
        at = f"{where}: jobs[{k}]"
        times = _get(j, "time", dict, at)
        start = int(_get(times, "start", int, f"{at}.time"))
        end = int(_get(times, "end", int, f"{at}.time"))
        nodes = str(_get(j, "nodes", str, at))
        if start <= 0 or nodes in ("", "None assigned"):
            continue
        out.append(Allocation(int(_get(j, "job_id", int, at)), nodes, float(start),
                              float(end) if end > 0 else None))  # fmt: skip
    return out
