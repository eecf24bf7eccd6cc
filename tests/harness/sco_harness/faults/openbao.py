"""OpenBao unreachable at the cloud credential's refresh, under `sco run`.

`sco run` (a real process) on the Nova test stack reads its cloud credential
from a real OpenBao (the region file's `credential.openbao`; `sco_harness.bao_server`)
through AppRole (BAO_ROLE_ID and BAO_SECRET_ID), whose tokens last 20 s: the
credential `{token: admin}` is given out with that lease. The credential matters: the
clouds.yaml's own token is one the stack refuses (`invalid-…`: 401), so every
call to Nova and Placement works only with what OpenBao gave. Two static
partitions hold two servers each.

OpenBao stops just before sco refreshes the credential (2/3 into its lease)
and stays down past its expiry (30 s after the refresh; 15 s in the short
tier), so the token sco held has expired too; then it is started and unsealed
again, and sco must log in afresh. Measured:
- stalled_partitions: partitions that, while the credential read before was
  still valid, had a degraded cycle or went more than 3 intervals without a
  cycle (cycles must go on with the cached credential);
- after expiry with OpenBao still away: every partition degraded, no server
  deleted (Nova's listing and sco's delete counters), the log naming OpenBao,
  no traceback, and how often sco asked OpenBao (its log's failed reads);
- lost_transitions, duplicate_creates, leaked_servers: sco_harness.chaos.audit
  of fleet state against Nova; lost_events: committed events missing from the
  embedded event log;
- recovery_s: from OpenBao back to every partition's first undegraded cycle
  after sco read the credential again.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from sco_harness.bao_server import BaoServer
from sco_harness.controlplane import ControlPlaneRun, wait_for
from sco_harness.faults import FaultResult
from sco_harness.faults.watch import (
    HALLS,
    SLOTS,
    CycleWatch,
    clear_servers,
    counter_sum,
    missing_events,
    ready_by_partition,
    settled_audit,
)
from sco_harness.openstack_stack import NovaStack, free_port

BASE_PORT = 19740
LEASE_S = 20
PATH = "sco/openstack"
REFRESH_FRACTION = 2 / 3  # sco.adapters.openbao.OpenBaoConfig's default
INTERVAL_S = 2.0
PARTITIONS = {"web": 2, "batch": 2}


def log(msg: str) -> None:
    print(f"[faults/openbao] {msg}", file=sys.stderr, flush=True)


def run(folder: Path, *, short: bool = False, stack: NovaStack | None = None) -> list[FaultResult]:
    """`stack`: a Nova test stack already up (its servers are deleted at the end);
    None: one of its own on BASE_PORT."""
    folder.mkdir(parents=True, exist_ok=True)
    own = stack is None
    if stack is None:
        stack = NovaStack(folder / "nova", BASE_PORT, HALLS, SLOTS).up()
    bao = BaoServer(folder / "openbao").start()
    cp: ControlPlaneRun | None = None
    try:
        role_id, secret_id = bao.keep_credential(
            {"token": "admin"}, path=PATH, token_ttl=f"{LEASE_S}s", token_max_ttl="1h"
        )
        env = dict(os.environ, BAO_ROLE_ID=role_id, BAO_SECRET_ID=secret_id)
        cp = ControlPlaneRun(folder / "cp", _config(folder, stack, bao), env)
        port = free_port()
        cp.start("run", "run", "--metrics-port", str(port), port=port)
        result = _fault(cp, stack, bao, hold_s=15.0 if short else 30.0)
        log(str(result.as_dict()))
        return [result]
    finally:
        if cp is not None:
            cp.stop_all()
        bao.stop()
        try:
            clear_servers(stack)
        finally:
            if own:
                stack.down()


def _config(folder: Path, stack: NovaStack, bao: BaoServer) -> dict[str, Any]:
    clouds = yaml.safe_load(stack.clouds_yaml.read_text())
    # The stack refuses this token (401): only OpenBao's credential gets sco in.
    clouds["clouds"]["sco-test"]["auth"]["token"] = "invalid-without-openbao"
    clouds_file = folder / "clouds.yaml"
    clouds_file.write_text(yaml.safe_dump(clouds))
    region = stack.region()
    region["credential"] = {
        "openbao": {"url": bao.url, "path": PATH, "mount_point": "secret", "lease_s": LEASE_S}
    }
    region_file = folder / "region.yaml"
    region_file.write_text(yaml.safe_dump(region))
    return {
        "state": {"url": f"sqlite:///{folder / 'state.sqlite'}"},
        "provider": {
            "cloud": "sco-test",
            "region_file": str(region_file),
            "clouds_file": str(clouds_file),
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


def _reads(bao: BaoServer) -> list[float]:
    """When the credential was read (the server's audit log)."""
    return [at for at, path in bao.audit() if path == f"secret/data/{PATH}"]


def _fault(cp: ControlPlaneRun, stack: NovaStack, bao: BaoServer, hold_s: float) -> FaultResult:
    url = cp.config["state"]["url"]
    names = list(PARTITIONS)
    watch = CycleWatch(lambda: cp.metrics("run")).start()
    try:

        def at_target() -> bool:
            if cp.procs["run"].popen.poll() is not None:
                raise AssertionError(f"sco run exited:\n{cp.tail('run')}")
            ready = ready_by_partition(url)
            return all(ready.get(p, 0) >= n for p, n in PARTITIONS.items())

        wait_for(at_target, 300, "every partition at target", every_s=1.0)
        wait_for(lambda: watch.healthy_since(names, time.time() - 5), 60, "healthy cycles")
        # The refresh is due 2/3 into the lease of the last read: go down just before.
        reads = len(_reads(bao))
        wait_for(lambda: len(_reads(bao)) > reads, LEASE_S + 10, "a credential read")
        read_at = _reads(bao)[-1]
        refresh_at = read_at + LEASE_S * REFRESH_FRACTION
        expires_at = read_at + LEASE_S
        time.sleep(max(0.0, refresh_at - 1.5 - time.time()))
        servers_before = {s["id"] for s in stack.servers(tags="sco")}
        deleted_before = counter_sum(cp.metrics("run"), "sco_actions_total", action="deleted")
        log_mark = cp.procs["run"].log.stat().st_size
        down_at = time.time()
        bao.stop()
        log(f"OpenBao down {refresh_at - down_at:.1f} s before the refresh is due")
        time.sleep(max(0.0, refresh_at + hold_s - time.time()))
        servers_during = {s["id"] for s in stack.servers(tags="sco")}
        deleted_during = (
            counter_sum(cp.metrics("run"), "sco_actions_total", action="deleted") - deleted_before
        )
        up_at = time.time()
        bao.start()
        log(f"OpenBao back after {up_at - down_at:.0f} s ({up_at - expires_at:.0f} s past expiry)")
        reread = wait_for(
            lambda: next((t for t in _reads(bao) if t >= up_at), None), 60, "a new read"
        )
        recovered_at = float(
            wait_for(lambda: watch.healthy_since(names, reread), 60, "undegraded cycles")
        )
    finally:
        watch.stop()
    valid_until = expires_at - 0.5
    stalled = sorted(
        set(watch.stalled(names, down_at, valid_until, 3 * INTERVAL_S, ok_only=True))
        | {p for p in names if any(bad for _, bad in watch.cycles(p, down_at, valid_until))}
    )
    # Once expired, a cycle or two may still be finishing: judge from then on.
    degraded_after = {
        p: bool(watch.cycles(p, expires_at + 2 * INTERVAL_S, up_at))
        and all(bad for _, bad in watch.cycles(p, expires_at + 2 * INTERVAL_S, up_at))
        for p in names
    }
    fault_log = cp.procs["run"].log.read_bytes()[log_mark:].decode(errors="replace")
    refused = [line for line in fault_log.splitlines() if "OpenBao read failed" in line]
    missing = missing_events(url, 30)
    found = settled_audit(url, lambda: stack.servers(tags="sco"))
    return FaultResult(
        fault="openbao_unreachable_at_refresh",
        recovery_s=max(0.0, recovered_at - up_at),
        recovered_when="sco read the credential from OpenBao again and every partition then "
        "completed an undegraded cycle",
        lost_transitions=found["lost_transitions"],
        lost_events=len(missing),
        duplicate_creates=found["duplicate_creates"],
        leaked_servers=found["leaked_servers"],
        stalled_partitions=len(stalled),
        details={
            "lease_s": LEASE_S,
            "down_before_refresh_s": round(refresh_at - down_at, 1),
            "down_s": round(up_at - down_at, 1),
            "expired_s": round(up_at - expires_at, 1),
            "stalled_while_valid": stalled,
            "degraded_after_expiry": degraded_after,
            "servers_gone_during_fault": len(servers_before - servers_during),
            "deletes_during_fault": int(deleted_during),
            "openbao_attempts_while_down": len(refused),
            "openbao_log_lines": sum(1 for line in fault_log.splitlines() if "OpenBao" in line),
            "tracebacks": fault_log.count("Traceback"),
            "reread_after_up_s": round(reread - up_at, 1),
            "run_exit": cp.procs["run"].popen.poll(),
        },
    )
