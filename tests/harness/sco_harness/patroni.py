"""A two-node Patroni cluster on etcd with synchronous replication, for failover tests.

Everything runs on loopback from one folder under the system temp directory,
as the `postgres` user (PostgreSQL refuses root). `kill_primary` kills the
primary's Patroni and PostgreSQL together with SIGKILL, as a lost node would
be; the synchronous replica is promoted once the leader key expires (ttl 10 s).
The cluster is registered with `sco_harness.services`: an interrupted test or
bench stops it, even half-started.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import yaml

from sco_harness import services
from sco_harness.openstack_stack import steady_port

ROOT = Path(__file__).resolve().parents[3]  # a checkout: tests/harness/sco_harness/
INSTALL = ROOT / "scripts" / "postgres" / "install-patroni.sh"


def _kill_postmaster(node: Node) -> None:
    pid_file = node.data / "postmaster.pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError, ValueError, FileNotFoundError):
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGKILL)


def _port() -> int:
    # Its PostgreSQL comes back on its port after a failover: out of the ephemeral range.
    return steady_port()


@dataclass
class Node:
    name: str
    pg_port: int
    api_port: int
    data: Path
    config: Path
    proc: subprocess.Popen[bytes] | None = None

    def role(self) -> str:
        """'primary', 'sync' (the synchronous replica), 'replica', or 'down'."""
        for path, role in (("/primary", "primary"), ("/sync", "sync"), ("/replica", "replica")):
            try:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{self.api_port}{path}", timeout=1
                ) as r:
                    if r.status == 200:
                        return role
            except OSError:
                continue
        return "down"


class PatroniCluster:
    def __init__(self) -> None:
        done = services.run(["bash", str(INSTALL)], timeout_s=900)
        if done.returncode != 0:
            raise RuntimeError(f"{INSTALL} failed:\n{done.stderr[-3000:]}")
        self.bin = Path(done.stdout.strip().splitlines()[-1])
        self.folder = Path(tempfile.mkdtemp(prefix="sco-patroni-"))
        self.etcd_port = _port()
        self.etcd: subprocess.Popen[bytes] | None = None
        self.nodes = [self._node(f"node{i}") for i in (1, 2)]
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        self._registered = services.started(f"Patroni in {self.folder}", self.stop)

    def _node(self, name: str) -> Node:
        return Node(
            name, _port(), _port(), self.folder / name / "data", self.folder / f"{name}.yml"
        )

    def url(self, database: str = "postgres") -> str:
        """Every member, and libpq picks the writable one."""
        hosts = "&".join(f"host=127.0.0.1:{n.pg_port}" for n in self.nodes)
        return f"postgresql+psycopg://postgres@/{database}?{hosts}&target_session_attrs=read-write"

    # ------------------------------------------------------------ start and stop

    def start(self, timeout_s: float = 120) -> PatroniCluster:
        if self._as:
            shutil.chown(self.folder, "postgres", "postgres")
        peer = _port()
        log = (self.folder / "etcd.log").open("wb")
        self.etcd = subprocess.Popen(
            [
                "etcd",
                "--name",
                "sco",
                "--data-dir",
                str(self.folder / "etcd"),
                "--unsafe-no-fsync",
                "--listen-client-urls",
                f"http://127.0.0.1:{self.etcd_port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{self.etcd_port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"sco=http://127.0.0.1:{peer}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        for node in self.nodes:
            self._write_config(node)
            self.launch(node)
            if node is self.nodes[0]:
                self._wait(lambda: self.nodes[0].role() == "primary", timeout_s, "a primary")
        self._wait(lambda: self.roles() == {"primary", "sync"}, timeout_s, "a sync replica")
        return self

    def _write_config(self, node: Node) -> None:
        (self.folder / node.name).mkdir(exist_ok=True)
        if self._as:
            shutil.chown(self.folder / node.name, "postgres", "postgres")
        config = {
            "scope": "sco",
            "name": node.name,
            "restapi": {
                "listen": f"127.0.0.1:{node.api_port}",
                "connect_address": f"127.0.0.1:{node.api_port}",
            },
            "etcd3": {"hosts": f"127.0.0.1:{self.etcd_port}"},
            "bootstrap": {
                "dcs": {
                    "ttl": 10,
                    "loop_wait": 1,
                    "retry_timeout": 3,
                    "synchronous_mode": True,
                    "postgresql": {"use_pg_rewind": False},
                },
                "initdb": [{"encoding": "UTF8"}, {"auth": "trust"}],
                "pg_hba": [
                    "local all all trust",
                    "host all all 127.0.0.1/32 trust",
                    "host replication all 127.0.0.1/32 trust",
                ],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{node.pg_port}",
                "connect_address": f"127.0.0.1:{node.pg_port}",
                "data_dir": str(node.data),
                "bin_dir": str(self.bin),
                "pgpass": str(self.folder / node.name / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": "sco"},
                    "replication": {"username": "replicator", "password": "sco"},
                },
                "parameters": {
                    "unix_socket_directories": str(self.folder / node.name),
                    "max_connections": 200,
                },
            },
        }
        node.config.write_text(yaml.safe_dump(config))

    def launch(self, node: Node) -> None:
        log = (self.folder / f"{node.name}.log").open("ab")
        node.proc = subprocess.Popen(
            [*self._as, "patroni", str(node.config)],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def roles(self) -> set[str]:
        return {n.role() for n in self.nodes}

    def primary(self) -> Node:
        for n in self.nodes:
            if n.role() == "primary":
                return n
        raise RuntimeError("no primary")

    def kill_primary(self) -> Node:
        """SIGKILL the primary's Patroni and its PostgreSQL: the node is lost."""
        node = self.primary()
        assert node.proc is not None
        os.killpg(node.proc.pid, signal.SIGKILL)
        _kill_postmaster(node)
        node.proc.wait(timeout=30)
        return node

    def stop(self) -> None:
        services.forget(self._registered)
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                os.killpg(node.proc.pid, signal.SIGTERM)
                try:
                    node.proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(node.proc.pid, signal.SIGKILL)
            _kill_postmaster(node)
        if self.etcd is not None:
            os.killpg(self.etcd.pid, signal.SIGKILL)
            self.etcd.wait(timeout=30)
        shutil.rmtree(self.folder, ignore_errors=True)

    @staticmethod
    def _wait(check: object, timeout_s: float, what: str) -> None:
        assert callable(check)
        deadline = time.monotonic() + timeout_s
        while not check():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Patroni: no {what} after {timeout_s:.0f} s")
            time.sleep(0.5)
