"""Where the cloud credential comes from: clouds.yaml (openstacksdk's own places) by
default, or OpenBao when the region file names it (`credential.openbao`), logging in
with a token or an AppRole from the environment. The environment is read here, at
the entry, never by an adapter."""

from __future__ import annotations

import os
from collections.abc import Mapping

from sco.adapters.openbao import OpenBaoConfig, OpenBaoSecrets
from sco.adapters.openstack.config import RegionSpec
from sco.adapters.openstack.secrets import CloudsYamlSecrets
from sco.assembly.wiring import StartError
from sco.ports import Clock, Secret, SecretSource

__all__ = ["secret_source"]


def secret_source(
    region: RegionSpec, clock: Clock, environ: Mapping[str, str] = os.environ
) -> SecretSource:
    """clouds.yaml, or OpenBao logging in with the AppRole `BAO_ROLE_ID` and
    `BAO_SECRET_ID` from `environ`, or else its token `BAO_TOKEN` (or `VAULT_TOKEN`).
    StartError when the region file names OpenBao and neither is there."""
    bao = region.credential.openbao
    if bao is None:
        return CloudsYamlSecrets()
    token = environ.get("BAO_TOKEN") or environ.get("VAULT_TOKEN")
    role_id = environ.get("BAO_ROLE_ID")
    secret_id = environ.get("BAO_SECRET_ID")
    if not token and not (role_id and secret_id):
        raise StartError(
            "the region file's credential.openbao: no token or AppRole to log in with: "
            "set BAO_TOKEN (or VAULT_TOKEN), or BAO_ROLE_ID and BAO_SECRET_ID, in the "
            "environment"
        )
    config = OpenBaoConfig(
        url=bao.url,
        path=bao.path,
        mount_point=bao.mount_point,
        token=Secret(token) if token else None,
        role_id=role_id,
        secret_id=Secret(secret_id) if secret_id else None,
        lease_s=bao.lease_s,
    )
    return OpenBaoSecrets(config, clock)
