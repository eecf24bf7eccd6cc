"""The shell the tour's reader types into, and what a check can read of the lab's world
besides what a command printed: Nova's servers, fleet state (SQLite, read-only, by
SQL of its own rather than sco's store), Slurm's nodes, the Kubernetes stand-in,
each process's /metrics and the lab's log."""

from __future__ import annotations

import json
import re
import sqlite3
import subprocess
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from sco_harness.lab import stack_of
from sco_harness.lab_plane import kube_url

_SAMPLE = re.compile(r"^(\w+)(?:\{(.*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class Moved:
    """One row of an instance's recorded history, with its server."""

    server: str
    partition: str
    pool: str
    at: float
    from_state: str | None
    to_state: str
    trigger: str | None
    code: str | None
    reason: str

    @property
    def created(self) -> bool:
        return self.from_state is None and self.to_state == "requested"


@dataclass
class Lab:
    """The shell the reader types into: its folder, its environment, what was seen."""

    root: Path
    env: dict[str, str]
    seen: dict[str, Any] = field(default_factory=dict)
    _nova: Any = None

    @property
    def folder(self) -> Path:
        return self.root / ".lab"

    def sh(self, commands: str, timeout_s: float = 600) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-e", "-c", commands], cwd=self.root, env=self.env, capture_output=True,
            text=True, timeout=timeout_s, check=False,
        )  # fmt: skip

    def source_env(self) -> None:
        """What `. .lab/env` leaves in the shell."""
        for line in (self.folder / "env").read_text().splitlines():
            if line.startswith("export "):
                key, _, value = line[len("export ") :].partition("=")
                self.env[key] = value

    def log(self) -> str:
        return (self.folder / "lab.log").read_text(errors="replace")

    def get(self, url: str) -> str:
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())

    # ---------------------------------------------------------------- the world

    def servers(self, partition: str | None = None) -> list[dict[str, Any]]:
        """Nova's servers of sco's (tagged), every project's, as the cloud lists them."""
        if self._nova is None:
            base = int(self.env["SCO_OS_BASE_PORT"])
            self._nova = stack_of(self.folder, base).connect()
        found = self._nova.servers(all_tenants="1", tags="sco")
        return [s for s in found if partition in (None, meta(s).get("sco:partition"))]

    def sql(self, query: str, *args: Any) -> list[sqlite3.Row]:
        """Rows of fleet state (the lab's is a SQLite file), read-only."""
        url = yaml.safe_load((self.folder / "sco.yaml").read_text())["state"]["url"]
        path = self.folder / url.removeprefix("sqlite:///")
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            db.row_factory = sqlite3.Row
            return db.execute(query, args).fetchall()
        finally:
            db.close()

    def history(self, partition: str, since: float = 0.0) -> list[Moved]:
        """The partition's recorded transitions from `since`, oldest first."""
        rows = self.sql(
            "SELECT coalesce(i.server_id, '') AS server, h.partition, h.pool, h.at, "
            "h.from_state, h.to_state, h.`trigger`, h.code, h.reason "
            "FROM instance_history h LEFT JOIN instances i ON i.id = h.instance_id "
            "WHERE h.partition = ? AND h.at >= ? ORDER BY h.at, h.id",
            partition, since,
        )  # fmt: skip
        return [Moved(**dict(r)) for r in rows]

    def plans(self, partition: str) -> list[dict[str, Any]]:
        """The partition's plans in fleet state, oldest first."""
        rows = self.sql(
            "SELECT generation, created_at, notes, terms, pools FROM plans "
            "WHERE partition = ? ORDER BY generation",
            partition,
        )
        return [
            {
                "generation": r["generation"], "created_at": r["created_at"],
                "notes": json.loads(r["notes"]), "terms": json.loads(r["terms"]),
                "pools": json.loads(r["pools"]),
            }
            for r in rows
        ]  # fmt: skip

    def metrics(self, url: str) -> list[Sample]:
        out = []
        for line in self.get(f"{url}/metrics").splitlines():
            m = _SAMPLE.match(line)
            if m and not line.startswith("#"):
                out.append(Sample(m[1], dict(_LABEL.findall(m[2] or "")), float(m[3])))
        return out

    def slurm_node(self, node: str) -> dict[str, str]:
        """`scontrol show node`'s State and Reason (without who set it, and when)."""
        shown = self.sh(f"scontrol show node {node}").stdout
        state = re.search(r"\bState=(\S+)", shown)
        reason = re.search(r"\bReason=(.*?)(?: \[[^]]*\])?$", shown, re.M)
        return {"state": state[1] if state else "", "reason": reason[1] if reason else ""}

    def kube(self, kind: str) -> list[dict[str, Any]]:
        """The Kubernetes stand-in's objects of `kind` (pods, nodes), every namespace."""
        items = json.loads(self.get(f"{kube_url(self.folder)}/api/v1/{kind}"))["items"]
        return list(items)


def meta(server: dict[str, Any]) -> dict[str, str]:
    return dict(server.get("metadata") or {})
