"""The node agent against a real distributor over fleet state: it drains when its
contract says leave, acknowledges, keeps its word with the distributor away and
across its own restart, and reads its token again after a rotation."""

from __future__ import annotations

import itertools
import json
import re
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.adapters.standalone import AgentNodes
from sco.agent import Agent, AgentConfig, AgentState
from sco.apps.distributor import DistributorConfig, create_app
from sco.domain.contracts import Contract, MalformedContract, NodeState, token_digest
from sco.domain.instances import Instance, created, step
from sco.domain.lifecycle import State, Trigger
from sco.ports import ServerStatus, ServerView
from sco_harness.builders import instance, spot_pool
from sco_harness.controlplane import wait_for

POOL = spot_pool(zone="a")
RECORD = "import os,sys; open(sys.argv[1],'a').write(os.environ['SCO_DRAIN_BY']+'\\n')"
DRAIN = f"{sys.executable} -c \"{RECORD}; print('3 pods evicted')\""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlFleetStore]:
    s = SqlFleetStore(sqlite_url(tmp_path / "fleet.db"))
    s.upsert_pools([POOL])
    yield s
    s.close()


@pytest.fixture
def client(store: SqlFleetStore) -> Iterator[TestClient]:
    with TestClient(create_app(store.contracts, DistributorConfig(poll_s=0.05))) as c:
        yield c


def _node(store: SqlFleetStore, token_file: Path) -> Instance:
    inst = instance(POOL, State.READY)
    store.record([created(inst, "seeded")])
    token = secrets.token_urlsafe(32)
    token_file.write_text(token + "\n")
    store.contracts.set_token(inst.id, token_digest(token), 1e12, 0.0)
    return inst


def _agent(tmp: Path, http: httpx.Client, marks: Path) -> Agent:
    config = AgentConfig(
        distributor="http://testserver",
        state_file=tmp / "agent.json",
        drain_command=f"{DRAIN} {marks}",
        token_file=tmp / "token",
        wait_s=0.2,
    )
    return Agent(config, http=http)


def _served_notice(tmp: Path, client: TestClient) -> httpx.Response:
    """The distributor serves from a copy its feed refreshes; on a loaded machine the
    notice reaches that copy late, so tests wait for it rather than race it."""
    auth = {"Authorization": f"Bearer {(tmp / 'token').read_text().strip()}"}
    got: httpx.Response = wait_for(
        lambda: (g := client.get("/v1/contract", headers=auth)).json()["state"] == "leaving" and g,
        60,
        "the distributor's copy to show the notice",
    )
    return got


def _had_read_the_notice(tmp: Path, client: TestClient) -> None:
    """The agent's state file as if it had read the contract that says leave."""
    r = _served_notice(tmp, client)
    AgentState(etag=r.headers["ETag"], contract=Contract.from_json(r.json())).save(
        tmp / "agent.json"
    )


def _notice(store: SqlFleetStore, inst: Instance, deadline: float) -> Instance:
    ch = step(inst, Trigger.RECLAIM_NOTICE, 10.0, "n", notice_deadline=deadline)
    store.record([ch])
    return ch.after


def test_told_to_leave_it_drains_once_and_acknowledges(
    tmp_path: Path, store: SqlFleetStore, client: TestClient
) -> None:
    inst = _node(store, tmp_path / "token")
    marks = tmp_path / "drains"
    a = _agent(tmp_path, client, marks)
    a.step()
    assert a.state.contract is not None
    assert a.state.contract.terms.state is NodeState.SERVING
    assert not marks.exists()
    _notice(store, inst, 4_000_000_000.0)
    _served_notice(tmp_path, client)
    for _ in range(3):
        a.step()
    assert marks.read_text().split() == ["4000000000"]
    c = store.contracts.get(inst.id)
    assert c is not None
    assert (str(c.acked), c.ack_detail) == ("drained", "3 pods evicted")
    listing = [ServerView(str(inst.server_id), "p1", POOL.id, "r", 1, ServerStatus.ACTIVE, 0.0)]
    nodes = AgentNodes(lambda _p: listing, store.contracts).nodes("p1")
    assert nodes[str(inst.server_id)].drained
    # Restarted: the state file says it is done; nothing runs again.
    again = _agent(tmp_path, client, marks)
    again.step()
    again.step()
    assert marks.read_text().split() == ["4000000000"]


def test_with_the_distributor_away_it_still_leaves_and_tells_later(
    tmp_path: Path, store: SqlFleetStore, client: TestClient
) -> None:
    inst = _node(store, tmp_path / "token")
    marks = tmp_path / "drains"
    _notice(store, inst, 4_000_000_000.0)
    # The agent had read the contract that says leave, then the distributor went away.
    _had_read_the_notice(tmp_path, client)
    away = httpx.Client(base_url="http://127.0.0.1:9", timeout=0.5)  # nothing listens
    offline = _agent(tmp_path, away, marks)
    pause = offline.step()
    assert marks.read_text().split() == ["4000000000"], "it left on its own"
    assert pause > 0, "and backs off"
    c = store.contracts.get(inst.id)
    assert c is not None
    assert c.acked is None
    back = _agent(tmp_path, client, marks)  # restarted, the distributor back
    back.step()
    c = store.contracts.get(inst.id)
    assert c is not None
    assert str(c.acked) == "drained"
    assert marks.read_text().split() == ["4000000000"], "not twice"


def test_a_rotated_token_is_read_again(
    tmp_path: Path, store: SqlFleetStore, client: TestClient
) -> None:
    inst = _node(store, tmp_path / "token")
    a = _agent(tmp_path, client, tmp_path / "drains")
    a.step()
    store.contracts.revoke("p1", inst.id)
    a.step()  # 401: it will read the file again
    fresh = secrets.token_urlsafe(32)
    (tmp_path / "token").write_text(fresh)
    store.contracts.set_token(inst.id, token_digest(fresh), 1e12, 0.0)
    _notice(store, inst, 4_000_000_000.0)
    _served_notice(tmp_path, client)
    for _ in range(3):
        a.step()
    c = store.contracts.get(inst.id)
    assert c is not None
    assert str(c.acked) == "drained"


def test_after_a_rotation_behind_one_address_every_agent_reads_its_contract(
    tmp_path: Path, store: SqlFleetStore
) -> None:
    """Regression (issue 25, item 7): behind a NAT the agents still holding the
    rotated token spent the address's failure limit, and then every agent there got
    429, the ones holding a valid token too, and none read its new token."""
    app = create_app(store.contracts, DistributorConfig(poll_s=0.05, auth_failures_per_min=2))
    agents: list[Agent] = []
    with TestClient(app) as client:  # one client address for all
        for k in range(4):
            home = tmp_path / f"n{k}"
            home.mkdir()
            _node(store, home / "token")
            agents.append(_agent(home, client, home / "drains"))
            agents[-1].step()
        store.contracts.revoke("p1")  # `sco tokens rotate`: the old tokens stop at once
        for k, a in enumerate(agents):  # new files, the old tokens still held
            assert a.state.contract is not None
            fresh = secrets.token_urlsafe(32)
            (tmp_path / f"n{k}" / "token").write_text(fresh)
            instance_id = a.state.contract.instance_id
            store.contracts.set_token(instance_id, token_digest(fresh), 1e12, 0.0)
        noticed = _notice(store, store.instances("p1")[0], 4_000_000_000.0)

        def served() -> bool:
            for a in agents:
                a.step()
            # a failed poll (401, 429) leaves a backoff; a served one (200, 304) resets it
            return all(a.backoff.failures == 0 for a in agents)

        wait_for(served, 10, "every agent behind the address served again", every_s=0.0)
        wait_for(lambda: served() and store.contracts.get(noticed.id).acked, 10, "the ack")
        told = [a.state.contract for a in agents if a.state.contract.instance_id == noticed.id]
        assert told[0].terms.state is NodeState.LEAVING, "it read its new contract"


def test_run_until_stops_when_the_instance_is_over(
    tmp_path: Path, store: SqlFleetStore, client: TestClient
) -> None:
    inst = _node(store, tmp_path / "token")
    a = _agent(tmp_path, client, tmp_path / "drains")
    inst = _notice(store, inst, 4_000_000_000.0)
    store.record([step(inst, Trigger.SERVER_VANISHED, 20.0, "gone")])
    stop = threading.Event()
    threading.Timer(20, stop.set).start()
    assert a.run_until(stop) == 0
    assert not stop.is_set(), "it ended on its own"
    stop.set()


def test_backing_off_never_sleeps_past_the_drain_start(
    tmp_path: Path, store: SqlFleetStore, client: TestClient
) -> None:
    inst = _node(store, tmp_path / "token")
    _notice(store, inst, 4_000_000_000.0)
    _had_read_the_notice(tmp_path, client)
    now = [4_000_000_000.0 - 40]  # the drain starts 30 s before the deadline: in 10 s
    config = AgentConfig(
        distributor="http://127.0.0.1:9", state_file=tmp_path / "agent.json",
        drain_command="true", token_file=tmp_path / "token", drain_lead_s=30.0,
        backoff_max_s=300.0,
    )  # fmt: skip
    away = Agent(config, http=httpx.Client(base_url="http://127.0.0.1:9", timeout=0.5),
                 clock=lambda: now[0])  # fmt: skip
    away.backoff.next_s = lambda: 300.0  # type: ignore[method-assign]  # long into an outage
    assert away.step() <= 10.0


class FlakyDrain:
    """A drainer that fails its first `failing` calls with `why`, then drains."""

    def __init__(self, failing: int, why: str = "kubectl: connection refused") -> None:
        self.failing = failing
        self.why = why
        self.calls: list[float] = []  # the agent's clock at each call

    def __call__(self, contract: Contract, now: float) -> tuple[str, str]:
        self.calls.append(now)
        if len(self.calls) <= self.failing:
            return "failed", self.why
        return "drained", "3 pods evicted"


def _flaky_agent(tmp: Path, client: TestClient, drain: FlakyDrain, now: list[float]) -> Agent:
    config = AgentConfig(
        distributor="http://testserver", state_file=tmp / "agent.json", drain_command="",
        token_file=tmp / "token", wait_s=0.05, drain_retry_s=5.0, drain_retry_max_s=40.0,
    )  # fmt: skip
    return Agent(config, http=client, clock=lambda: now[0], drainer=lambda c: drain(c, now[0]))


def test_a_failed_drain_is_tried_again_and_acknowledged_once_it_drains(
    tmp_path: Path, store: SqlFleetStore, client: TestClient
) -> None:
    """Regression (issue 25, item 7): one failed drain was acknowledged as failed at
    once and never tried again, though the deadline was minutes away."""
    inst = _node(store, tmp_path / "token")
    deadline = 4_000_000_000.0
    now = [deadline - 600]
    _notice(store, inst, deadline)
    _served_notice(tmp_path, client)
    drain = FlakyDrain(failing=1)
    a = _flaky_agent(tmp_path, client, drain, now)
    a.step()
    a.step()
    assert drain.calls == [deadline - 600], "failed once, not yet tried again"
    c = store.contracts.get(inst.id)
    assert c is not None
    assert c.acked is None, "nothing acknowledged while a retry is due"
    assert a.step() <= 5.0, "it wakes for the retry"
    # Restarted before the retry: the state file keeps the schedule.
    a = _flaky_agent(tmp_path, client, drain, now)
    a.step()
    assert len(drain.calls) == 1
    now[0] += 5.0
    a.step()
    a.step()
    assert drain.calls == [deadline - 600, deadline - 595]
    c = store.contracts.get(inst.id)
    assert c is not None
    assert (str(c.acked), c.ack_detail) == ("drained", "3 pods evicted")
    now[0] += 100.0
    a.step()
    assert len(drain.calls) == 2, "a drain that succeeded is not run again"


def test_a_drain_that_keeps_failing_backs_off_and_gives_up_before_the_deadline(
    tmp_path: Path, store: SqlFleetStore, client: TestClient
) -> None:
    inst = _node(store, tmp_path / "token")
    deadline = 4_000_000_000.0
    now = [deadline - 300]
    _notice(store, inst, deadline)
    _served_notice(tmp_path, client)
    drain = FlakyDrain(failing=1_000, why="exit 1: the API server is away")
    a = _flaky_agent(tmp_path, client, drain, now)
    for _ in range(200):
        a.step()
        c = store.contracts.get(inst.id)
        assert c is not None
        if c.acked is not None:
            break
        assert a.state.retry_at is not None
        now[0] = max(now[0], a.state.retry_at)
    assert str(c.acked) == "failed"
    assert c.ack_detail.startswith("exit 1: the API server is away (gave up after")
    pauses = [b - a for a, b in itertools.pairwise(drain.calls)]
    assert pauses[:4] == [5.0, 10.0, 20.0, 40.0], "doubling from the first pause"
    assert max(pauses) <= 40.0, "bounded"
    assert drain.calls[-1] < deadline
    assert len(drain.calls) == len(pauses) + 1 < 20


def test_an_acknowledgement_the_contract_outran_says_it_was_not_recorded(
    tmp_path: Path, store: SqlFleetStore, client: TestClient, caplog: pytest.LogCaptureFixture
) -> None:
    """In the lab, sco's own Slurm drain finished first and moved the contract on: the
    agent's ack got 409 and it logged "acknowledged", which sco never recorded."""
    inst = _node(store, tmp_path / "token")
    noticed = _notice(store, inst, 4_000_000_000.0)
    r = _served_notice(tmp_path, client)
    assert "drain by 2096-10-02T07:06:40Z" in _contract_line(tmp_path, client, caplog)
    contract = Contract.from_json(r.json())
    AgentState(
        etag=r.headers["ETag"], contract=contract, drained_version=contract.version,
        result=("drained", "0 jobs left"),
    ).save(tmp_path / "agent.json")  # fmt: skip
    draining = step(noticed, Trigger.DRAIN_REQUESTED, 20.0, "sco drains it itself")
    store.record([draining, step(draining.after, Trigger.DELETE_SENT, 30.0, "node drained")])
    a = _agent(tmp_path, client, tmp_path / "drains")
    with caplog.at_level("INFO", logger="sco.agent"):
        a._ack()
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "not recorded: the contract has moved on" in said, said
    assert "acknowledged" not in said
    assert a.state.acked_version == a.state.drained_version  # not sent again


def _contract_line(tmp: Path, client: TestClient, caplog: pytest.LogCaptureFixture) -> str:
    """What an agent logs on reading its contract."""
    caplog.clear()
    fresh = tmp / "fresh"
    fresh.mkdir()
    (fresh / "token").write_text((tmp / "token").read_text())
    with caplog.at_level("INFO", logger="sco.agent"):
        _agent(fresh, client, tmp / "drains")._poll()
    said = " ".join(r.getMessage() for r in caplog.records)
    caplog.clear()
    return said


# ------------------------------------------------------------ contracts as the agent reads them

# A contract as the distributor sends it, and as agents before this one kept it.
SERVED: dict[str, Any] = {
    "instance_id": "i-0001", "version": 2, "partition": "p1", "pool": "lab/a/spot",
    "capacity_class": "spot", "plan_generation": 3, "state": "leaving",
    "drain_by": 4_000_000_000.0, "reclaim": True, "join": "", "lease_expires_at": 3.9e9,
}  # fmt: skip


def test_a_contract_reads_back_what_as_json_wrote() -> None:
    c = Contract.from_json(SERVED)
    assert c.as_json() == SERVED
    assert (c.terms.state, c.drain_by, c.terms.reclaim) == (NodeState.LEAVING, 4e9, True)
    newer = SERVED | {"tier": "gold"}  # a later distributor's field: ignored
    assert Contract.from_json(newer) == c
    older = {k: v for k, v in SERVED.items() if k != "reclaim"}
    assert Contract.from_json(older).terms.reclaim is False


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"version": None}, "version: None is not an integer"),
        ({"version": True}, "version: True is not an integer"),
        ({"state": "resting"}, "state: 'resting' is none of joining, serving, leaving, gone"),
        ({"drain_by": "soon"}, "drain_by: 'soon' is not a finite number"),
        ({"drain_by": float("nan")}, "drain_by: nan is not a finite number"),
        ({"reclaim": "yes"}, "reclaim: 'yes' is not true or false"),
        ({"partition": 7}, "partition: 7 is not a string"),
    ],
)
def test_a_malformed_contract_names_its_field(change: dict[str, Any], named: str) -> None:
    with pytest.raises(MalformedContract, match=f"^{re.escape(named)}$"):
        Contract.from_json(SERVED | change)


def test_a_contract_missing_a_field_names_it() -> None:
    for field in SERVED.keys() - {"reclaim", "drain_by"}:
        with pytest.raises(MalformedContract, match=f"^{field}: missing$"):
            Contract.from_json({k: v for k, v in SERVED.items() if k != field})
    with pytest.raises(MalformedContract, match="a JSON object, not list"):
        Contract.from_json([SERVED])


def _old_state_file(path: Path, contract: dict[str, Any]) -> None:
    """The state file as the agent before the domain's types wrote it: the distributor's
    JSON as it came, beside the drain's bookkeeping."""
    path.write_text(json.dumps({
        "etag": '"2"', "contract": contract, "drained_version": None, "result": None,
        "acked_version": None, "drain_failures": 0, "retry_at": None,
    }))  # fmt: skip


def test_the_state_file_an_agent_wrote_before_the_upgrade_is_read_after_it(
    tmp_path: Path,
) -> None:
    """Restarted on the new version with the distributor away, an agent still leaves by
    the deadline its old self had read, and writes the file back in the same form."""
    _old_state_file(tmp_path / "agent.json", SERVED)
    (tmp_path / "token").write_text(secrets.token_urlsafe(32))
    marks = tmp_path / "drains"
    away = httpx.Client(base_url="http://127.0.0.1:9", timeout=0.5)  # nothing listens
    a = _agent(tmp_path, away, marks)
    assert a.state.contract == Contract.from_json(SERVED)
    assert a.state.etag == '"2"'
    a.step()
    assert marks.read_text().split() == ["4000000000"], "it left on its own"
    kept = json.loads((tmp_path / "agent.json").read_text())
    assert kept["contract"] == SERVED
    assert kept["drained_version"] == 2
    assert AgentState.load(tmp_path / "agent.json").drained_version == 2


def test_a_state_file_contract_it_cannot_read_is_asked_for_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = {k: v for k, v in SERVED.items() if k != "version"}
    _old_state_file(tmp_path / "agent.json", broken)
    with caplog.at_level("WARNING", logger="sco.agent"):
        state = AgentState.load(tmp_path / "agent.json")
    assert (state.contract, state.etag) == (None, None), "no ETag: the next read is whole"
    assert "version: missing" in caplog.text


def test_a_body_that_is_no_contract_keeps_the_last_one(tmp_path: Path) -> None:
    (tmp_path / "token").write_text(secrets.token_urlsafe(32))
    bodies = iter([SERVED, SERVED | {"state": "resting"}])
    transport = httpx.MockTransport(lambda _r: httpx.Response(200, json=next(bodies)))
    a = _agent(tmp_path, httpx.Client(base_url="http://d", transport=transport), tmp_path / "m")
    assert a._poll() == 0.0
    assert a._poll() > 0, "backs off"
    assert a.state.contract == Contract.from_json(SERVED)


def test_the_contracts_the_agent_imports_are_the_domains_and_the_standard_librarys() -> None:
    """The agent runs on every node: what it takes of sco must bring nothing else."""
    probe = (
        "import sys; before = set(sys.modules); import sco.domain.contracts, sco.domain.times; "
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    loaded = done.stdout.split()
    assert "sco.domain.contracts" in loaded
    foreign = [
        m for m in loaded
        if m.split(".")[0] not in sys.stdlib_module_names
        and m not in ("sco", "sco.domain") and not m.startswith("sco.domain.")
    ]  # fmt: skip
    assert foreign == []
