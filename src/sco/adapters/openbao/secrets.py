"""The cloud credential from OpenBao's KV v2 engine (the one place `hvac` is imported).

The credential is wrapped in `Secret` from the moment it is read, so it
cannot reach a log line, an exception, a state row or an event by accident;
it is revealed only when the cloud's session is built. Which source a process
uses, and the token or AppRole it logs in with, the assembly decides
(`sco.assembly.secrets`); this package never reads the environment.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sco.ports import Clock, Credential, PermanentProviderError, RetryableProviderError, Secret

log = logging.getLogger(__name__)


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
    # After a failed read, ask again after retry_s, doubling up to retry_max_s.
    retry_s: float = 1.0
    retry_max_s: float = 10.0

    def __post_init__(self) -> None:
        if self.token is None and not (self.role_id and self.secret_id):
            raise ValueError("OpenBao needs a token, or an AppRole role_id and secret_id")
        if not 0 < self.refresh_fraction < 1:
            raise ValueError("refresh_fraction must be in (0, 1)")
        if not 0 < self.retry_s <= self.retry_max_s:
            raise ValueError("retry_s must be > 0 and at most retry_max_s")


class OpenBaoSecrets:
    """Reads the cloud's auth fields from OpenBao's KV v2 engine (hvac speaks
    OpenBao's API, which is Vault's). The credential is given out with the
    token's lease; `credential()` logs in or renews again when that is near.

    OpenBao away at a refresh does not take the cloud away while the credential
    read before is still valid: that one is given out until it expires, and
    OpenBao is asked again after a backoff (`retry_s` doubling up to
    `retry_max_s`), not on every call. Only once it has expired does
    `credential()` raise, naming the expiry and why no new one came."""

    def __init__(self, config: OpenBaoConfig, clock: Clock, client: Any = None) -> None:
        self._config = config
        self._clock = clock
        self._client = client
        self._cached: Credential | None = None
        self._refresh_at = float("-inf")
        self._retry_at = float("-inf")  # after a failed read, not before this
        self._failures = 0
        self._failure: PermanentProviderError | RetryableProviderError | None = None
        self._login_lease_s = 0.0  # the lease of the last AppRole login; 0: none yet
        self.logins = 0  # AppRole logins
        self.renewals = 0  # AppRole token renewals

    def credential(self) -> Credential:
        now = self._clock.now()
        if self._cached is not None and now < self._refresh_at:
            return self._cached
        if self._failure is not None and now < self._retry_at:
            return self._fallback(now, self._failure)
        try:
            fields, lease, version = self._read()
        except (PermanentProviderError, RetryableProviderError) as e:
            return self._failed(now, e)
        except Exception as e:
            # hvac's messages can quote the request; keep only the kind.
            return self._failed(
                now, RetryableProviderError(f"OpenBao read failed: {type(e).__name__}")
            )
        if self._failures:
            log.info("OpenBao answers again after %d failed reads", self._failures)
        self._failures, self._failure, self._retry_at = 0, None, float("-inf")
        self._cached = Credential(
            fields={k: Secret(str(v)) for k, v in fields.items()},
            expires_at=now + lease,
            source=f"openbao:{self._config.mount_point}/{self._config.path}",
            version=version,
        )
        self._refresh_at = now + lease * self._config.refresh_fraction
        log.info(
            "credential read from %s (version %s), lease %.0f s",
            self._cached.source, version, lease,
        )  # fmt: skip
        return self._cached

    def _failed(
        self, now: float, error: PermanentProviderError | RetryableProviderError
    ) -> Credential:
        """A read failed: back off, and give out the cached credential while it is valid."""
        c = self._config
        self._failures += 1
        wait_s = min(c.retry_max_s, c.retry_s * 2 ** (self._failures - 1))
        self._retry_at = now + wait_s
        self._failure = error
        cached = self._cached
        left_s = (cached.expires_at or 0.0) - now if cached is not None else 0.0
        if left_s > 0:
            log.warning(
                "OpenBao: %s; the credential read before stays valid %.0f s more; "
                "next read in %.0f s",
                error,
                left_s,
                wait_s,
            )
        else:
            log.error(
                "OpenBao: %s; %s: the cloud cannot be reached until OpenBao answers; "
                "next read in %.0f s",
                error,
                "no credential yet"
                if cached is None
                else f"the credential expired {-left_s:.0f} s ago",
                wait_s,
            )
        return self._fallback(now, error)

    def _fallback(
        self, now: float, error: PermanentProviderError | RetryableProviderError
    ) -> Credential:
        cached = self._cached
        if cached is not None and cached.expires_at is not None and now < cached.expires_at:
            return cached
        if cached is not None and cached.expires_at is not None:
            why = f"the credential from {cached.source} expired {now - cached.expires_at:.0f} s ago"
            raise type(error)(f"{why} and no new one came: {error}") from None
        raise type(error)(str(error)) from None

    def _read(self) -> tuple[Mapping[str, Any], float, int | None]:
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
        version = (answer.get("data", {}).get("metadata") or {}).get("version")
        return data, lease, version if isinstance(version, int) else None

    def _connect(self) -> Any:
        if self._client is None:
            import hvac

            self._client = hvac.Client(url=self._config.url, timeout=self._config.timeout_s)
        return self._client

    def _login(self, client: Any) -> float:
        """Authenticate (AppRole) or renew the token; the lease in seconds."""
        c = self._config
        if c.role_id and c.secret_id:
            return self._approle(client, c.role_id, c.secret_id)
        assert c.token is not None
        client.token = c.token.reveal()
        info = client.auth.token.lookup_self().get("data", {})
        if info.get("renewable"):
            renewed = client.auth.token.renew_self()
            return float(renewed.get("auth", {}).get("lease_duration") or c.lease_s)
        ttl = float(info.get("ttl") or 0)
        return ttl if ttl > 0 else c.lease_s

    def _approle(self, client: Any, role_id: str, secret_id: Secret) -> float:
        """Renew the token AppRole gave while OpenBao grants most of a full lease again;
        log in afresh when it refuses (the token expired, or was revoked) or caps the
        renewal near the token's max TTL, and revoke the token given up (a token per
        refresh would otherwise pile up until each one's TTL ran out)."""
        import hvac.exceptions

        old = client.token if self._login_lease_s else None
        if old:
            try:
                renewed = client.auth.token.renew_self()
                lease = float(renewed.get("auth", {}).get("lease_duration") or 0)
                if lease >= self._login_lease_s * self._config.refresh_fraction:
                    self.renewals += 1
                    return lease
                why = f"renewal capped at {lease:.0f} s (the token's max TTL is near)"
            except hvac.exceptions.VaultDown:
                raise  # sealed: a login would fail the same way
            except hvac.exceptions.VaultError as e:  # expired, revoked, or at its max TTL
                why = f"renewal refused ({type(e).__name__})"
            log.info("OpenBao: %s; logging in again with AppRole", why)
        auth = client.auth.approle.login(role_id=role_id, secret_id=secret_id.reveal())
        lease = float(auth.get("auth", {}).get("lease_duration") or self._config.lease_s)
        self._login_lease_s = lease
        self.logins += 1
        if old:
            self._revoke(client, old)
        return lease

    def _revoke(self, client: Any, token: str) -> None:
        new, client.token = client.token, token
        try:
            client.auth.token.revoke_self()
        except Exception as e:  # expired already: nothing to revoke
            log.debug("OpenBao: the token given up was not revoked: %s", type(e).__name__)
        finally:
            client.token = new
