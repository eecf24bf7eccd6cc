"""What the cloud credential may do, and which projects' servers are sco's.

Pure: the adapter reads the token's scope (Keystone's answer, or a noauth2
token's text) into a `CredentialScope`; the functions here decide what sco
owns and what of the credential is more than sco needs. Nothing here holds
or returns the token itself.

sco needs, in each project it owns: to list, create, delete and tag servers
and set their metadata (Nova's `member`), and to read flavors, host
aggregates, limits and Placement's allocation candidates (the last two are
admin-only under Nova's and Placement's default policies: a cloud grants them
to a role of its own, named in `provider.roles`; see docs/security.md).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

# The roles a project-scoped credential needs, unless `provider.roles` says otherwise.
NEEDED_ROLES = ("member", "reader")
ADMIN_ROLES = frozenset({"admin"})


@dataclass(frozen=True, slots=True)
class CredentialScope:
    """The scope and roles of the credential's token, as the cloud reports them."""

    source: str  # "keystone" or "noauth2 token": where this was read from
    project_id: str | None = None  # None: not project-scoped
    project_name: str | None = None
    roles: frozenset[str] = frozenset()
    system: bool = False  # a system-scoped token: every project of the cloud
    domain_id: str | None = None  # a domain-scoped token: every project of the domain
    unrestricted_app_credential: bool = False  # may create further credentials

    @property
    def project(self) -> str:
        """The project as a person reads it: its name and id when both are known."""
        if self.project_id is None:
            return "no project"
        if self.project_name and self.project_name != self.project_id:
            return f"{self.project_name} ({self.project_id})"
        return self.project_id

    def describe(self) -> str:
        roles = ", ".join(sorted(self.roles)) or "none"
        where = (
            "system scope"
            if self.system
            else f"domain {self.domain_id}"
            if self.domain_id
            else f"project {self.project}"
        )
        return f"{where}, roles {roles} ({self.source})"


def noauth_scope(token: str) -> CredentialScope:
    """A token as Nova's and Placement's `noauth2` read it: `USER[:PROJECT]`, the
    project defaulting to the user, and the admin role for the user `admin` (the
    test stack also reads `admin#ANYTHING` as `admin`)."""
    user, _, project = token.partition(":")
    user = user.split("#", 1)[0]
    project = project or user
    roles = {"admin", "member", "reader"} if user == "admin" else {"member", "reader"}
    return CredentialScope("noauth2 token", project, project, frozenset(roles))


@dataclass(frozen=True, slots=True)
class Ownership:
    """The projects whose servers sco may act on, and the credential's own among them."""

    projects: frozenset[str]
    credential_project: str | None

    @property
    def beyond_credential(self) -> frozenset[str]:
        """Owned projects other than the credential's: listing them needs all tenants."""
        if self.credential_project is None:
            return self.projects
        return self.projects - {self.credential_project}

    def owns(self, project: object) -> bool:
        return isinstance(project, str) and project in self.projects


class ScopeError(ValueError):
    """The configured projects and the credential do not fit; the message says how."""


def ownership(scope: CredentialScope, configured: Collection[str], creates: bool) -> Ownership:
    """sco's projects: `configured` (`provider.projects`), else the credential's own.

    Raises ScopeError when sco could not keep to them: a credential scoped to no
    project with none configured; for a command that creates servers, a
    credential scoped to a project that is not one of sco's (what it created there
    would be foreign to it: never adopted, never deleted); projects beyond the
    credential's own that only an admin may list."""
    projects = frozenset(configured)
    if not projects:
        if scope.project_id is None:
            raise ScopeError(
                f"the credential is not scoped to a project ({scope.describe()}): "
                "name sco's projects in provider.projects"
            )
        projects = frozenset({scope.project_id})
    owned = Ownership(projects, scope.project_id)
    if creates and scope.project_id not in projects:
        raise ScopeError(
            f"the credential is scoped to {scope.project}, not one of sco's projects "
            f"({', '.join(sorted(projects))}): the servers it created there would not be sco's"
        )
    if owned.beyond_credential and not (scope.roles & ADMIN_ROLES or scope.system):
        raise ScopeError(
            f"{', '.join(sorted(owned.beyond_credential))} cannot be listed with a credential "
            f"scoped to {scope.project} without the admin role"
        )
    return owned


def excess(scope: CredentialScope, needed_roles: Collection[str] = NEEDED_ROLES) -> list[str]:
    """What the credential could do beyond what sco needs, one phrase each; [] when
    it is a project-scoped credential with only the roles sco needs."""
    found: list[str] = []
    if scope.system:
        found.append("system scope (every project of the cloud)")
    if scope.domain_id is not None:
        found.append(f"domain scope (every project of domain {scope.domain_id})")
    admin = sorted(scope.roles & ADMIN_ROLES - set(needed_roles))
    if admin:
        found.append(f"role {', '.join(admin)} (every server of every project, by id)")
    others = sorted(scope.roles - ADMIN_ROLES - set(needed_roles))
    if others:
        found.append(f"roles beyond provider.roles: {', '.join(others)}")
    if scope.unrestricted_app_credential:
        found.append("an unrestricted application credential (it may create credentials)")
    return found
