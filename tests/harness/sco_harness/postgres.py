"""A throwaway PostgreSQL server for tests, from the installed server binaries.

`scripts/postgres/install.sh` finds (or installs) the binaries. PostgreSQL
refuses to run as root, so the cluster is created and run as `postgres` when
the tests run as root. Trust authentication, loopback only, no fsync. The
server is registered with `sco_harness.services`: an interrupted test or bench
stops it.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

from sco_harness import services

ROOT = Path(__file__).resolve().parents[3]  # a checkout: tests/harness/sco_harness/
INSTALL = ROOT / "scripts" / "postgres" / "install.sh"


class PostgresServer:
    """One cluster in a folder of its own under the system temp directory (the
    `postgres` user must reach it, which pytest's private temp folders forbid),
    on a free loopback port."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="sco-postgres-"))
        self._registered = services.started(f"PostgreSQL in {self.folder}", self.stop)
        self.data = self.folder / "data"
        self.port = self.free_port()
        self._names = itertools.count(1)
        self._as: list[str] = []
        done = services.run(["bash", str(INSTALL)], timeout_s=600)
        if done.returncode != 0:
            raise RuntimeError(f"{INSTALL} failed:\n{done.stderr[-3000:]}")
        self.bin = Path(done.stdout.strip().splitlines()[-1])
        self._as = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @staticmethod
    def free_port() -> int:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
            return port

    def _run(self, *args: str) -> None:
        done = services.run([*self._as, *args], timeout_s=120)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")

    def start(self) -> PostgresServer:
        self.folder.mkdir(parents=True, exist_ok=True)
        if self._as:
            shutil.chown(self.folder, "postgres", "postgres")
        self._run(
            str(self.bin / "initdb"),
            "-D",
            str(self.data),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
        )
        options = (
            f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        self._run(
            str(self.bin / "pg_ctl"),
            "-D",
            str(self.data),
            "-l",
            str(self.folder / "server.log"),
            "-w",
            "-o",
            options,
            "start",
        )
        return self

    def stop(self) -> None:
        services.forget(self._registered)
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(self.bin / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = f"t{next(self._names)}_{int(time.time() * 1000) % 100000}"
        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
