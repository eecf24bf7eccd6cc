"""A distributor replica killed (SIGKILL) while agents follow their contracts.

Three `sco distributor` replicas on PostgreSQL (LISTEN/NOTIFY) behind one
address (`sco_harness.faults.balancer`, as a Service), and one `sco agent`
process per instance long-polling through it, with a drain command. Reclaim
notices land one a second (in fleet state, as the controllers record them),
before the kill, while the replica is down and after it is back: each agent
must drain and acknowledge its notice before the notice's deadline.

Measured from the real state and the agents' own logs:
- lost_events: notices whose acknowledgement fleet state does not hold by the
  notice's deadline (a contract that did not reach its node in time);
- lost_transitions: breaks in the instances' history chains (the notices are
  transitions); duplicate_creates and leaked_servers: sco_harness.chaos.audit of
  fleet state against the cloud, which has no server here (no provider in this
  scenario's path);
- details: the agents' failed contract reads and acknowledgements after the kill
  (their log lines), the agents the kill cut off, each notice's delivery time
  (its commit to its acknowledgement) and the late ones;
- recovery_s: from the kill to every agent the kill cut off having a contract
  read answered again (200 or 304, as its log shows; a long poll answers within
  the agents' `--wait`).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import yaml

from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.contracts import token_digest
from sco.domain.instances import Instance, created, step
from sco.domain.lifecycle import State, Trigger
from sco_harness.builders import instance, spot_pool
from sco_harness.chaos import audit
from sco_harness.controlplane import wait_for
from sco_harness.faults import FaultResult
from sco_harness.faults.balancer import Balancer
from sco_harness.openstack_stack import ROOT, free_port
from sco_harness.postgres import PostgresServer

REPLICAS = 3
WAIT_S = 3.0  # the agents' long poll
NOTICE_S = 20.0  # each notice's deadline, from its commit
LATE_S = 5.0  # a notice heard later than this after its commit is late
POOL = spot_pool(zone="a")
_LINE = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (\w+) agent (\S+): (.*)$")
_ANSWER = re.compile(r'GET \S+/v1/contract\S* "HTTP/1\.1 (\d{3})')


def log(msg: str) -> None:
    print(f"[faults/distributor] {msg}", file=sys.stderr, flush=True)


@dataclass
class _Agent:
    instance: Instance
    token: str
    proc: subprocess.Popen[bytes]
    log: Path
    state: Path


@dataclass
class _Notice:
    instance_id: str
    version: int
    at: float
    deadline: float


def run(folder: Path, *, short: bool = False) -> list[FaultResult]:
    agents_n = 12 if short else 24
    down_s = 10.0 if short else 30.0
    folder.mkdir(parents=True, exist_ok=True)
    pg = PostgresServer().start()
    store: SqlFleetStore | None = None
    replicas: dict[int, subprocess.Popen[bytes]] = {}
    agents: list[_Agent] = []
    balancer: Balancer | None = None
    try:
        url = pg.new_database()
        store = SqlFleetStore(url)
        store.upsert_pools([POOL])
        fleet = _fleet(store, agents_n)
        config = folder / "sco.yaml"
        config.write_text(
            yaml.safe_dump(
                {
                    "state": {"url": url},
                    "distributor": {"bind": "127.0.0.1", "max_wait_s": 30, "poll_s": 1.0},
                    "log": {"level": "info"},
                }
            )
        )
        ports = [free_port() for _ in range(REPLICAS)]
        for port in ports:
            replicas[port] = _replica(folder, config, port)
        for port in ports:
            _wait_ready(port, replicas[port])
        balancer = Balancer(ports).start()
        for k, (inst, token) in enumerate(fleet):
            agents.append(_agent(folder, balancer.url, k, inst, token))
        wait_for(
            lambda: all(a.state.exists() for a in agents), 120, "every agent holding its contract"
        )
        log(f"{REPLICAS} replicas, {agents_n} agents long-polling through {balancer.url}")
        result = _fault(store, replicas, ports, agents, balancer, folder, config, down_s)
        log(str(result.as_dict()))
        return [result]
    finally:
        for a in agents:
            _stop(a.proc)
        for p in replicas.values():
            _stop(p)
        if balancer is not None:
            balancer.stop()
        if store is not None:
            store.close()
        pg.stop()


def _fault(
    store: SqlFleetStore,
    replicas: dict[int, subprocess.Popen[bytes]],
    ports: list[int],
    agents: list[_Agent],
    balancer: Balancer,
    folder: Path,
    config: Path,
    down_s: float,
) -> FaultResult:
    victim = ports[0]
    before = len(agents) // 4  # notices before the kill; the rest while down and after
    every_s = (down_s + 5.0) / max(1, len(agents) - before)
    notices: list[_Notice] = []
    for a in agents[:before]:
        notices.append(_notice(store, a.instance))
        time.sleep(1.0)
    killed = time.time()
    replicas[victim].send_signal(signal.SIGKILL)
    replicas[victim].wait()
    log(f"replica :{victim} killed (SIGKILL)")
    restarted: float | None = None
    for a in agents[before:]:
        if restarted is None and time.time() - killed >= down_s:
            restarted = _restart(replicas, folder, config, victim)
        notices.append(_notice(store, a.instance))
        time.sleep(every_s)
    if restarted is None:
        time.sleep(max(0.0, killed + down_s - time.time()))
        restarted = _restart(replicas, folder, config, victim)
    acks = wait_for(
        lambda: _acks_settled(store, notices), NOTICE_S + 10, "every notice acknowledged or due"
    )
    time.sleep(WAIT_S + 1)  # every agent's next answer is in its log
    lost = [n for n in notices if not _acked_in_time(acks.get(n.instance_id), n)]
    delivery = sorted(
        acks[n.instance_id][2] - n.at for n in notices if _acked_in_time(acks.get(n.instance_id), n)
    )
    reads = {a.instance.id: _reads(a.log) for a in agents}
    failed = {i: [t for t, ok in r if not ok and t >= killed] for i, r in reads.items()}
    cut = {i: f for i, f in failed.items() if f}
    back: dict[str, float | None] = {
        i: next((t for t, ok in reads[i] if ok and t > max(f)), None) for i, f in cut.items()
    }
    never = sorted(i for i, t in back.items() if t is None)
    recovered_at = max((t for t in back.values() if t is not None), default=killed)
    found = audit(store.url, [])
    return FaultResult(
        fault="distributor_replica_killed",
        recovery_s=max(0.0, recovered_at - killed) if not never else float("inf"),
        recovered_when="every agent the kill cut off had a contract read answered again "
        "(200 or 304 in its log; agents long-poll with --wait 3)",
        lost_transitions=found["lost_transitions"],
        lost_events=len(lost),
        duplicate_creates=found["duplicate_creates"],
        leaked_servers=found["leaked_servers"],
        stalled_partitions=0,
        details={
            "replicas": REPLICAS,
            "agents": len(agents),
            "down_s": round(restarted - killed, 1),
            "agents_cut_off": len(cut),
            "agents_never_back": never,
            "failed_reads_after_kill": sum(len(f) for f in failed.values()),
            "failed_acks_after_kill": sum(_failed_acks(a.log, killed) for a in agents),
            "notices": len(notices),
            "notices_acked_in_time": len(notices) - len(lost),
            "notice_delivery_p50_s": round(statistics.median(delivery), 2) if delivery else None,
            "notice_delivery_max_s": round(delivery[-1], 2) if delivery else None,
            "late_notices": sum(1 for d in delivery if d > LATE_S),
            "restarted_replica_serves": _serves(victim, agents[0].token),
            "connections_per_replica": {str(p): balancer.connections[p] for p in ports},
            "partitions": "none in this scenario's path (contracts are written as the "
            "controllers write them); no cloud either, so the audit's server counts are of none",
        },
    )


# ---------------------------------------------------------------- the fleet


def _fleet(store: SqlFleetStore, n: int) -> list[tuple[Instance, str]]:
    """`n` READY instances, each with its contract and a node token."""
    now = time.time()
    instances = [instance(POOL, State.READY, created_at=now - 60) for _ in range(n)]
    store.record([created(i, "faults") for i in instances])
    tokens = [secrets.token_urlsafe(32) for _ in instances]
    for i, t in zip(instances, tokens, strict=True):
        if not store.contracts.set_token(i.id, token_digest(t), now + 86400, now):
            raise RuntimeError(f"no contract for {i.id}")
    return list(zip(instances, tokens, strict=True))


def _notice(store: SqlFleetStore, inst: Instance) -> _Notice:
    """A reclaim notice, recorded as a controller records it; the contract version it made."""
    now = time.time()
    store.record(
        [
            step(
                inst,
                Trigger.RECLAIM_NOTICE,
                now,
                "faults: reclaim notice",
                notice_deadline=now + NOTICE_S,
            )
        ]
    )
    row = store.contracts.get(inst.id)
    assert row is not None
    return _Notice(inst.id, row.version, now, now + NOTICE_S)


def _acks_settled(
    store: SqlFleetStore, notices: list[_Notice]
) -> dict[str, tuple[int | None, str | None, float]] | None:
    """instance -> (ack version, status, ack time) once every notice is acknowledged or
    past its deadline."""
    rows = store.contracts.get_many([n.instance_id for n in notices])
    acks = {
        i: (r.ack_version, str(r.ack_status) if r.ack_status else None, r.ack_at or 0.0)
        for i, r in rows.items()
    }
    now = time.time()
    pending = [
        n
        for n in notices
        if acks.get(n.instance_id, (None, None, 0.0))[0] != n.version and now < n.deadline
    ]
    return None if pending else acks


def _acked_in_time(ack: tuple[int | None, str | None, float] | None, n: _Notice) -> bool:
    return ack is not None and ack[0] == n.version and ack[1] == "drained" and ack[2] <= n.deadline


# ---------------------------------------------------------------- processes


def _sco(folder: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "sco.apps.cli", *args],
        cwd=ROOT,
        stdout=(folder / f"{name}.log").open("ab"),
        stderr=subprocess.STDOUT,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
    )


def _replica(folder: Path, config: Path, port: int) -> subprocess.Popen[bytes]:
    return _sco(
        folder, f"distributor-{port}", "distributor", "--config", str(config), "--port", str(port)
    )


def _restart(
    replicas: dict[int, subprocess.Popen[bytes]], folder: Path, config: Path, port: int
) -> float:
    at = time.time()
    replicas[port] = _replica(folder, config, port)
    _wait_ready(port, replicas[port])
    log(f"replica :{port} restarted, ready in {time.time() - at:.1f} s")
    return at


def _wait_ready(port: int, proc: subprocess.Popen[bytes]) -> None:
    def ready() -> bool:
        if proc.poll() is not None:
            raise RuntimeError(f"distributor :{port} exited {proc.returncode}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait_for(ready, 60, f"distributor :{port} ready")


def _agent(folder: Path, url: str, k: int, inst: Instance, token: str) -> _Agent:
    token_file = folder / f"token-{k}"
    token_file.write_text(token)
    state = folder / f"agent-{k}.json"
    proc = _sco(
        folder, f"agent-{k}", "agent", "--distributor", url, "--token-file", str(token_file),
        "--state-file", str(state), "--drain-command", "/bin/true", "--wait", str(WAIT_S),
        "--log-level", "info",
    )  # fmt: skip
    return _Agent(inst, token, proc, folder / f"agent-{k}.log", state)


def _serves(port: int, token: str) -> bool:
    """Whether the replica answers a node's contract read (directly, not through the
    balancer: the agents keep the connections they have)."""
    try:
        r = httpx.get(
            f"http://127.0.0.1:{port}/v1/contract",
            headers={"Authorization": f"Bearer {token}"},
            timeout=5,
        )
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            proc.kill()
        proc.wait()


# ---------------------------------------------------------------- the agents' logs


def _entries(path: Path) -> list[tuple[float, str, str]]:
    out = []
    for line in path.read_text(errors="replace").splitlines():
        m = _LINE.match(line)
        if m is not None:
            at = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            out.append((at, m[3], m[4]))
    return out


def _reads(path: Path) -> list[tuple[float, bool]]:
    """(when, answered) for each contract read the agent logged: an answer (200 or
    304, httpx's line) or a failure (the agent's warning)."""
    out = []
    for at, logger, msg in _entries(path):
        answer = _ANSWER.search(msg) if logger == "httpx" else None
        if answer is not None:
            if answer[1] in ("200", "304"):
                out.append((at, True))
        elif msg.startswith(("agent: distributor unreachable", "agent: distributor answered")):
            out.append((at, False))
    return out


def _failed_acks(path: Path, since: float) -> int:
    return sum(
        1
        for at, _, msg in _entries(path)
        if at >= since
        and msg.startswith(("agent: acknowledgement not delivered", "agent: acknowledgement answ"))
    )
