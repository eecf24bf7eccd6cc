"""OpenStack provider: Nova for servers, Placement for headroom (extra `openstack`).

`open_provider` builds the whole chain from a region file's settings and a
clouds.yaml cloud name: credential source, SDK sessions, guarded client,
provider, which acts only in sco's projects once it has `claim`ed them.
Importing this package does not import openstacksdk; connecting does.
"""

from __future__ import annotations

import os

from sco.adapters.openstack.client import CloudClient, RetryConfig
from sco.adapters.openstack.config import RegionSpec
from sco.adapters.openstack.connect import CloudSessions
from sco.adapters.openstack.provider import OpenStackProvider, RegionError
from sco.adapters.openstack.resilience import GuardConfig
from sco.adapters.openstack.secrets import CloudsYamlSecrets, OpenBaoConfig, OpenBaoSecrets
from sco.domain.installation import DEFAULT_INSTALLATION
from sco.ports import Clock, Secret, SecretSource

__all__ = ["OpenStackProvider", "RegionError", "open_provider", "secret_source"]


def secret_source(region: RegionSpec, clock: Clock) -> SecretSource:
    """clouds.yaml by default; OpenBao when the region file names it, with its
    token or AppRole from the environment."""
    bao = region.credential.openbao
    if bao is None:
        return CloudsYamlSecrets()
    token = os.environ.get("BAO_TOKEN") or os.environ.get("VAULT_TOKEN")
    secret_id = os.environ.get("BAO_SECRET_ID")
    config = OpenBaoConfig(
        url=bao.url,
        path=bao.path,
        mount_point=bao.mount_point,
        token=Secret(token) if token else None,
        role_id=os.environ.get("BAO_ROLE_ID"),
        secret_id=Secret(secret_id) if secret_id else None,
        lease_s=bao.lease_s,
    )
    return OpenBaoSecrets(config, clock)


def open_provider(
    region: RegionSpec,
    cloud: str,
    clock: Clock,
    clouds_file: str | None = None,
    installation: str = DEFAULT_INSTALLATION,
) -> OpenStackProvider:
    """A provider for `cloud`, not yet discovered (call `discover`, then `refresh`);
    `clouds_file` is a clouds.yaml to read instead of the usual places; `installation`
    names this sco among those sharing the cloud's projects."""
    sessions = CloudSessions(
        cloud, secret_source(region, clock), clock, region.api_timeout_s, clouds_file
    )
    client = CloudClient(
        sessions,
        clock,
        GuardConfig(rate_per_s=region.rate_per_s, burst=max(int(region.rate_per_s * 2), 1)),
        RetryConfig(),
    )
    return OpenStackProvider(
        region, client, clock, read_scope=sessions.scope, installation=installation,
        held_credential=sessions.held,
    )  # fmt: skip
