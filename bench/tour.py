"""The tour of docs/tour.md, run as written: every command of every step, in order, in
one shell's environment, every promise of each step checked, from the world where it
is about the world (Nova, fleet state, Slurm, the Kubernetes stand-in, the replicas'
/metrics, the process table: bench/tourlib), not only from what a command printed.
Ends with one JSON line:

    {"steps": 13, "passed": 13, "lab_up_s": 31.2, "processes": 13}

`lab_up_s` is how long `make lab` took; `processes` how many of the lab's processes
answered at once (sco's six, OpenBao, slurmctld, the Kubernetes stand-in, the agents).

    python bench/tour.py             in a scratch copy of the repository (links to it
                                     with a `.lab` of its own), on free ports
    python bench/tour.py --here      in the repository itself, on the lab's default ports

A step whose promise needs time ("run it again until ...") reruns its last command
until the promise holds or its time is up. The first step that fails ends the tour
(the later ones build on it); the lab is stopped whatever happened.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sco_harness.lab_plane import kube_url
from sco_harness.lab_world import MARK
from sco_harness.openstack_stack import STACK_PORTS

# Its parts are in bench/tourlib (as soak.py's are in bench/soaklib): run as a script,
# this file's folder is first on the path; loaded by path, it is not there at all.
sys.path.append(str(Path(__file__).resolve().parent))

from tourlib import promises
from tourlib.lab import Lab

ROOT = Path(__file__).resolve().parents[1]
TOUR = ROOT / "docs" / "tour.md"
STEP = re.compile(r"^## (\d+)\. (.+?)\n(.*?)```sh\n(.*?)```", re.M | re.S)


@dataclass(frozen=True)
class Step:
    number: int
    title: str
    commands: str

    @property
    def last(self) -> str:
        return self.commands.strip().splitlines()[-1]


def steps(text: str) -> list[Step]:
    return [Step(int(m[1]), m[2].strip(), m[4]) for m in STEP.finditer(text)]


Check = Callable[[Lab, str], str | None]  # None: as promised; else what was seen instead


def _started(lab: Lab, out: str) -> str | None:
    if "lab: status page" not in out or "lab: next" not in out:
        return "no endpoints printed"
    again = lab.sh("make lab")
    if again.returncode == 0 or "already up" not in again.stderr + again.stdout:
        return f"a second `make lab` was not refused: {again.stderr[-300:]}"
    return None


def _web_ready(lab: Lab, out: str) -> str | None:
    lab.source_env()
    lab.seen["kube"] = kube_url(lab.folder)
    ready = [int(n) for n in re.findall(r"holds:.*?(\d+) ready", out)]  # web's, metal's
    if len(ready) < 1 or ready[0] < 2:
        return "web does not hold 2 ready nodes yet"
    if len(ready) < 2 or ready[1] < 1:
        return "metal does not hold its bare-metal node yet"
    return None


def _submitted(_lab: Lab, out: str) -> str | None:
    n = out.count("Submitted batch job")
    return None if n == 4 else f"{n} jobs submitted"


def _running(out: str) -> dict[str, str]:
    """job id -> node, of the jobs squeue says are running."""
    rows = [line.split() for line in out.splitlines()]
    return {r[0]: r[2] for r in rows if len(r) == 3 and r[1] == "RUNNING"}


def _joined(lab: Lab, out: str) -> str | None:
    running = _running(out)
    if len(set(running.values())) < 4:
        return f"{len(running)} jobs running"
    lab.seen["world"] = json.loads((lab.folder / "world.json").read_text())
    lab.seen["processes"] = found = _processes(lab)
    if not any(name.startswith("agent") for name in found):
        return "no agent running yet"
    return None


def _processes(lab: Lab) -> list[str]:
    """The lab's processes that answer now: sco's (by what each /metrics says it is),
    OpenBao (unsealed), slurmctld, the Kubernetes stand-in, the agents."""
    found = []
    for name in ("RUN_A", "RUN_B", "WATCH", "HISTORY", "DISTRIBUTOR", "STATUS"):
        m = re.search(
            r'sco_process_info\{component="([^"]+)"', lab.get(f"{lab.env[f'LAB_{name}']}/metrics")
        )
        if m:
            found.append(m[1])
    try:
        health = urllib.request.urlopen(f"{lab.env['BAO_ADDR']}/v1/sys/health", timeout=5)
        found += ["openbao"] if health.status == 200 else []
    except OSError:
        pass
    pid = (lab.folder / "slurm" / "run" / "slurmctld.pid").read_text().strip()
    if Path(f"/proc/{pid}").exists():
        found.append("slurmctld")
    pods = lab.get(f"{lab.seen['kube']}/api/v1/pods")
    if '"kind": "PodList"' in pods.replace('":"', '": "'):
        found.append("kubernetes")
    agents = str(lab.folder / "agents")
    for d in Path("/proc").iterdir():
        cmd = _read(d / "cmdline").replace(b"\0", b" ").decode(errors="replace")
        if d.name.isdigit() and " agent " in cmd and agents in cmd:
            found.append(f"agent {d.name}")
    return found


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _contracts(lab: Lab, out: str) -> str | None:
    page = json.loads(lab.get(f"{lab.env['LAB_STATUS']}/status.json"))
    serving = [
        c for c in page["contracts"] if c["partition"] == "batch" and c["state"] == "serving"
    ]
    if len(serving) < 4 or '"state": "serving"' not in out:
        return f"{len(serving)} batch contracts serving"
    return None


def _replaced(lab: Lab, out: str) -> str | None:
    if "requeued [" not in lab.log():
        return "no job requeued"
    running = _running(out)
    nodes = set(running.values())
    if len(nodes) < 4 or lab.seen["node"] in nodes:
        return f"running: {running}"
    return None


def _stopped(lab: Lab, out: str) -> str | None:
    if "web: back in service" not in out:
        return "the handback was not cancelled"
    if lab.sql("SELECT intent FROM partition_intents WHERE partition = 'web'"):
        return "web's handback is still in fleet state"
    said = [m for m in ("lab: control plane stopped", "lab: stopped") if m in out]
    if len(said) < 2 or out.index(said[0]) > out.index(said[1]) or "swept" in out:
        return f"not the supervisor, then the cloud (or the world left things): {out[-300:]}"
    stopping = r"^\S+ world\.1 +\| stopping: agents, slurmd, slurmctld, munge"
    if not (lab.folder / "lab.log").exists() or not re.search(stopping, lab.log(), re.M):
        return "the world did not stop its agents, slurmd, slurmctld and munge itself"
    left = _left_running(lab)
    if left:
        return f"left running: {left}"
    busy = [p for p in _ports(lab) if _listening(p)]
    if busy:
        return f"still listening: {busy}"
    world = lab.seen.get("world", {})
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=False)
    if world and world["netns_prefix"] in netns.stdout:
        return "network namespaces left"
    bridge = subprocess.run(
        ["ip", "link", "show", world.get("bridge", "-")], capture_output=True, check=False
    )
    return "bridge left" if world and bridge.returncode == 0 else None


def _left_running(lab: Lab) -> list[str]:
    """Processes of the lab's: in its folder, naming it, or started by its world."""
    mark, me = str(lab.folder), os.getpid()
    left = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        try:
            cwd = os.readlink(d / "cwd")
        except OSError:
            cwd = ""
        cmd = _read(d / "cmdline").replace(b"\0", b" ").decode(errors="replace")
        env = _read(d / "environ").decode(errors="replace") + "\0"
        if cwd.startswith(mark) or mark in cmd or f"{MARK}={mark}\0" in env:
            left.append(f"{d.name} {cmd[:80]}")
    return left


def _ports(lab: Lab) -> list[int]:
    http, nova = int(lab.env["SCO_LAB_HTTP_BASE"]), int(lab.env["SCO_OS_BASE_PORT"])
    kube = [int(lab.seen["kube"].rsplit(":", 1)[1])] if "kube" in lab.seen else []
    return [*range(http, http + 11), *range(nova, nova + STACK_PORTS), *kube]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


@dataclass(frozen=True)
class Promise:
    check: Check
    within_s: float = 0  # how long its last command may be rerun until the check passes
    before: Callable[[Lab], None] | None = None  # records what the check compares with


CHECKS: dict[str, Promise] = {
    "Start the lab": Promise(_started),
    "Point your shell at the lab": Promise(_web_ready, 60),
    "Submit Slurm jobs": Promise(_submitted),
    "Watch nodes join": Promise(_joined, 120),
    "Read the plan": Promise(promises.planned, 30),
    "Contracts and agents": Promise(_contracts, 30),
    "Take a server back with notice": Promise(promises.noticed),
    "See the drain": Promise(promises.draining, 25),
    "The requeue and the replacement": Promise(_replaced, 90),
    "What happened, said three ways": Promise(promises.counted, 30),
    "Exclude a pool with a burst of reclaims": Promise(
        promises.excluded, 90, promises.before_burst
    ),
    "Hand a partition back": Promise(promises.handed_back, 0, promises.before_handback),
    "Take it back, and stop the lab": Promise(_stopped),
}


def run_tour(lab: Lab, say: Callable[[str], None]) -> dict[str, Any]:
    tour = steps(TOUR.read_text())
    if [s.title for s in tour] != list(CHECKS):
        raise SystemExit(
            f"{TOUR} and bench/tour.py disagree on the steps: {[s.title for s in tour]}"
        )
    passed, lab_up_s = 0, 0.0
    try:
        for step in tour:
            started = time.monotonic()
            why = _step(lab, step)
            took = time.monotonic() - started
            lab_up_s = took if step.number == 1 else lab_up_s
            said = "ok" if why is None else f"FAILED: {why}"
            say(f"tour: {step.number}. {step.title}: {said} ({took:.0f} s)")
            if why is not None:
                break
            passed += 1
    finally:
        if passed < len(tour):
            lab.sh("make lab-down")
    return {
        "steps": len(tour),
        "passed": passed,
        "lab_up_s": round(lab_up_s, 1),
        "processes": len(lab.seen.get("processes", [])),
    }


def _step(lab: Lab, step: Step) -> str | None:
    promise = CHECKS[step.title]
    if promise.before is not None:
        promise.before(lab)
    deadline = time.monotonic() + promise.within_s
    done = lab.sh(step.commands)
    lab.seen["step_out"] = done.stdout + done.stderr  # all its commands', once
    while True:
        if done.returncode != 0:
            return f"exit {done.returncode}: {(done.stderr or done.stdout)[-500:]}"
        why = promise.check(lab, done.stdout + done.stderr)
        if why is None or time.monotonic() > deadline:
            return why
        time.sleep(2)
        done = lab.sh(step.last)


def _scratch_root() -> Path:
    """A folder that looks like the repository (links to its files) with no `.lab`.

    It shares the repository's `.venv`: brought up to date here first, or `make lab`
    in the copy would reinstall it from the copy, whose scripts then point into a
    folder that is deleted after the tour."""
    subprocess.run(["make", "-s", ".venv/.installed"], cwd=ROOT, check=True)
    root = Path(tempfile.mkdtemp(prefix="sco-tour-"))
    for entry in ROOT.iterdir():
        if entry.name not in (".lab", ".git"):
            (root / entry.name).symlink_to(entry)
    return root


def _free_run(count: int, start: int) -> int:
    """The first of `count` consecutive ports nothing listens on, from `start`."""
    for base in range(start, 60000, count + 9):
        if not any(_listening(p) for p in range(base, base + count)):
            return base
    raise SystemExit(f"no {count} free ports in a row")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--here", action="store_true", help="in the repository, default ports")
    args = parser.parse_args(argv)
    env = dict(os.environ, COLUMNS="160")
    if args.here:
        root = ROOT
        env.setdefault("SCO_LAB_HTTP_BASE", "9100")
        env.setdefault("SCO_OS_BASE_PORT", "18700")
    else:
        root = _scratch_root()
        env.setdefault("SCO_LAB_HTTP_BASE", str(_free_run(11, 21000)))
        env.setdefault("SCO_OS_BASE_PORT", str(_free_run(STACK_PORTS, 19600)))
    result = run_tour(Lab(root, env), lambda line: print(line, file=sys.stderr, flush=True))
    if root != ROOT and result["passed"] == result["steps"]:
        shutil.rmtree(root)
    elif root != ROOT:
        print(f"tour: the lab's folder and log are kept in {root / '.lab'}", file=sys.stderr)
    print(json.dumps(result))
    return 0 if result["passed"] == result["steps"] else 1


if __name__ == "__main__":
    sys.exit(main())
