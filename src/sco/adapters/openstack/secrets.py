"""Where the cloud credential comes from: clouds.yaml (default) or OpenBao.

The credential is wrapped in `Secret` from the moment it is read, so it
cannot reach a log line, an exception, a state row or an event by accident;
it is revealed only when the SDK session is built.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sco.ports import Clock, Credential, PermanentProviderError, RetryableProviderError, Secret

log = logging.getLogger(__name__)


class CloudsYamlSecrets:
    """The credential stays where openstacksdk reads it (clouds.yaml, secure.yaml or
    OS_* variables); sco adds nothing and never sees it."""

    def credential(self) -> Credential:
        return Credential(source="clouds.yaml")


@dataclass(frozen=True, slots=True)
class OpenBaoConfig:
    url: str
    path: str  # KV v2 path whose keys are keystone auth fields
    mount_point: str = "secret"
    token: Secret | None = None  # a token, or an AppRole below
    role_id: str | None = None
    secret_id: Secret | None = None
    lease_s: float = 3600.0  # used when the token reports no TTL
    refresh_fraction: float = 2 / 3  # ask again after this much of the lease
    timeout_s: float = 10.0

    def __post_init__(self) -> None:
        if self.token is None and not (self.role_id and self.secret_id):
            raise ValueError("OpenBao needs a token, or an AppRole role_id and secret_id")
        if not 0 < self.refresh_fraction < 1:
            raise ValueError("refresh_fraction must be in (0, 1)")


class OpenBaoSecrets:
    """Reads the cloud's auth fields from OpenBao's KV v2 engine (hvac speaks
    OpenBao's API, which is Vault's). The credential is given out with the
    token's lease; `credential()` logs in or renews again when that is near."""

    def __init__(self, config: OpenBaoConfig, clock: Clock, client: Any = None) -> None:
        self._config = config
        self._clock = clock
        self._client = client
        self._cached: Credential | None = None
        self._refresh_at = float("-inf")

    def credential(self) -> Credential:
        now = self._clock.now()
        if self._cached is not None and now < self._refresh_at:
            return self._cached
        try:
            fields, lease = self._read()
        except (PermanentProviderError, RetryableProviderError):
            raise
        except Exception as e:
            # hvac's messages can quote the request; keep only the kind.
            raise RetryableProviderError(f"OpenBao read failed: {type(e).__name__}") from None
        self._cached = Credential(
            fields={k: Secret(str(v)) for k, v in fields.items()},
            expires_at=now + lease,
            source=f"openbao:{self._config.mount_point}/{self._config.path}",
        )
        self._refresh_at = now + lease * self._config.refresh_fraction
        log.info("credential read from %s, lease %.0f s", self._cached.source, lease)
        return self._cached

    def _read(self) -> tuple[Mapping[str, Any], float]:
        client = self._connect()
        lease = self._login(client)
        answer = client.secrets.kv.v2.read_secret_version(
            path=self._config.path,
            mount_point=self._config.mount_point,
            raise_on_deleted_version=True,
        )
        data = answer.get("data", {}).get("data")
        if not isinstance(data, Mapping) or not data:
            raise PermanentProviderError(
                f"OpenBao secret {self._config.mount_point}/{self._config.path} holds no fields"
            )
        return data, lease

    def _connect(self) -> Any:
        if self._client is None:
            import hvac

            self._client = hvac.Client(url=self._config.url, timeout=self._config.timeout_s)
        return self._client

    def _login(self, client: Any) -> float:
        """Authenticate (AppRole) or renew the token; the lease in seconds."""
        c = self._config
        if c.role_id and c.secret_id:
            auth = client.auth.approle.login(role_id=c.role_id, secret_id=c.secret_id.reveal())
            return float(auth.get("auth", {}).get("lease_duration") or c.lease_s)
        assert c.token is not None
        client.token = c.token.reveal()
        info = client.auth.token.lookup_self().get("data", {})
        if info.get("renewable"):
            renewed = client.auth.token.renew_self()
            return float(renewed.get("auth", {}).get("lease_duration") or c.lease_s)
        ttl = float(info.get("ttl") or 0)
        return ttl if ttl > 0 else c.lease_s
