"""Sessions to one cloud from clouds.yaml, rebuilt when the credential is renewed."""

from __future__ import annotations

import logging
import threading
from typing import Any

from sco.adapters.openstack.client import Session
from sco.adapters.openstack.scope import CredentialScope, noauth_scope
from sco.ports import (
    Clock,
    Credential,
    PermanentProviderError,
    RetryableProviderError,
    SecretSource,
)

log = logging.getLogger(__name__)

# Ask for a new credential this long before the old one's lease ends.
_RENEW_BEFORE_S = 300.0


class CloudSessions:
    """`sessions(service)` for `CloudClient`: the SDK proxies of a connection made
    from clouds.yaml (`cloud`), with the auth fields of the secret source laid
    over it. A credential near its expiry is fetched again and the connection
    rebuilt before the next call."""

    def __init__(
        self,
        cloud: str,
        secrets: SecretSource,
        clock: Clock,
        api_timeout_s: float = 30.0,
        clouds_file: str | None = None,
    ) -> None:
        self.cloud = cloud
        self.clouds_file = clouds_file
        self._secrets = secrets
        self._clock = clock
        self._timeout = api_timeout_s
        self._conn: Any = None
        self._credential: Credential | None = None
        self._lock = threading.Lock()

    def __call__(self, service: str) -> Session:
        conn = self._connection()
        proxy: Session = getattr(conn, service)
        return proxy

    def held(self) -> Credential | None:
        """The credential the sessions use now (none asked for yet: None)."""
        return self._credential

    def scope(self) -> CredentialScope:
        """What the credential's token is scoped to and which roles it carries: from
        Keystone's answer, or, for a token given as is (`admin_token`, as behind
        Nova's noauth2), read the way noauth2 reads it. The token is not kept."""
        try:
            return read_scope(self._connection())
        except (PermanentProviderError, RetryableProviderError):
            raise
        except Exception as e:  # keystoneauth raises many kinds; its text may quote
            raise RetryableProviderError(
                f"cloud {self.cloud!r}: the token's scope: {type(e).__name__}"
            ) from None

    def _connection(self) -> Any:
        with self._lock:
            cred = self._credential
            due = cred is None or (
                cred.expires_at is not None
                and self._clock.now() >= cred.expires_at - _RENEW_BEFORE_S
            )
            if self._conn is None or due:
                fresh = self._secrets.credential()
                if self._conn is None or fresh != cred:
                    self._conn = connect(self.cloud, fresh, self._timeout, self.clouds_file)
                self._credential = fresh
            return self._conn


def connect(
    cloud: str, credential: Credential, api_timeout_s: float, clouds_file: str | None = None
) -> Any:
    """An openstacksdk Connection, or a PermanentProviderError naming what is wrong
    (never quoting the credential). `clouds_file`: a clouds.yaml of its own, instead of
    OS_CLIENT_CONFIG_FILE or the usual places."""
    from openstack import connection
    from openstack import exceptions as sdk_errors

    extra: dict[str, Any] = {}
    if credential.fields:
        base = _cloud_auth(cloud, clouds_file)
        extra["auth"] = {**base, **credential.revealed()}
    try:
        region = _loader(clouds_file).get_one(cloud=cloud, api_timeout=api_timeout_s, **extra)
        return connection.Connection(config=region)
    except sdk_errors.ConfigException as e:
        if "not found" in str(e).lower():
            where = clouds_file or "clouds.yaml (OS_CLIENT_CONFIG_FILE or the usual places)"
            raise PermanentProviderError(f"cloud {cloud!r} is not in {where}") from None
        raise PermanentProviderError(f"cloud {cloud!r}: {type(e).__name__}") from None
    except Exception as e:  # keystoneauth raises many kinds
        raise RetryableProviderError(f"cloud {cloud!r}: {type(e).__name__}") from None


def read_scope(conn: Any) -> CredentialScope:
    """The scope of an openstacksdk connection's token (see `CloudSessions.scope`)."""
    from keystoneauth1.identity.base import BaseIdentityPlugin

    session = conn.session
    auth = session.auth
    if not isinstance(auth, BaseIdentityPlugin):
        token = auth.get_token(session) or ""
        return noauth_scope(token)
    access = auth.get_access(session)
    # Only a v3 token made from an application credential has one (else KeyError).
    try:
        app: Any = getattr(access, "application_credential", None)
    except KeyError:
        app = None
    unrestricted = isinstance(app, dict) and app.get("restricted") is False
    return CredentialScope(
        source="keystone",
        project_id=access.project_id if access.project_scoped else None,
        project_name=access.project_name if access.project_scoped else None,
        roles=frozenset(access.role_names or ()),
        system=bool(getattr(access, "system_scoped", False)),
        domain_id=access.domain_id if access.domain_scoped else None,
        unrestricted_app_credential=unrestricted,
    )


def _loader(clouds_file: str | None) -> Any:
    from openstack import config as sdk_config

    if clouds_file:
        return sdk_config.OpenStackConfig(config_files=[clouds_file])
    return sdk_config.OpenStackConfig()


def _cloud_auth(cloud: str, clouds_file: str | None) -> dict[str, Any]:
    # Not validated: the file may hold only what is not secret (an application
    # credential's auth_url, say), the rest coming from the secret source.
    region = _loader(clouds_file).get_one(cloud=cloud, validate=False)
    auth = region.config.get("auth") or {}
    return dict(auth)
