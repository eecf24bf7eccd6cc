"""The schedulers of `make lab` and the servers' side of them: a real Slurm controller
whose dynamic nodes are the lab's `batch` servers, a stand-in Kubernetes API whose
Nodes are its `web` servers, and a `sco agent` on every `batch` server.

    python -m sco_harness.lab_world serve DIR   run until SIGTERM (the lab's `world`)
    python -m sco_harness.lab_world sweep DIR   stop whatever a killed world left

`serve` starts OpenBao (`sco_harness.bao_server`: sco's cloud credential behind
a policy that reads only its path, and the AppRole sco logs in with), munge,
slurmctld (`sco_harness.slurm_cluster`) and the Kubernetes
API (`sco_harness.kube_api`, with a few pods of a `web` app waiting), writes
`DIR/kubeconfig`, `DIR/env` (SLURM_CONF, KUBECONFIG and the lab's URLs, for a
shell to source) and `DIR/world.json` (what it started, for `sweep`), then plays
the servers' boot: an ACTIVE `batch` server starts its slurmd and its agent (the
node token read from the server's metadata, as cloud-init would hand it over); a
`web` server registers its Node; a server that is gone takes them with it. Agents'
output goes to this process's, each line marked with its node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from sco.adapters.openstack.resources import META_NODE_TOKEN, META_PARTITION
from sco_harness.bao_server import BaoServer
from sco_harness.keystone import Keystone
from sco_harness.kube_api import KubeApi
from sco_harness.kube_cluster import UNSCHEDULABLE, KubeletSim
from sco_harness.openstack_stack import NovaStack
from sco_harness.seed_platform import sco_credential
from sco_harness.services import stop_on_signals
from sco_harness.slurm_cluster import SlurmBoot, SlurmCluster

MARK = "SCO_LAB_WORLD"  # in the environment of every process the world starts
ALLOCATABLE = {"cpu": "2", "memory": "4Gi", "pods": "110"}
WEB_PODS = 3  # the `web` app's replicas waiting when the lab starts (1 CPU each)
TOLERATE_SPOT = {"key": "sco.io/capacity-class", "operator": "Exists", "effect": "NoSchedule"}


def _say(line: str) -> None:
    print(line, flush=True)


def web_pod(i: int) -> dict[str, Any]:
    """A replica of the lab's `web` app: 1 CPU, runs on spot nodes too."""
    container = {"name": "app", "image": "app", "resources": {"requests": {"cpu": "1"}}}
    return {
        "metadata": {"name": f"web-{i}", "namespace": "default", "labels": {"app": "web"}},
        "spec": {"containers": [container], "tolerations": [TOLERATE_SPOT]},
        "status": {"phase": "Pending", "conditions": [UNSCHEDULABLE]},
    }


class Agents:
    """A `sco agent` per booted `batch` server, as long as the server is there."""

    def __init__(self, folder: Path, cluster: SlurmCluster, distributor: str) -> None:
        self.folder = folder / "agents"
        self.folder.mkdir(exist_ok=True)
        self.cluster = cluster
        self.distributor = distributor
        self.running: dict[str, subprocess.Popen[bytes]] = {}  # server id -> agent

    def step(self, servers: dict[str, dict[str, Any]], booted: dict[str, str]) -> None:
        for sid, node in booted.items():
            token = (servers.get(sid, {}).get("metadata") or {}).get(META_NODE_TOKEN)
            was = self.running.get(sid)
            if was is not None and was.poll() not in (None, 0):  # as systemd's on-failure
                _say(f"agent {node}: exited with {was.returncode}; started again")
                was = None
            if was is None and token:
                self.running[sid] = self._start(sid, node, token)
        for sid in set(self.running) - set(booted):
            self._stop(self.running.pop(sid))

    def _start(self, sid: str, node: str, token: str) -> subprocess.Popen[bytes]:
        token_file = self.folder / f"{node}.token"
        token_file.touch(mode=0o600)
        token_file.write_text(token)
        sco = Path(sys.executable).parent / "sco"
        argv = [
            str(sco), "agent", "--distributor", self.distributor,
            "--token-file", str(token_file), "--state-file", str(self.folder / f"{node}.json"),
            "--slurm-node", node, "--slurm-conf", str(self.cluster.conf),
            "--requeue-lead", "10s", "--wait", "10",
        ]  # fmt: skip
        proc = subprocess.Popen(
            argv, env=self.cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        assert proc.stdout is not None
        threading.Thread(target=_relay, args=(proc.stdout, f"agent {node}:"), daemon=True).start()
        _say(f"agent {node}: started for server {sid}")
        return proc

    def stop(self) -> None:
        """Every agent stopped at once, as the servers' power would: an agent in a
        long-poll would take up to its wait to notice a SIGTERM."""
        for proc in self.running.values():
            proc.kill()
        for proc in self.running.values():
            proc.wait()
        self.running.clear()

    def _stop(self, proc: subprocess.Popen[bytes]) -> None:
        proc.kill()
        proc.wait()


def _relay(stream: IO[bytes], mark: str) -> None:
    for raw in stream:
        _say(f"{mark} {raw.decode(errors='replace').rstrip()}")


class World:
    """Slurm, the Kubernetes stand-in, and the servers' side of both."""

    def __init__(self, folder: Path, stack: NovaStack, http_base: int) -> None:
        from sco_harness import lab_plane

        self.folder = folder
        self.stack = stack
        self.ports = lab_plane.ports(http_base)
        distributor = f"http://127.0.0.1:{self.ports['distributor']}"
        self.cluster = SlurmCluster(folder / "slurm", partitions=("batch",), sco_partition="batch")
        self.kube = KubeApi(bookmark_s=5.0)
        self.listed: list[dict[str, Any]] = []
        self.boot = SlurmBoot(self.cluster, lambda: self._of("batch"))
        self.kubelets = KubeletSim(self.kube, lambda: self._of("web"), ALLOCATABLE, True)
        self.agents = Agents(folder, self.cluster, distributor)
        self.bao = BaoServer(folder / "openbao", *lab_plane.openbao_ports(http_base))

    def _of(self, partition: str) -> list[dict[str, Any]]:
        return [
            s for s in self.listed if (s.get("metadata") or {}).get(META_PARTITION) == partition
        ]

    def start(self) -> None:
        from sco_harness import lab

        _record(self.folder, self.cluster)  # before anything starts: what `sweep` needs
        self.bao.start()
        # The credential sco's replicas read, as the seed keeps it: an application
        # credential Keystone restricts to project sco, in OpenBao behind a policy that
        # reads only its path, given out to sco's AppRole.
        keystone = Keystone(self.stack.conn, self.stack.keystone_url)
        cred = sco_credential(keystone, "sco-lab")
        role_id, secret_id = self.bao.keep_credential(cred.fields(), path=lab.CREDENTIAL_PATH)
        self.approle = {
            "BAO_ADDR": self.bao.url,
            "BAO_ROLE_ID": role_id,
            "BAO_SECRET_ID": secret_id,
        }
        self.cluster.start()
        _record(self.folder, self.cluster)  # munge's folder is known now
        self.kube.start()
        for i in range(WEB_PODS):
            self.kube.put("pods", web_pod(i))
        kubeconfig = self.kube.kubeconfig(self.folder / "kubeconfig")
        _write_env(self.folder, self.ports, self.cluster, kubeconfig, self.approle)
        _say(
            f"OpenBao up at {self.bao.url} with sco's credential; Slurm controller up "
            f"(SLURM_CONF={self.cluster.conf}); Kubernetes API at {self.kube.url} with "
            f"{WEB_PODS} web pods waiting"
        )

    def step(self) -> None:
        try:
            self.listed = self.stack.servers(all_tenants="1", tags="sco")
        except Exception:
            return  # Nova is busy: next time
        self.boot.step()
        self.kubelets.step()
        self.agents.step({s["id"]: s for s in self.listed}, self.boot.booted)

    def stop(self) -> None:
        self.agents.stop()
        self.kube.stop()
        self.cluster.stop()
        self.bao.stop()


def _record(folder: Path, cluster: SlurmCluster) -> None:
    """What `sweep` needs to clean up after a world that could not."""
    (folder / "world.json").write_text(
        json.dumps(
            {
                "bridge": cluster.bridge,
                "netns_prefix": f"sco{cluster.id}n",
                "munge": str(cluster.munge),
            }
        )
    )


def _write_env(
    folder: Path,
    p: dict[str, int],
    cluster: SlurmCluster,
    kubeconfig: Path,
    approle: dict[str, str],
) -> None:
    lines = {
        "SLURM_CONF": str(cluster.conf),
        "KUBECONFIG": str(kubeconfig),
        "SCO_CONFIG": str(folder / "sco.yaml"),
        **{f"LAB_{name.upper().replace('-', '_')}": f"http://127.0.0.1:{port}"
           for name, port in p.items()},
        **approle,  # what `sco run` and `sco reclaim` log in to OpenBao with
    }  # fmt: skip
    text = "# The lab's tools and URLs: `. .lab/env` in a shell.\n"
    text += "".join(f"export {k}={v}\n" for k, v in lines.items())
    (folder / "env").write_text(text)


def serve(folder: Path, base_port: int, http_base: int, every_s: float = 0.5) -> None:
    """Up, then the servers' boot every `every_s`, until SIGTERM or SIGINT; everything
    it started stopped on the way out."""
    from sco_harness import lab

    # What `sweep` looks for: not SLURM_CONF, which the user's shell has from `.lab/env`.
    os.environ[MARK] = str(folder)
    stack = lab.stack_of(folder, base_port).connect()
    world = World(folder, stack, http_base)
    with stop_on_signals():
        try:
            world.start()
            (folder / "world.ready").touch()
            while True:
                time.sleep(every_s)
                world.step()
        finally:
            (folder / "world.ready").unlink(missing_ok=True)
            _say("stopping: agents, slurmd, slurmctld, munge, the Kubernetes API, OpenBao")
            world.stop()


def sweep(folder: Path) -> list[str]:
    """Whatever a world killed before it could stop left behind: the processes it
    started (marked in their environment), its nodes' network namespaces, its bridge.
    What was swept."""
    path = folder / "world.json"
    if not path.exists():
        return []
    left = json.loads(path.read_text())
    swept = [f"pid {pid}" for pid in _with_env(f"{MARK}={folder}") if _kill(pid)]
    names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    for line in names.stdout.splitlines():
        netns = line.split()[0] if line.strip() else ""
        if netns.startswith(left["netns_prefix"]):
            subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)
            swept.append(f"netns {netns}")
    gone = subprocess.run(["ip", "link", "del", left["bridge"]], capture_output=True, check=False)
    if gone.returncode == 0:
        swept.append(f"bridge {left['bridge']}")
    munged = Path(left["munge"]) / "pid"
    with contextlib.suppress(OSError, ValueError):
        if _kill(int(munged.read_text().strip())):
            swept.append("munged")
    shutil.rmtree(left["munge"], ignore_errors=True)
    path.unlink()
    return swept


def _with_env(marker: str) -> list[int]:
    me = os.getpid()
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        with contextlib.suppress(OSError):
            if marker.encode() in (d / "environ").read_bytes().split(b"\0"):
                out.append(int(d.name))
    return out


def _kill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sco_harness.lab_world", description=__doc__)
    parser.add_argument("action", choices=["serve", "sweep"])
    parser.add_argument("folder", type=Path)
    parser.add_argument(
        "--base-port", type=int, default=int(os.environ.get("SCO_OS_BASE_PORT", "18700"))
    )
    parser.add_argument("--http-base", type=int, default=9100, help="sco's ports from here")
    args = parser.parse_args(argv)
    folder = args.folder.resolve()
    if args.action == "serve":
        serve(folder, args.base_port, args.http_base)
    else:
        for what in sweep(folder):
            _say(f"swept {what}")


if __name__ == "__main__":
    main()
