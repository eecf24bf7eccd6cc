"""A full disk under the embedded SQLite fleet state, under `sco run`.

`sco run` on the Nova test stack keeps its fleet state, leases and event log in
one SQLite file (`state.url: sqlite:///…`, `events.kind: embedded`) on a small
tmpfs of its own. Two partitions hold two servers each, and a churn thread
reclaims one server without notice every few seconds, so transitions are being
recorded when the disk fills. A filler file then takes every free byte (until
ENOSPC) and stays 30 s (15 s in the short tier); then it is deleted.

Measured:
- the process: alive throughout, not ready (/readyz) while it cannot write,
  its log naming the full disk, and no traceback loop (tracebacks counted);
- lost_transitions, duplicate_creates, leaked_servers: sco_harness.chaos.audit
  of fleet state (every history chain) against Nova, once settled; lost_events:
  committed events missing from the embedded event log;
- integrity: SQLite's `PRAGMA integrity_check` on the file afterwards;
- stalled_partitions: partitions with no undegraded cycle for more than 3
  intervals from 10 s after the disk is freed to the end of recovery;
- recovery_s: from the filler's deletion to the next transition fleet state
  committed (a history row written after it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from sco_harness.controlplane import ControlPlaneRun, wait_for
from sco_harness.faults import FaultResult
from sco_harness.faults.watch import (
    HALLS,
    SLOTS,
    CycleWatch,
    clear_servers,
    missing_events,
    ready_by_partition,
    settled_audit,
)
from sco_harness.openstack_stack import NovaStack, free_port

BASE_PORT = 19760
DISK_MB = 16
INTERVAL_S = 2.0
CHURN_S = 6.0
PARTITIONS = {"web": 2, "batch": 2}
_DISK_WORDS = ("disk is full", "no space left", "disk full")


def log(msg: str) -> None:
    print(f"[faults/disk] {msg}", file=sys.stderr, flush=True)


def run(folder: Path, *, short: bool = False, stack: NovaStack | None = None) -> list[FaultResult]:
    """`stack`: a Nova test stack already up (its servers are deleted at the end);
    None: one of its own on BASE_PORT."""
    folder.mkdir(parents=True, exist_ok=True)
    own = stack is None
    if stack is None:
        stack = NovaStack(folder / "nova", BASE_PORT, HALLS, SLOTS).up()
    disk = folder / "disk"
    disk.mkdir(exist_ok=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={DISK_MB}m", "tmpfs", str(disk)], check=True
    )
    cp: ControlPlaneRun | None = None
    try:
        cp = ControlPlaneRun(folder / "cp", _config(disk, stack, folder), dict(os.environ))
        port = free_port()
        cp.start("run", "run", "--metrics-port", str(port), port=port)
        result = _fault(cp, stack, disk, port, hold_s=15.0 if short else 30.0)
        log(str(result.as_dict()))
        return [result]
    finally:
        if cp is not None:
            cp.stop_all()
        subprocess.run(["umount", "-l", str(disk)], check=False)
        try:
            clear_servers(stack)
        finally:
            if own:
                stack.down()


def _config(disk: Path, stack: NovaStack, folder: Path) -> dict[str, Any]:
    import yaml

    region_file = folder / "region.yaml"
    region_file.write_text(yaml.safe_dump(stack.region()))
    return {
        "state": {"url": f"sqlite:///{disk / 'state.sqlite'}"},
        "events": {"kind": "embedded"},
        "leases": {"kind": "database"},
        "provider": {
            "cloud": "sco-test",
            "region_file": str(region_file),
            "clouds_file": str(stack.clouds_yaml),
        },
        "partitions": [
            {
                "name": name,
                "kind": "kubernetes",
                "target_units": target,
                "floor_units": 1,
                "max_units": target,
            }
            for name, target in PARTITIONS.items()
        ],
        "policy": {"interval_s": INTERVAL_S},
        "log": {"level": "info"},
    }


def _fill(disk: Path) -> tuple[Path, int]:
    """A file that takes every free byte of `disk` (written until ENOSPC)."""
    filler = disk / "filler"
    written = 0
    chunk = b"\0" * 65536
    with filler.open("wb", buffering=0) as f:
        while True:
            try:
                written += f.write(chunk)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
    for size in (4096, 512, 1):  # the last pages too
        with contextlib.suppress(OSError), filler.open("ab", buffering=0) as f:
            while True:
                written += f.write(b"\0" * size)
    return filler, written


def _ready(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def _last_transition_at(path: Path) -> float:
    """When fleet state last committed a transition (its newest history row), by the
    writer's clock; read-only, so it works on a full disk too."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)) as c:
            row = c.execute("SELECT max(at) FROM instance_history").fetchone()
    except sqlite3.Error:
        return 0.0
    return float(row[0] or 0.0)


def _churn(stack: NovaStack, stop: threading.Event, reclaims: list[float]) -> None:
    """A spot or guaranteed server of sco's deleted every CHURN_S, as a reclaim
    without notice: sco must record it and replace it."""
    rng = random.Random(17)
    while not stop.wait(CHURN_S):
        try:
            victims = [s for s in stack.servers(tags="sco") if s["status"] == "ACTIVE"]
            if victims:
                sid = rng.choice(victims)["id"]
                stack.conn.compute.delete(f"/servers/{sid}", microversion="2.90")
                reclaims.append(time.time())
        except Exception as e:
            log(f"churn: {type(e).__name__}: {e}")


def _fault(
    cp: ControlPlaneRun, stack: NovaStack, disk: Path, port: int, hold_s: float
) -> FaultResult:
    url = cp.config["state"]["url"]
    db = disk / "state.sqlite"
    names = list(PARTITIONS)
    proc = cp.procs["run"]
    watch = CycleWatch(lambda: cp.metrics("run")).start()
    stop = threading.Event()
    reclaims: list[float] = []
    readiness: list[tuple[float, int]] = []
    try:

        def at_target() -> bool:
            if proc.popen.poll() is not None:
                raise AssertionError(f"sco run exited:\n{cp.tail('run')}")
            ready = ready_by_partition(url)
            return all(ready.get(p, 0) >= n for p, n in PARTITIONS.items())

        wait_for(at_target, 300, "every partition at target", every_s=1.0)
        wait_for(lambda: watch.healthy_since(names, time.time() - 5), 60, "healthy cycles")
        threading.Thread(target=_churn, args=(stack, stop, reclaims), daemon=True).start()
        time.sleep(CHURN_S + 2 * INTERVAL_S)  # a reclaim recorded: transitions under way
        log_mark = proc.log.stat().st_size
        filled_at = time.time()
        filler, filler_bytes = _fill(disk)
        log(f"disk full: a {filler_bytes / 1e6:.1f} MB filler took every free byte")
        while time.time() < filled_at + hold_s:
            readiness.append((time.time(), _ready(port)))
            if proc.popen.poll() is not None:
                break
            time.sleep(0.5)
        alive_when_full = proc.popen.poll() is None
        transitions_full = _last_transition_at(db)
        filler.unlink()
        freed_at = time.time()
        log(f"disk freed after {freed_at - filled_at:.0f} s; sco run alive: {alive_when_full}")

        def committed_again() -> float | None:
            if proc.popen.poll() is not None:
                raise AssertionError(f"sco run exited:\n{cp.tail('run')}")
            readiness.append((time.time(), _ready(port)))
            at = _last_transition_at(db)
            return at if at > freed_at else None

        recovered_at = float(wait_for(committed_again, 120, "a transition committed again"))
        healthy_at = wait_for(lambda: watch.healthy_since(names, freed_at), 120, "cycles again")
        stop.set()
        ready_after = float(
            wait_for(lambda: time.time() if _ready(port) == 200 else None, 60, "/readyz ok")
        )
    finally:
        stop.set()
        watch.stop()
    stalled = watch.stalled(names, freed_at + 10, float(healthy_at), 3 * INTERVAL_S, ok_only=True)
    missing = missing_events(url, 60)
    found = settled_audit(url, lambda: stack.servers(tags="sco"))
    fault_log = proc.log.read_bytes()[log_mark:].decode(errors="replace")
    lines = fault_log.splitlines()
    not_ready = [code for at, code in readiness if filled_at + 5 <= at < freed_at]
    exit_code = cp.stop("run")
    with contextlib.closing(sqlite3.connect(db)) as c:
        integrity = str(c.execute("PRAGMA integrity_check").fetchone()[0])
    return FaultResult(
        fault="disk_full_under_sqlite_state",
        recovery_s=max(0.0, recovered_at - freed_at),
        recovered_when="fleet state committed a transition again (a history row written "
        "after the filler was deleted)",
        lost_transitions=found["lost_transitions"],
        lost_events=len(missing),
        duplicate_creates=found["duplicate_creates"],
        leaked_servers=found["leaked_servers"],
        stalled_partitions=len(stalled),
        details={
            "disk_mb": DISK_MB,
            "full_s": round(freed_at - filled_at, 1),
            "alive_when_full": alive_when_full,
            "exit_code": exit_code,
            "integrity_check": integrity,
            "not_ready_while_full": bool(not_ready) and all(c != 200 for c in not_ready),
            "readyz_while_full": sorted(set(not_ready)),
            "ready_again_s": round(ready_after - freed_at, 1),
            "log_lines_during": len(lines),
            "log_lines_naming_disk": sum(
                1 for line in lines if any(w in line.lower() for w in _DISK_WORDS)
            ),
            "tracebacks": fault_log.count("Traceback"),
            "transition_committed_while_full": transitions_full > filled_at + 1,
            "reclaims": len(reclaims),
            "stalled": stalled,
            "transitions": found["history_rows"],
        },
    )
