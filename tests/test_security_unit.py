"""Least privilege without a cloud: what the credential may do, and foreign servers.

The cloud here is a small Nova of servers in several projects that lists the way
Nova does (a project-scoped listing shows the token's project; `all_tenants`, for
an admin, every project), answers by id across projects as Nova does for an
admin, and records every change it is asked for.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from keystoneauth1 import token_endpoint
from keystoneauth1.access import create as access_create
from keystoneauth1.identity.access import AccessInfoPlugin
from prometheus_client import CollectorRegistry, generate_latest

from sco.adapters.openstack.config import RegionSpec
from sco.adapters.openstack.connect import read_scope
from sco.adapters.openstack.projects import FOREIGN_TTL_S, ForeignServer
from sco.adapters.openstack.provider import OpenStackProvider
from sco.adapters.openstack.resources import (
    META_NODE_TOKEN,
    META_RECLAIM_AT,
    partition_tag,
    request_tag,
    server_metadata,
    server_tags,
)
from sco.adapters.openstack.scope import (
    CredentialScope,
    ScopeError,
    excess,
    noauth_scope,
    ownership,
)
from sco.assembly.settings import SettingsError, load
from sco.engine.clock import ManualClock
from sco.engine.metrics import CredentialMetrics
from sco.engine.reclaimer import Reclaimer
from sco.ports import Credential, Secret

OURS = "p-sco"
THEIRS = "p-mallory"

# ---------------------------------------------------------------- the credential's scope


def test_noauth_tokens_read_as_noauth2_reads_them() -> None:
    admin = noauth_scope("admin")
    assert (admin.project_id, admin.roles) == ("admin", {"admin", "member", "reader"})
    assert noauth_scope("admin#canary-1").roles == admin.roles
    assert noauth_scope("admin:sco").project_id == "sco"
    user = noauth_scope("sco-bot:sco")
    assert (user.project_id, user.roles) == ("sco", {"member", "reader"})
    assert noauth_scope("alice").project_id == "alice"
    assert "canary" not in repr(noauth_scope("admin#canary-1"))


def _scope(**kw: Any) -> CredentialScope:
    base: dict[str, Any] = {
        "source": "keystone",
        "project_id": OURS,
        "roles": frozenset({"member", "reader"}),
    }
    return CredentialScope(**(base | kw))


@pytest.mark.parametrize(
    ("scope", "needed", "found"),
    [
        (_scope(), ("member", "reader"), []),
        (_scope(roles=frozenset({"member", "reader", "admin"})), ("member", "reader"), ["admin"]),
        (_scope(project_id=None, system=True), ("member", "reader"), ["system scope"]),
        (_scope(project_id=None, domain_id="d1"), ("member", "reader"), ["domain d1"]),
        (
            _scope(roles=frozenset({"member", "reader", "heat_stack_owner"})),
            ("member", "reader"),
            ["beyond provider.roles: heat_stack_owner"],
        ),
        (
            _scope(roles=frozenset({"member", "sco-capacity-reader"})),
            ("member", "reader", "sco-capacity-reader"),
            [],
        ),
        (_scope(unrestricted_app_credential=True), ("member", "reader"), ["unrestricted"]),
        # An operator who names admin in provider.roles has accepted it.
        (_scope(roles=frozenset({"admin", "member"})), ("admin", "member"), []),
    ],
)
def test_excess_names_each_way_the_credential_could_do_more(
    scope: CredentialScope, needed: tuple[str, ...], found: list[str]
) -> None:
    got = excess(scope, needed)
    assert len(got) == len(found), got
    for phrase, part in zip(got, found, strict=True):
        assert part in phrase


def test_ownership_defaults_to_the_credentials_project() -> None:
    owned = ownership(_scope(), [], creates=True)
    assert owned.projects == {OURS}
    assert not owned.beyond_credential
    assert owned.owns(OURS)
    assert not owned.owns(THEIRS)
    assert not owned.owns(None)


def test_ownership_refuses_what_sco_could_not_keep_to() -> None:
    # Creating in a project that is not sco's would make servers sco may never touch.
    with pytest.raises(ScopeError, match="not one of sco's projects"):
        ownership(_scope(), ["p-other"], creates=True)
    # The operator's reclaimer creates nothing: its admin credential reaches sco's projects.
    admin = _scope(project_id="admin", roles=frozenset({"admin", "member", "reader"}))
    owned = ownership(admin, [OURS], creates=False)
    assert owned.beyond_credential == {OURS}
    # Listing other projects than the credential's needs an admin.
    with pytest.raises(ScopeError, match="without the admin role"):
        ownership(_scope(), [OURS, "p-two"], creates=True)
    with pytest.raises(ScopeError, match="not scoped to a project"):
        ownership(_scope(project_id=None, system=True), [], creates=False)


def _v3_token(roles: list[str], **scope: Any) -> dict[str, Any]:
    """A Keystone v3 token body, as `POST /v3/auth/tokens` answers."""
    token: dict[str, Any] = {
        "expires_at": "2099-01-01T00:00:00Z",
        "user": {"id": "u1", "name": "sco", "domain": {"id": "default", "name": "Default"}},
        "roles": [{"id": f"r-{r}", "name": r} for r in roles],
        "methods": ["password"],
        **scope,
    }
    return {"token": token}


def test_scope_read_from_keystone_tokens() -> None:
    def scope_of(body: dict[str, Any]) -> CredentialScope:
        auth = AccessInfoPlugin(access_create(body=body, auth_token="t"))

        class _Conn:
            session = type("S", (), {"auth": auth})()

        return read_scope(_Conn())

    project = {"project": {"id": OURS, "name": "sco", "domain": {"id": "default"}}}
    got = scope_of(_v3_token(["member", "reader"], **project))
    assert (got.source, got.project_id, got.project_name) == ("keystone", OURS, "sco")
    assert got.roles == {"member", "reader"}
    assert excess(got) == []

    got = scope_of(_v3_token(["admin"], system={"all": True}))
    assert got.system
    assert got.project_id is None
    assert len(excess(got)) == 2  # system scope, admin role

    domain = {"domain": {"id": "d1", "name": "D1"}}
    assert scope_of(_v3_token(["member"], **domain)).domain_id == "d1"

    app = _v3_token(["member"], **project)
    app["token"]["application_credential"] = {"id": "ac-1", "name": "sco", "restricted": False}
    assert scope_of(app).unrestricted_app_credential
    app["token"]["application_credential"]["restricted"] = True
    assert not scope_of(app).unrestricted_app_credential

    class _Noauth:
        session = type("S", (), {"auth": token_endpoint.Token("http://nova", "admin:sco")})()

    got = read_scope(_Noauth())
    assert (got.source, got.project_id, "admin" in got.roles) == ("noauth2 token", "sco", True)


def test_projects_and_roles_are_settings(tmp_path: Any) -> None:
    config = tmp_path / "sco.yaml"
    config.write_text("provider: {cloud: c, projects: [p1, p2], roles: [member, sco-reader]}\n")
    s = load(config)
    assert s.provider.projects == ["p1", "p2"]
    assert s.provider.roles == ["member", "sco-reader"]
    assert load(None).provider.roles == ["member", "reader"]
    config.write_text("provider: {projects: ['']}\n")
    with pytest.raises(SettingsError, match=r"provider\.projects"):
        load(config)


# ---------------------------------------------------------------- foreign servers


class _Nova:
    """Servers in several projects, listed and changed as Nova does for a token of
    `project` (an admin token: by id, any project's server)."""

    def __init__(self, project: str, shows_all: bool = False) -> None:
        self.project = project
        self.shows_all = shows_all  # a policy that lists more than the token's project
        self.servers: dict[str, dict[str, Any]] = {}
        self.changes: list[tuple[str, str]] = []  # (verb, path)
        self.posted = 0

    def add(self, sid: str, project: str, partition: str = "p1", **meta: str) -> None:
        metadata = server_metadata(partition, "r/h/f", "spot", f"req-{sid}", 1) | meta
        self.servers[sid] = {
            "id": sid,
            "tenant_id": project,
            "status": "ACTIVE",
            "created": "2026-11-29T10:00:00Z",
            "metadata": metadata,
            "tags": server_tags(partition, f"req-{sid}"),
        }

    def get(self, service: str, path: str, params: Any = None, ok_missing: bool = False) -> Any:
        if path == "/servers/detail":
            params = dict(params or {})
            everyone = params.get("all_tenants") == "1" or self.shows_all
            found = [
                s
                for s in self.servers.values()
                if (everyone or s["tenant_id"] == self.project)
                and (params.get("tags") is None or params["tags"] in s["tags"])
            ]
            return {"servers": found}
        sid = path.split("/")[2]
        server = self.servers.get(sid)
        if server is None:
            assert ok_missing
            return None
        if path.endswith("/metadata"):
            return {"metadata": server["metadata"]}
        return {"server": server}

    def delete(self, service: str, path: str) -> None:
        self.changes.append(("DELETE", path))
        self.servers.pop(path.split("/")[2], None)

    def put(self, service: str, path: str, body: Any = None) -> Any:
        self.changes.append(("PUT", path))
        self.servers[path.split("/")[2]]["metadata"].update(body["meta"])
        return body

    def post(self, service: str, path: str, body: Any) -> Any:
        self.posted += 1
        return {"reservation_id": "r-1"}


def _provider(nova: _Nova, scope: CredentialScope, projects: list[str], creates: bool) -> Any:
    spec = RegionSpec.model_validate(
        {
            "region": "r",
            "image": "i",
            "pools": [
                {"hall": "h", "flavor": "f", "class": "spot", "price_per_h": 1},
                {"hall": "h", "flavor": "g", "class": "guaranteed", "price_per_h": 3},
            ],
        }
    )
    provider = OpenStackProvider(spec, nova, ManualClock(1000.0), read_scope=lambda: scope)  # type: ignore[arg-type]
    provider.claim(projects, creates)
    return provider


def _nova_with_a_stranger() -> _Nova:
    """Two of sco's servers, and one of another project carrying sco's tags and
    metadata, its notice long past."""
    nova = _Nova(OURS)
    nova.add("ours-1", OURS)
    nova.add("ours-2", OURS)
    nova.add("theirs", THEIRS, **{META_RECLAIM_AT: "1"})
    return nova


def test_a_foreign_server_in_a_listing_is_reported_once_and_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    nova = _nova_with_a_stranger()
    # Listed across tenants, as an admin credential may (or a Nova that shows too much).
    admin = _scope(project_id="admin", roles=frozenset({"admin"}))
    provider = _provider(nova, admin, [OURS], creates=False)
    with caplog.at_level(logging.WARNING):
        for _ in range(3):
            views = provider.list("p1")
    assert {v.server_id for v in views} == {"ours-1", "ours-2"}
    warned = [r.getMessage() for r in caplog.records if "foreign server" in r.getMessage()]
    assert warned == [
        f"foreign server theirs in project {THEIRS} left alone (in a listing): "
        f"sco's projects are {OURS}"
    ]
    assert provider.foreign_servers() == {THEIRS: 1}
    assert {v.server_id for v in provider.all_servers()} == {"ours-1", "ours-2"}
    # A listing not made again (a partition another replica leads now) stops counting.
    provider.clock.advance(FOREIGN_TTL_S + 1)
    assert provider.foreign_servers() == {}
    # Gone from the cloud: gone from the count.
    del nova.servers["theirs"]
    provider.list("p1")
    provider.all_servers()
    assert provider.foreign_servers() == {}


def test_the_reclaimer_never_notices_or_deletes_a_foreign_server() -> None:
    nova = _nova_with_a_stranger()
    admin = _scope(project_id="admin", roles=frozenset({"admin"}))
    provider = _provider(nova, admin, [OURS], creates=False)
    nova.servers["ours-2"]["metadata"][META_RECLAIM_AT] = "1"
    reclaimer = Reclaimer(provider, ManualClock(1000.0))
    assert reclaimer.sweep() == ["ours-2"]
    assert "theirs" in nova.servers
    assert reclaimer.request("h", "f", 5, 60, _budget()).choice.victims
    assert not any("theirs" in path for _, path in nova.changes)


def _budget() -> Any:
    from sco.decide.reclaim import Budget

    return Budget(None, None)


def test_the_sweep_deletes_only_spot_servers_whose_notice_reads_as_a_passed_deadline(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Regression (issue 25, item 7): a `sco:reclaim-at` that was not a time read as
    "now", and the sweep deleted every server carrying one, guaranteed ones too."""
    nova = _Nova(OURS)
    nova.add("due", OURS, **{META_RECLAIM_AT: "999"})
    nova.add("due-iso", OURS, **{META_RECLAIM_AT: "1970-01-01T00:10:00+00:00"})
    nova.add("later", OURS, **{META_RECLAIM_AT: "5000"})
    nova.add("junk", OURS, **{META_RECLAIM_AT: "soon"})
    nova.add("nan", OURS, **{META_RECLAIM_AT: "nan"})
    guaranteed = {"sco:pool": "r/h/g", "sco:class": "guaranteed"}
    nova.add("paid-for", OURS, **guaranteed, **{META_RECLAIM_AT: "1"})
    nova.add("paid-for-junk", OURS, **guaranteed, **{META_RECLAIM_AT: "soon"})
    provider = _provider(nova, _scope(), [], creates=False)
    reclaimer = Reclaimer(provider, ManualClock(1000.0))
    with caplog.at_level(logging.WARNING):
        assert sorted(reclaimer.sweep()) == ["due", "due-iso"]
    assert set(nova.servers) == {"later", "junk", "nan", "paid-for", "paid-for-junk"}
    said = caplog.text
    assert "junk (p1) left alone: its notice 'soon' is not a deadline" in said
    assert "nan (p1) left alone: its notice 'nan' is not a deadline" in said
    assert "paid-for (p1) left alone" in said
    # Unreadable notices are not waited for either: nothing of them is pending.
    assert reclaimer.pending() == {"p1": 1}


def test_give_notice_reads_the_notice_in_force_and_never_guesses_one() -> None:
    """Regression (issue 25, item 7): an existing notice that `float()` could not read
    (ISO 8601, which the contract allows, or junk) was answered as a deadline of 0."""
    nova = _Nova(OURS)
    nova.add("iso", OURS, **{META_RECLAIM_AT: "1970-01-01T00:10:00+00:00"})
    nova.add("junk", OURS, **{META_RECLAIM_AT: "soon"})
    nova.add("free", OURS)
    provider = _provider(nova, _scope(), [], creates=False)
    provider.all_servers()
    assert provider.give_notice("iso", 2000.0) == 600.0
    from sco.adapters.openstack.resources import UnreadableNotice

    with pytest.raises(UnreadableNotice, match="sco:reclaim-at='soon' is not a deadline"):
        provider.give_notice("junk", 2000.0)
    assert nova.servers["junk"]["metadata"][META_RECLAIM_AT] == "soon"
    assert provider.give_notice("free", 2000.0) == 2000.0
    assert nova.changes == [("PUT", f"/servers/free/metadata/{META_RECLAIM_AT}")]


def test_actions_by_id_refuse_servers_outside_sco_projects() -> None:
    """Defence in depth: an admin credential may delete, tag and read any project's
    server by id, so an id is acted on only when sco's listing showed it, or Nova
    says it is in one of sco's projects."""
    nova = _nova_with_a_stranger()
    admin = _scope(roles=frozenset({"admin", "member"}))  # scoped to sco's project
    provider = _provider(nova, admin, [], creates=True)
    provider.list("p1")
    nova.add("ours-late", OURS)  # sco's, not yet in a listing: Nova is asked
    with pytest.raises(ForeignServer, match="1 servers outside"):
        provider.delete(["ours-1", "theirs", "ours-late", "gone-already"])
    assert nova.changes == [("DELETE", "/servers/ours-1"), ("DELETE", "/servers/ours-late")]
    assert "theirs" in nova.servers
    with pytest.raises(ForeignServer):
        provider.give_notice("theirs", 2000.0)
    with pytest.raises(ForeignServer):
        provider.deliver_token("theirs", Secret("node-token-canary"))
    assert META_NODE_TOKEN not in nova.servers["theirs"]["metadata"]
    assert len(nova.changes) == 2
    assert provider.refused_total == 3
    provider.deliver_token("ours-2", Secret("node-token-canary"))
    assert nova.servers["ours-2"]["metadata"][META_NODE_TOKEN] == "node-token-canary"


def test_a_foreign_server_with_our_request_tag_does_not_stand_for_our_create() -> None:
    """Before sending a create sco looks for servers of its request id (sent before a
    crash?); one of another project carrying that tag is not sco's answer."""
    nova = _Nova(OURS, shows_all=True)
    nova.add("decoy", OURS)
    nova.servers["decoy"]["tenant_id"] = THEIRS
    nova.servers["decoy"]["tags"] = server_tags("p1", "req-1")
    provider = _provider(nova, _scope(), [], creates=True)
    pool = provider.pools()[0]
    from sco.adapters.openstack.provider import ResolvedPool
    from sco.adapters.openstack.resources import ResourceRequest

    spec = provider.region.pools[0]
    provider._pools = {
        pool.id: ResolvedPool(pool, spec, "fl", 1, 512, ResourceRequest({"VCPU": 1}), "a")
    }
    result = provider.create(pool.id, 1, "req-1", "p1", 1)
    assert nova.posted == 1
    assert result.server_ids == ()
    assert request_tag("req-1") in nova.servers["decoy"]["tags"]


def test_only_projects_beyond_the_credentials_are_listed_across_tenants() -> None:
    asked: list[dict[str, str]] = []

    class _Asking(_Nova):
        def get(self, service: str, path: str, params: Any = None, ok_missing: bool = False) -> Any:
            if path == "/servers/detail":
                asked.append(dict(params))
            return super().get(service, path, params, ok_missing)

    own = _provider(_Asking(OURS), _scope(), [], creates=True)
    own.list("p1")
    assert "all_tenants" not in asked[-1]
    assert asked[-1]["tags"] == partition_tag("p1")
    admin = _scope(project_id="admin", roles=frozenset({"admin"}))
    _provider(_Asking("admin"), admin, [OURS], creates=False).all_servers()
    assert asked[-1]["all_tenants"] == "1"


def test_credential_metrics_show_excess_and_foreign_servers() -> None:
    registry = CollectorRegistry()
    foreign = {THEIRS: 2}
    refused = [0]
    metrics = CredentialMetrics(
        registry, ["role admin", "system scope"], lambda: dict(foreign), lambda: refused[0]
    )
    metrics.refresh()
    text = generate_latest(registry).decode()
    assert "sco_credential_excess 2.0" in text
    assert f'sco_foreign_servers{{project="{THEIRS}"}} 2.0' in text
    foreign.clear()
    refused[0] = 3
    metrics.refresh()
    text = generate_latest(registry).decode()
    assert f'sco_foreign_servers{{project="{THEIRS}"}} 0.0' in text
    assert "sco_foreign_refusals_total 3.0" in text


def test_credential_metrics_show_the_version_in_use() -> None:
    """A rotation is done when every replica's sco_credential_version shows the new
    version: until then the old credential must not be revoked."""
    registry = CollectorRegistry()
    held: list[Credential | None] = [None]
    metrics = CredentialMetrics(registry, [], dict, lambda: 0, lambda: held[0])
    metrics.refresh()
    assert "sco_credential_version{" not in generate_latest(registry).decode()
    held[0] = Credential(source="openbao:secret/sco/openstack", version=3)
    metrics.refresh()
    text = generate_latest(registry).decode()
    assert 'sco_credential_version{source="openbao:secret/sco/openstack"} 3.0' in text


# ---------------------------------------------------------------- regressions


def test_config_check_masks_secret_kafka_client_properties(tmp_path: Any) -> None:
    """Found by the canary scan's review: `events.kafka.client` passes further
    librdkafka properties through, and `sco config check` printed them as given,
    an OAUTHBEARER client secret or keystore password with them."""
    import subprocess
    import sys

    config = tmp_path / "sco.yaml"
    config.write_text(
        "events: {kind: kafka, kafka: {brokers: 'k:9092', client: {"
        "sasl.oauthbearer.client.secret: cnry-oauth-51, ssl.keystore.password: cnry-ks-52, "
        "ssl.key.pem: cnry-pem-53, linger.ms: '5'}}}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", "config", "check", str(config)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "cnry" not in done.stdout + done.stderr
    assert "linger.ms: '5'" in done.stdout  # what is not secret is shown as given
    assert load(config).events.kafka is not None
    assert load(config).events.kafka.librdkafka()["ssl.keystore.password"] == "cnry-ks-52"
