"""`sco distributor` as the process users run, serving HTTPS with the certificate in
sco.yaml; `sco agent` trusting it through --ca-file."""

from __future__ import annotations

import secrets
import ssl
import subprocess
import sys
import time
from pathlib import Path

import httpx
import yaml

from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.domain.contracts import token_digest
from sco.domain.instances import created
from sco.domain.lifecycle import State
from sco_harness.builders import instance, spot_pool
from sco_harness.controlplane import wait_for
from sco_harness.openstack_stack import ROOT, free_port

POOL = spot_pool(zone="a")


def _certificate(folder: Path) -> tuple[Path, Path]:
    cert, key = folder / "tls.crt", folder / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=sco-distributor", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    return cert, key


def test_contracts_over_tls_to_an_agent_that_trusts_the_ca(tmp_path: Path) -> None:
    cert, _key = _certificate(tmp_path)
    store = SqlFleetStore(sqlite_url(tmp_path / "state.db"))
    store.upsert_pools([POOL])
    inst = instance(POOL, State.READY)
    store.record([created(inst, "seeded")])
    token = secrets.token_urlsafe(32)
    store.contracts.set_token(inst.id, token_digest(token), time.time() + 3600, time.time())
    (tmp_path / "token").write_text(token)
    port = free_port()
    config = tmp_path / "sco.yaml"
    config.write_text(yaml.safe_dump({
        "state": {"url": "sqlite:///state.db"},
        "distributor": {"bind": "127.0.0.1", "port": port, "tls_cert": "tls.crt",
                        "tls_key": "tls.key"},
    }))  # fmt: skip
    proc = subprocess.Popen(
        [sys.executable, "-m", "sco.apps.cli", "distributor", "--config", str(config)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        url = f"https://127.0.0.1:{port}"

        def up() -> bool:
            try:
                ca = ssl.create_default_context(cafile=str(cert))
                return httpx.get(f"{url}/readyz", verify=ca).status_code == 200
            except httpx.HTTPError:
                return proc.poll() is not None

        wait_for(up, 30, "the distributor serving HTTPS")
        assert proc.poll() is None
        try:
            httpx.get(f"{url}/healthz")  # the system's CAs do not know ours
            raise AssertionError("a certificate nobody signed was trusted")
        except httpx.ConnectError:
            pass
        agent = subprocess.Popen(
            [sys.executable, "-m", "sco.apps.cli", "agent", "--distributor", url,
             "--token-file", str(tmp_path / "token"), "--ca-file", str(cert),
             "--state-file", str(tmp_path / "agent.json"), "--drain-command", "true",
             "--wait", "1"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            wait_for((tmp_path / "agent.json").exists, 30, "the agent's contract")
        finally:
            agent.terminate()
            out, _ = agent.communicate(timeout=30)
        assert agent.returncode == 0, out
        assert inst.id in (tmp_path / "agent.json").read_text()
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
        store.close()
