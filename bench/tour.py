"""The tour of docs/tour.md, run as written: every command of every step, in order, in
one shell's environment, each step's promise checked. Ends with one JSON line:

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sco_harness.lab_plane import kube_url
from sco_harness.lab_world import MARK
from sco_harness.openstack_stack import STACK_PORTS

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


@dataclass
class Lab:
    """The shell the reader types into: its folder, its environment, what was seen."""

    root: Path
    env: dict[str, str]
    seen: dict[str, Any] = field(default_factory=dict)

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
    pods = lab.get(f"{kube_url(lab.folder)}/api/v1/pods")
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


def _planned(_lab: Lab, out: str) -> str | None:
    m = re.search(r"(\d+) creates", out)
    if "plan generation" not in out or not m or int(m[1]) < 4:
        return "no plan, or fewer than 4 creates in the last hour"
    return None


def _contracts(lab: Lab, out: str) -> str | None:
    page = json.loads(lab.get(f"{lab.env['LAB_STATUS']}/status.json"))
    serving = [
        c for c in page["contracts"] if c["partition"] == "batch" and c["state"] == "serving"
    ]
    if len(serving) < 4 or '"state": "serving"' not in out:
        return f"{len(serving)} batch contracts serving"
    return None


def _noticed(lab: Lab, out: str) -> str | None:
    from sco.adapters.slurm.nodes import node_name

    m = re.search(r"lab: (\S+) noticed: leave by", out)
    if not m:
        return "no notice given"
    lab.seen["server"], lab.seen["node"] = m[1], node_name(m[1])
    return None


def _draining(lab: Lab, out: str) -> str | None:
    node, server = lab.seen["node"], lab.seen["server"]
    if not re.search(rf"ready -> noticed \[reclaim_notice\].*\(server {server}\)", lab.log()):
        return "sco has not seen the notice"
    if not re.search(rf"^{node}\s+1\s+batch\s+(drng|drain)", out, re.M):
        return f"{node} is not draining"
    return None


def _replaced(lab: Lab, out: str) -> str | None:
    if "requeued [" not in lab.log():
        return "no job requeued"
    running = _running(out)
    nodes = set(running.values())
    if len(nodes) < 4 or lab.seen["node"] in nodes:
        return f"running: {running}"
    return None


def _counted(lab: Lab, out: str) -> str | None:
    if not re.search(r"[1-9]\d* reclaims with notice", out):
        return "explain counts no reclaim with notice"
    if not re.search(r"\([1-9]\d* replacing reclaimed\)", out):
        return "explain counts no replacement"
    if not re.search(r'^sco_reclaims_total\{[^}]*partition="batch"[^}]*\} [1-9]', out, re.M):
        return "no replica counts the reclaim"
    page = lab.get(f"{lab.env['LAB_STATUS']}/")
    if not re.search(
        r'class="l bad" data-field="last_hour">[^<]*[1-9]\d* reclaims? with notice', page
    ):
        return "the status page does not show the last hour's reclaim in red"
    return None


def _excluded(lab: Lab, out: str) -> str | None:
    pools = json.loads(lab.sh(".venv/bin/sco pools --json").stdout)
    rows = pools if isinstance(pools, list) else pools.get("pools", [])
    hall_a = [p for p in rows if "hall-a/spot" in json.dumps(p)]
    if "excluded until" not in out or not any("excluded" in json.dumps(p) for p in hall_a):
        return "hall-a's spot pool is not excluded"
    return None


def _handed_back(_lab: Lab, out: str) -> str | None:
    return None if "holds nothing" in out else "web still holds servers"


def _stopped(lab: Lab, _out: str) -> str | None:
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
    return [*range(http, http + 11), *range(nova, nova + STACK_PORTS)]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port)) == 0


# title -> (check, seconds its last command may be rerun until the check passes)
CHECKS: dict[str, tuple[Check, float]] = {
    "Start the lab": (_started, 0),
    "Point your shell at the lab": (_web_ready, 60),
    "Submit Slurm jobs": (_submitted, 0),
    "Watch nodes join": (_joined, 120),
    "Read the plan": (_planned, 0),
    "Contracts and agents": (_contracts, 30),
    "Take a server back with notice": (_noticed, 0),
    "See the drain": (_draining, 25),
    "The requeue and the replacement": (_replaced, 90),
    "What happened, said three ways": (_counted, 0),
    "Exclude a pool with a burst of reclaims": (_excluded, 90),
    "Hand a partition back": (_handed_back, 0),
    "Take it back, and stop the lab": (_stopped, 0),
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
    check, within_s = CHECKS[step.title]
    deadline = time.monotonic() + within_s
    done = lab.sh(step.commands)
    while True:
        if done.returncode != 0:
            return f"exit {done.returncode}: {(done.stderr or done.stdout)[-500:]}"
        why = check(lab, done.stdout + done.stderr)
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
