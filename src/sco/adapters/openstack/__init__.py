"""OpenStack provider: Nova for servers, Placement for headroom (extra `openstack`).

`open_provider` builds the whole chain from a region file's settings, a
clouds.yaml cloud name and where the credential comes from (`CloudsYamlSecrets`
here, or another `SecretSource` the assembly picks): SDK sessions, guarded
client, provider, which acts only in sco's projects once it has `claim`ed them.
Importing this package does not import openstacksdk; connecting does.
"""

from __future__ import annotations

from sco.adapters.openstack.client import CloudClient, RetryConfig
from sco.adapters.openstack.config import RegionSpec
from sco.adapters.openstack.connect import CloudSessions
from sco.adapters.openstack.provider import OpenStackProvider, RegionError
from sco.adapters.openstack.resilience import GuardConfig
from sco.adapters.openstack.secrets import CloudsYamlSecrets
from sco.domain.installation import DEFAULT_INSTALLATION
from sco.ports import Clock, SecretSource

__all__ = ["CloudsYamlSecrets", "OpenStackProvider", "RegionError", "open_provider"]


def open_provider(
    region: RegionSpec,
    cloud: str,
    secrets: SecretSource,
    clock: Clock,
    clouds_file: str | None = None,
    installation: str = DEFAULT_INSTALLATION,
) -> OpenStackProvider:
    """A provider for `cloud`, not yet discovered (call `discover`, then `refresh`),
    on the credential `secrets` gives; `clouds_file` is a clouds.yaml to read instead
    of the usual places; `installation` names this sco among those sharing the
    cloud's projects."""
    sessions = CloudSessions(cloud, secrets, clock, region.api_timeout_s, clouds_file)
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
