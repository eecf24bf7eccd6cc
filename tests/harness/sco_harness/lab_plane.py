"""The processes of `make lab`, under a process supervisor (honcho, from PyPI): the
world (`sco_harness.lab_world`: Slurm, the Kubernetes stand-in, the servers' side),
two `sco run` replicas (started once the world is up: they check their schedulers
at start), `sco watch`, `sco history load` scoring as it loads, `sco distributor`
and `sco status`, all on the lab's `sco.yaml`, their output in one log (`lab.log`,
each line marked with its process).

Ports: the `http` base (default 9100) and up: run 9100 and 9110 (two replicas),
watch +1, score +2 (unused: the loader scores), history +3, status +4, distributor +5,
OpenBao +6 (and raft's +7).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import yaml

BASE = 9100  # the first of sco's ports
READY = "world.ready"  # written by the world once Slurm and Kubernetes answer
RUN_B = 10  # the second replica's port, from the base


def ports(base: int) -> dict[str, int]:
    return {
        "run-a": base,
        "run-b": base + RUN_B,
        "watch": base + 1,
        "history": base + 3,
        "status": base + 4,
        "distributor": base + 5,
    }


def openbao_ports(base: int) -> tuple[int, int]:
    """The lab's OpenBao: its API, and raft's cluster port."""
    return base + 6, base + 7


def kube_url(folder: Path) -> str:
    """Where the lab's Kubernetes stand-in answers (its kubeconfig says)."""
    doc = yaml.safe_load((folder / "kubeconfig").read_text())
    return str(doc["clusters"][0]["cluster"]["server"])


def http_section(base: int) -> dict[str, int]:
    """sco.yaml's `http` for the lab's ports."""
    p = ports(base)
    return {
        "run_port": p["run-a"],
        "watch_port": p["watch"],
        "score_port": base + 2,
        "history_port": p["history"],
        "status_port": p["status"],
    }


def procfile(base: int, nova_base: int) -> str:
    """The world first; the replicas wait for it (they check their schedulers at start,
    and log in to its OpenBao with the AppRole `env` holds)."""
    sco = f"{Path(sys.executable).parent / 'sco'} "
    conf = "--config sco.yaml"
    wait = f"until [ -e {READY} ]; do sleep 0.2; done; . ./env; exec {sco}"
    p = ports(base)
    lines = {
        "world": f"exec {sys.executable} -m sco_harness.lab_world serve . "
        f"--base-port {nova_base} --http-base {base}",
        "run-a": f"{wait}run {conf} --replica lab-a --metrics-port {p['run-a']}",
        "run-b": f"{wait}run {conf} --replica lab-b --metrics-port {p['run-b']}",
        "watch": f"{sco}watch {conf}",
        "history": f"{sco}history load {conf} --score-every 1m",
        "distributor": f"{sco}distributor {conf}",
        "status": f"{sco}status {conf}",
    }
    return "".join(f"{name}: {cmd}\n" for name, cmd in lines.items())


def start(folder: Path, base: int, nova_base: int) -> int:
    """The supervisor started in the background (its own session, so that `stop` can
    end it and every process under it); returns its pid. Refuses while one runs."""
    if running(folder):
        raise RuntimeError(f"a lab control plane already runs in {folder}: lab down first")
    (folder / READY).unlink(missing_ok=True)  # a killed world's
    (folder / "Procfile").write_text(procfile(base, nova_base))
    log = open(folder / "lab.log", "ab")  # noqa: SIM115 (the supervisor's from here on)
    honcho = Path(sys.executable).parent / "honcho"
    proc = subprocess.Popen(
        [str(honcho), "--no-colour", "start", "-f", "Procfile", "-d", str(folder)],
        cwd=folder, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    log.close()
    (folder / "supervisor.pid").write_text(str(proc.pid))
    return proc.pid


def running(folder: Path) -> bool:
    pid_file = folder / "supervisor.pid"
    return pid_file.exists() and _group_alive(int(pid_file.read_text()))


def wait_ready(folder: Path, base: int, within_s: float = 180.0) -> None:
    """Until every process answers its /healthz; raises naming those that do not, with
    the end of the log and, last (what a caller showing only the end keeps), the first
    process that stopped. The limit is for a loaded machine: unloaded, ~30 s."""
    deadline = time.monotonic() + within_s
    waiting = dict(ports(base))
    while waiting or not (folder / READY).exists():
        for name, port in list(waiting.items()):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2):
                    del waiting[name]
            except OSError:
                pass
        if time.monotonic() > deadline or not running(folder):
            late = [*waiting, *([] if (folder / READY).exists() else ["world"])]
            log = (folder / "lab.log").read_text(errors="replace")
            why = "stopped" if not running(folder) else f"not up within {within_s:.0f} s"
            raise RuntimeError(
                f"{log[-3000:]}\n{first_stopped(log)}\nlab: {why}; not answering: {', '.join(late)}"
            )
        time.sleep(0.5)


def first_stopped(log: str) -> str:
    """The last lines of the first process that stopped, and the supervisor's line for
    it: that process took the others down (honcho stops them all)."""
    lines = log.splitlines()
    at = next((n for n, line in enumerate(lines) if "stopped (rc=" in line), None)
    if at is None:
        return "lab: no process stopped"
    name = lines[at].split("|", 1)[-1].split()[0]  # "world.1"
    own = [line for line in lines[:at] if line.split("|", 1)[0].split()[-1:] == [name]]
    return "\n".join([*own[-10:], f"lab: first to stop: {lines[at].split('|', 1)[-1].strip()}"])


def keystone_url(folder: Path) -> str:
    """The lab's Keystone, as sco's clouds.yaml names it."""
    clouds = yaml.safe_load((folder / "clouds.yaml").read_text())["clouds"]
    return str(next(iter(clouds.values()))["auth"]["auth_url"])


def stack_env(folder: Path, key: str) -> str:
    """A value nova.sh wrote to the lab stack's stack.env (SCO_OS_<key>)."""
    for line in (folder / "stack" / "stack.env").read_text().splitlines():
        if line.startswith(f"export SCO_OS_{key}="):
            return line.split("=", 1)[1]
    return "?"


def endpoints(folder: Path, base: int) -> list[str]:
    """What to open, what scrapes where, and what to type next."""
    p = ports(base)
    metrics = ", ".join(f"{n} :{p[n]}" for n in ("run-a", "run-b", "watch", "history"))
    env = os.path.relpath(folder / "env")
    return [
        f"status page   http://127.0.0.1:{p['status']}/",
        f"distributor   http://127.0.0.1:{p['distributor']}/ (contracts; /metrics)",
        f"metrics       {metrics} (/metrics, /healthz, /readyz)",
        f"openbao       http://127.0.0.1:{openbao_ports(base)[0]} (the cloud credential, read "
        "with the AppRole in env)",
        f"keystone      {keystone_url(folder)} (sco's application credential: project sco; "
        f"the cloud's admin in {folder / 'stack' / 'clouds.yaml'})",
        f"ironic        {stack_env(folder, 'IRONIC_URL')} ({stack_env(folder, 'IRONIC_NODES')} "
        "fake-hardware nodes in hall-bm, for the metal partition)",
        f"slurm         sinfo, squeue, sbatch with SLURM_CONF={folder / 'slurm' / 'slurm.conf'}",
        f"kubernetes    {kube_url(folder)} (KUBECONFIG={folder / 'kubeconfig'})",
        f"log           {folder / 'lab.log'} (every process, one file)",
        f"next          . {env}; sinfo; .venv/bin/sco explain web   (docs/tour.md)",
    ]


def stop(folder: Path, within_s: float = 30.0) -> bool:
    """The supervisor and every process under it stopped (SIGTERM, then SIGKILL);
    False if none was running."""
    pid_file = folder / "supervisor.pid"
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text())
    try:
        os.killpg(pid, signal.SIGTERM)
    except ProcessLookupError:
        pid_file.unlink()
        return False
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline and _group_alive(pid):
        time.sleep(0.2)
    if _group_alive(pid):
        os.killpg(pid, signal.SIGKILL)
    pid_file.unlink()
    return True


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    # A zombie leader (its parent, `lab up`, has gone) is reaped by init: ask /proc.
    members = [d for d in Path("/proc").iterdir() if d.name.isdigit() and _pgid_of(d) == pgid]
    return any(_state_of(d) != "Z" for d in members)


def _pgid_of(proc: Path) -> int | None:
    try:
        return int((proc / "stat").read_text().rsplit(")", 1)[1].split()[2])
    except (OSError, IndexError, ValueError):
        return None


def _state_of(proc: Path) -> str:
    try:
        return (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"
