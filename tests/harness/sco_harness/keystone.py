"""Keystone of a Nova stack in Keystone mode (`NovaStack(keystone=True)`): projects,
users and application credentials, made as a cloud operator and a service user would.

The stack's `clouds.yaml` is the admin's (password, project admin). An application
credential is made by its own user (Keystone lets no one else), restricted (it cannot
make further credentials), holding only the roles named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

USER_PASSWORD = "user-secret"
DOMAIN = "default"


@dataclass(frozen=True)
class AppCredential:
    id: str
    secret: str
    user_id: str
    roles: tuple[str, ...]

    def fields(self) -> dict[str, str]:
        """What sco's OpenBao path holds for it."""
        return {"application_credential_id": self.id, "application_credential_secret": self.secret}


def clouds_entry(auth_url: str, **auth: str) -> dict[str, Any]:
    """A clouds.yaml cloud on the stack's Keystone (endpoints from its catalog)."""
    kind = "v3applicationcredential" if "application_credential_id" in auth else "password"
    if kind == "password":
        auth = {"user_domain_id": DOMAIN, "project_domain_id": DOMAIN, **auth}
    return {
        "auth_type": kind,
        "region_name": "RegionOne",
        "identity_api_version": 3,
        "auth": {"auth_url": auth_url, **auth},
    }


def _connect(entry: dict[str, Any]) -> Any:
    from openstack import config as sdk_config
    from openstack import connection

    loader = sdk_config.OpenStackConfig(load_yaml_config=False, load_envvars=False)
    return connection.Connection(config=loader.get_one(**entry))


class Keystone:
    """The admin's view of the stack's identity service."""

    def __init__(self, admin: Any, auth_url: str) -> None:
        self.admin = admin
        self.auth_url = auth_url
        self._roles = {r.name: r for r in admin.identity.roles()}

    def project(self, name: str) -> str:
        ident = self.admin.identity
        found = ident.find_project(name, domain_id=DOMAIN)
        return str((found or ident.create_project(name=name, domain_id=DOMAIN)).id)

    def user(self, name: str, project: str, roles: list[str]) -> str:
        """A user holding `roles` on `project` (by name), with USER_PASSWORD."""
        ident = self.admin.identity
        project_id = self.project(project)
        user = ident.find_user(name, domain_id=DOMAIN) or ident.create_user(
            name=name, password=USER_PASSWORD, domain_id=DOMAIN, default_project_id=project_id
        )
        for role in roles:
            ident.assign_project_role_to_user(project_id, user, self._roles[role])
        return str(user.id)

    def as_user(self, name: str, project: str) -> Any:
        """A connection as that user (password), scoped to the project."""
        entry = clouds_entry(
            self.auth_url, username=name, password=USER_PASSWORD, project_name=project
        )
        return _connect(entry)

    def app_credential(self, user: str, project: str, roles: list[str], name: str) -> AppCredential:
        """Made by the user (who must hold the roles on the project), restricted."""
        conn = self.as_user(user, project)
        user_id = conn.current_user_id
        made = conn.identity.create_application_credential(
            user=user_id,
            name=name,
            unrestricted=False,
            roles=[{"name": r} for r in roles],
        )
        return AppCredential(str(made.id), str(made.secret), str(user_id), tuple(roles))

    def revoke(self, cred: AppCredential) -> None:
        """Delete it, as the cloud operator (its tokens are refused from now on)."""
        self.admin.identity.delete_application_credential(cred.user_id, cred.id)

    def authenticates(self, cred: AppCredential) -> bool:
        """Keystone itself answers whether it still gives a token for it."""
        from keystoneauth1 import exceptions as ks_errors

        conn = _connect(clouds_entry(self.auth_url, **cred.fields()))
        try:
            conn.session.get_token()
        except (ks_errors.Unauthorized, ks_errors.NotFound):  # a deleted one: 404
            return False
        return True
