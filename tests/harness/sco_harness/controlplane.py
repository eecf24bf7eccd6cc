"""The whole control plane as separate OS processes, and what to measure of it.

`ControlPlaneRun` writes one `sco.yaml` and starts `sco run` replicas, `sco
watch`, `sco score --every` and `sco history load` from it, each logging to a
file of its own and serving `/metrics`; `bench/controlplane.py` and the Nova
tier's test drive it. Each process runs in a session of its own, and the run is
registered with `sco_harness.services`, so an interrupted bench stops them. The
audit helpers read fleet state, the Kafka topic and pool history to tell
whether every committed event reached both.
"""

from __future__ import annotations

import math
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from sqlalchemy import create_engine, text

from sco_harness import services


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    port: int | None


@dataclass
class ControlPlaneRun:
    folder: Path
    config: dict[str, Any]
    env: dict[str, str]
    procs: dict[str, Proc] = field(default_factory=dict)
    _registered: services.Started | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        self.config_file = self.folder / "sco.yaml"
        self.config_file.write_text(yaml.safe_dump(self.config, sort_keys=False))

    def start(
        self, name: str, *args: str, port: int | None = None, env: dict[str, str] | None = None
    ) -> Proc:
        """`env`: this process's own additions to the run's environment."""
        if self._registered is None:
            self._registered = services.started(f"sco processes in {self.folder}", self.stop_all)
        log = self.folder / f"{name}.log"
        popen = services.spawn(
            [sys.executable, "-m", "sco.apps.cli", *args, "--config", str(self.config_file)],
            log=log,
            env=self.env | (env or {}),
        )
        proc = Proc(name, popen, log, port)
        self.procs[name] = proc
        return proc

    def metrics(self, name: str) -> str:
        port = self.procs[name].port
        return "" if port is None else scrape(port)

    def alive(self) -> dict[str, int | None]:
        return {n: p.popen.poll() for n, p in self.procs.items()}

    def stop(self, name: str, timeout_s: float = 60.0) -> int:
        """SIGTERM, as an orchestrator stops a process; its exit status."""
        return services.stop_group(self.procs[name].popen, signal.SIGTERM, timeout_s)

    def stop_all(self, order: list[str] | None = None) -> dict[str, int]:
        names = order or list(self.procs)
        codes = {n: self.stop(n) for n in names if n in self.procs}
        if all(p.popen.poll() is not None for p in self.procs.values()):
            services.forget(self._registered)
            self._registered = None
        return codes

    def dead(self) -> str:
        """The processes that exited, each with its status and log tail ("" if none):
        a test's failure message that says which died and why."""
        return "\n".join(
            f"--- {n} exited {code}:\n{self.tail(n)}"
            for n, code in self.alive().items()
            if code is not None
        )

    def tail(self, name: str, lines: int = 40) -> str:
        return "\n".join(self.procs[name].log.read_text(errors="replace").splitlines()[-lines:])


def wait_for(check: Any, timeout_s: float, what: str, every_s: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:.0f} s waiting for {what}")
        time.sleep(every_s)


# ---------------------------------------------------------------- reading metrics


def scrape(port: int) -> str:
    """The /metrics of a process on this port ("" while it does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def sample(metrics_text: str, name: str, **labels: str) -> float | None:
    """One sample's value from Prometheus text, or None."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in metrics_text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head == name and not want:
            return float(value)
        if head.startswith(name + "{"):
            got = ",".join(sorted(head[len(name) + 1 : -1].split(",")))
            if got == want:
                return float(value)
    return None


def excluded_anywhere(metrics_text: str, pool: str) -> bool:
    """Whether any partition of this process plans `pool` as excluded or degraded."""
    needle = f'pool="{pool}"'
    return any(
        line.startswith("sco_pool_excluded{") and needle in line and line.endswith(" 1.0")
        for line in metrics_text.splitlines()
    )


def histogram_quantile(texts: list[str], name: str, q: float, **labels: str) -> float | None:
    """`histogram_quantile` over every series of `name` (with `labels`, if given) in
    several processes' metrics: buckets merged, linear within the bucket, as Prometheus
    computes it."""
    buckets: dict[float, float] = {}
    want = [f'{k}="{v}"' for k, v in labels.items()]
    for t in texts:
        for line in t.splitlines():
            if not line.startswith(f"{name}_bucket{{"):
                continue
            if any(w not in line for w in want):
                continue
            head, _, value = line.rpartition(" ")
            le = head.split('le="', 1)[1].split('"', 1)[0]
            bound = math.inf if le == "+Inf" else float(le)
            buckets[bound] = buckets.get(bound, 0.0) + float(value)
    if not buckets or buckets.get(math.inf, 0.0) == 0:
        return None
    bounds = sorted(buckets)
    total = buckets[math.inf]
    rank = q * total
    lower, below = 0.0, 0.0
    for b in bounds:
        if buckets[b] >= rank:
            if math.isinf(b):
                return lower
            width = buckets[b] - below
            return lower + (b - lower) * ((rank - below) / width if width else 1.0)
        lower, below = b, buckets[b]
    return lower


# ---------------------------------------------------------------- audits


def committed_events(url: str) -> set[str]:
    """Every event id the control plane committed with a state change: one per recorded
    transition (`<instance>:<version>`) and one per exclusion written."""
    engine = create_engine(url)
    try:
        with engine.connect() as c:
            per_instance = c.execute(
                text("SELECT instance_id, count(*) FROM instance_history GROUP BY instance_id")
            ).all()
            exclusions = c.execute(text("SELECT pool, version FROM exclusions")).all()
    finally:
        engine.dispose()
    ids = {f"{inst}:{v}" for inst, n in per_instance for v in range(int(n))}
    ids |= {f"exclusion:{pool}:{v}" for pool, version in exclusions for v in range(1, version + 1)}
    return ids


def topic_event_ids(bootstrap: str, prefix: str, idle_s: float = 5.0) -> list[str]:
    """Every event id in the region topics, read from the start by a group of its own
    (a list: an id appears as often as it was appended)."""
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"audit-{uuid.uuid4().hex}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "session.timeout.ms": 6000,
        }
    )
    consumer.subscribe(["^" + prefix.replace(".", r"\.") + ".*"])
    ids: list[str] = []
    last = time.monotonic()
    try:
        while time.monotonic() - last < idle_s:
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is not None or msg.topic() == prefix + "dead-letters":
                    continue
                headers = dict(msg.headers() or [])
                raw = headers.get("event_id")
                ids.append(raw.decode() if isinstance(raw, bytes) else str(raw))
                last = time.monotonic()
    finally:
        consumer.close()
    return ids


# ---------------------------------------------------------------- the run both drive

REPLICAS = ("ra", "rb")


def start_control_plane(
    run: ControlPlaneRun,
    score_every: str,
    replicas: Sequence[str] = REPLICAS,
    scorer_in_loader: bool = False,
) -> None:
    """`sco run` replicas (two unless named), `sco watch`, `sco history load` and `sco
    score --every`, each serving /metrics on a free port; `scorer_in_loader`: `sco
    history load --score-every` instead of a scorer of its own (chDB, for good)."""
    from sco_harness.kafka_broker import free_port

    for name in replicas:
        port = free_port()
        run.start(name, "run", "--replica", name, "--metrics-port", str(port), port=port)
    processes = [("watch", ["watch"])]
    if scorer_in_loader:
        processes.append(("history", ["history", "load", "--score-every", score_every]))
    else:
        processes += [
            ("history", ["history", "load"]),
            ("score", ["score", "--every", score_every]),
        ]
    for name, args in processes:
        port = free_port()
        run.start(name, *args, "--port", str(port), port=port)


def spot_servers(servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The ACTIVE spot servers sco created, of a Nova listing."""
    return [
        s for s in servers if s["metadata"].get("sco:class") == "spot" and s["status"] == "ACTIVE"
    ]


def exclusion_since(url: str, pool: str, timeout_s: float) -> float:
    """When the watcher excluded `pool` (its crossing, by the watcher's clock)."""
    engine = create_engine(url)

    def since() -> Any:
        with engine.connect() as c:
            return c.execute(
                text("SELECT since FROM exclusions WHERE pool = :p AND state = 'excluded'"),
                {"p": pool},
            ).first()

    try:
        return float(wait_for(since, timeout_s, f"the watcher's exclusion of {pool}")[0])
    finally:
        engine.dispose()


def acting_on(run: ControlPlaneRun, pool: str, timeout_s: float) -> dict[str, float]:
    """When each replica first planned with `pool` excluded (its /metrics say so)."""
    seen: dict[str, float] = {}

    def all_act() -> bool:
        if any(run.alive().get(name) is not None for name in REPLICAS):
            raise AssertionError(f"a replica exited:\n{run.dead()}")
        for name in REPLICAS:
            if name not in seen and excluded_anywhere(run.metrics(name), pool):
                seen[name] = time.time()
        return len(seen) == len(REPLICAS)

    wait_for(all_act, timeout_s, "every replica acting on the exclusion", every_s=0.05)
    return seen


def stop_and_audit(
    run: ControlPlaneRun,
    url: str,
    history_url: str,
    bootstrap: str,
    prefix: str,
    replicas: Sequence[str] = REPLICAS,
) -> dict[str, Any]:
    """Stop the replicas first (they relay what is left), wait for history to hold every
    committed event, stop the rest; then what reached the topic and history."""
    from sco.adapters.clickhouse.history import ClickHouseHistory

    codes = run.stop_all(list(replicas))
    committed = committed_events(url)
    history = ClickHouseHistory(history_url)
    try:
        wait_for(lambda: committed <= history.event_ids(), 120, "history to hold every event")
        codes |= run.stop_all(["watch", "history", "score"])
        in_history = history.event_ids()
    finally:
        history.close()
    in_topic = topic_event_ids(bootstrap, prefix)
    reached = set(in_topic) & in_history
    return {
        "exit_codes": codes,
        "events_committed": len(committed),
        "events_in_topic": len(committed & set(in_topic)),
        "topic_records": len(in_topic),
        "events_in_history": len(committed & in_history),
        "lost_events": len(committed - reached),
        "lost_ids": sorted(committed - reached)[:10],
    }


def ready_servers(url: str) -> set[str]:
    """Server ids fleet state holds as READY: what the controllers have seen join."""
    from sqlalchemy.exc import ProgrammingError

    engine = create_engine(url)
    try:
        with engine.connect() as c:
            rows = c.execute(
                text("SELECT server_id FROM instances WHERE state = 'ready' AND server_id <> ''")
            ).all()
    except ProgrammingError:
        return set()  # not migrated yet: the controllers are starting
    finally:
        engine.dispose()
    return {r[0] for r in rows if r[0]}
