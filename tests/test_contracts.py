"""Node contracts: what a node is told, its versions, written with the transitions that
change them (SQLite and PostgreSQL), its token and its agent's acknowledgements."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from sco.adapters.demandfile.intake import FileDemandSource
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.apps.cli import cli
from sco.decide.hedge import HedgeConfig
from sco.decide.policies import ScoPolicy
from sco.domain.contracts import AckStatus, NodeState, terms_of, token_digest
from sco.domain.instances import Instance, created, step
from sco.domain.lifecycle import State, Trigger
from sco.engine.builder import NodeTokens
from sco.engine.clock import ManualClock
from sco.engine.controller import PartitionController
from sco.lab.region import SimConfig, SimRegion
from sco.lab.traces import load_traces
from sco_harness.builders import instance, spot_pool, write_json_trace, write_yaml
from sco_harness.runners import controller_of, ports_of

POOL = spot_pool(zone="a")


@pytest.fixture
def store(fleet_url: str) -> Iterator[SqlFleetStore]:
    s = SqlFleetStore(fleet_url)
    s.upsert_pools([POOL])
    yield s
    s.close()


def _walk(
    store: SqlFleetStore, inst: Instance, *moves: tuple[Trigger, dict[str, object]]
) -> Instance:
    at = 100.0
    for trigger, fields in moves:
        at += 10
        ch = step(inst, trigger, at, str(trigger), **fields)
        store.record([ch])
        inst = ch.after
    return inst


def test_terms_say_what_the_node_needs_and_nothing_else() -> None:
    ready = instance(POOL, State.READY)
    assert terms_of(ready).state is NodeState.SERVING
    assert terms_of(ready).drain_by is None
    noticed = dataclasses.replace(ready, state=State.NOTICED, notice_deadline=500.0)
    assert terms_of(noticed).state is NodeState.LEAVING
    assert terms_of(noticed).drain_by == 500.0, "a notice's deadline is the node's"
    draining = dataclasses.replace(noticed, state=State.DRAINING, drain_by=450.0)
    assert terms_of(draining).drain_by == 450.0
    assert terms_of(dataclasses.replace(ready, reason="anything")) == terms_of(ready)


def _tokened(
    tmp_path: Path, units: int, cycles: tuple[float, ...]
) -> tuple[SimRegion, ManualClock, SqlFleetStore, PartitionController]:
    """A Slurm partition of `units` on the simulated region whose servers get tokens,
    after its first cycles."""
    traces = tmp_path / "traces"
    write_json_trace(traces, "a", [4] * 50, gap_s=600)
    write_yaml(traces / "region.yaml", {"halls": 1, "guaranteed_quota_per_hall": 2})
    demand = write_yaml(
        tmp_path / "demand.yaml",
        {"partitions": [{"name": "p1", "kind": "slurm", "target_units": units,
                         "max_units": 2 * units}]},
    )  # fmt: skip
    region = SimRegion(load_traces(traces), SimConfig())
    clock = ManualClock(0.0)
    store = SqlFleetStore(sqlite_url(tmp_path / "state.db"))
    store.upsert_pools(region.pools())
    source = FileDemandSource.load(demand, "traces", 0.0)
    tokens = NodeTokens(store.contracts, region, 86400.0, frozenset({"p1"}))
    ports = ports_of(region, region, store, source, clock, tokens=tokens)
    c = controller_of(ports, lambda: ScoPolicy(HedgeConfig(max_spare=0)))
    for t in cycles:
        region.advance_to(t)
        clock.set(t)
        c.cycle()
    return region, clock, store, c


def test_servers_get_tokens_that_rotate(tmp_path: Path) -> None:
    """The controller hands each server a token (the simulated provider keeps it where
    the node would read it), keeps only its digest, and issues a new one after
    `sco tokens rotate`."""
    region, _, store, c = _tokened(tmp_path, units=2, cycles=(0.0, 150.0))
    db = tmp_path / "state.db"
    servers = [i.server_id for i in store.instances("p1") if i.server_id]
    assert len(servers) == 2
    first = {s: region.node_token(s) for s in servers}
    for i in store.instances("p1"):
        token = first[str(i.server_id)]
        assert token is not None
        found = store.contracts.by_token(token_digest(token.reveal()), now=200.0)
        assert found is not None
        assert found.instance_id == i.id
    done = CliRunner().invoke(cli, ["tokens", "rotate", "--state", str(db), "p1"])
    assert done.exit_code == 0, done.output
    assert "2 tokens revoked" in done.output
    c.cycle()
    for s in servers:
        token = region.node_token(s)
        assert token is not None
        assert token != first[s]
        old = first[s]
        assert old is not None
        assert store.contracts.by_token(token_digest(old.reveal()), now=200.0) is None
    store.close()


def test_a_token_gone_from_its_server_is_handed_over_again(tmp_path: Path) -> None:
    """The controller tells its issuer which listed servers show no token: one that
    another write to the server's metadata took (Nova writes metadata whole) gets a
    new token at the next cycle, not at the renewal half a day on."""
    region, clock, store, c = _tokened(tmp_path, units=1, cycles=(0.0, 150.0, 160.0))
    (server,) = [str(i.server_id) for i in store.instances("p1") if i.server_id]
    first = region.node_token(server)
    assert first is not None
    region.lose_token(server)  # another write to its metadata took it
    region.advance_to(170.0)
    clock.set(170.0)
    c.cycle()
    again = region.node_token(server)
    assert again is not None
    assert again != first
    assert store.contracts.by_token(token_digest(again.reveal()), now=171.0) is not None
    store.close()


def test_a_new_leader_hands_over_again_a_token_its_predecessor_lost(tmp_path: Path) -> None:
    """A token written away from its server just before a failover: the new leader did
    not hand it over, and sees the server listed without one two cycles running; it
    hands over a new one then, not at the renewal half a day on."""
    region, clock, store, _ = _tokened(tmp_path, units=1, cycles=(0.0, 150.0, 160.0))
    (server,) = [str(i.server_id) for i in store.instances("p1") if i.server_id]
    first = region.node_token(server)
    assert first is not None
    region.lose_token(server)
    tokens = NodeTokens(store.contracts, region, 86400.0, frozenset({"p1"}))
    source = FileDemandSource.load(tmp_path / "demand.yaml", "traces", 0.0)
    ports = ports_of(region, region, store, source, clock, tokens=tokens)
    successor = controller_of(ports, lambda: ScoPolicy(HedgeConfig(max_spare=0)))
    for t in (170.0, 200.0):
        assert region.node_token(server) is None, t
        region.advance_to(t)
        clock.set(t)
        successor.cycle()
    again = region.node_token(server)
    assert again is not None
    assert store.contracts.by_token(token_digest(again.reveal()), now=201.0) is not None
    store.close()


def test_the_status_page_shows_each_contract_and_its_agents_answer(
    store: SqlFleetStore,
) -> None:
    """Issue 28: the contracts and the agents' acknowledgements were nowhere to see."""
    from sco.apps.status import status_of

    serving = instance(POOL, State.REQUESTED, created_at=100.0)
    store.record([created(serving, "new")])
    serving = _walk(store, serving, (Trigger.CREATE_ACCEPTED, {"server_id": "srv-1"}),
                    (Trigger.SERVER_ACTIVE, {}), (Trigger.NODE_JOINED, {}))  # fmt: skip
    leaving = dataclasses.replace(instance(POOL, State.REQUESTED, created_at=100.0), id="i-2")
    store.record([created(leaving, "new")])
    leaving = _walk(store, leaving, (Trigger.CREATE_ACCEPTED, {"server_id": "srv-2"}),
                    (Trigger.SERVER_ACTIVE, {}), (Trigger.NODE_JOINED, {}),
                    (Trigger.RECLAIM_NOTICE, {"notice_deadline": 900.0}))  # fmt: skip
    version = store.contracts.get(leaving.id).version  # type: ignore[union-attr]
    assert store.contracts.ack(leaving.id, version, AckStatus.DRAINED, "", 200.0)
    shown = status_of(store, 300.0)["contracts"]
    assert [(c["instance"], c["server"], c["state"], c["reclaim"], c["ack"]) for c in shown] == [
        ("i-2", "srv-2", "leaving", True, "drained"),  # who must leave comes first
        (serving.id, "srv-1", "serving", False, None),
    ]
    assert shown[0]["drain_by"] == 900.0
    assert shown[0]["ack_at"] == 200.0
    from fastapi.testclient import TestClient

    from sco.apps.status import create_app

    page = TestClient(create_app(store, lambda: 300.0)).get("/").text
    assert 'data-field="state">leaving (reclaim)<' in page
    assert 'data-field="ack">drained at 1970-01-01T00:03:20Z<' in page
