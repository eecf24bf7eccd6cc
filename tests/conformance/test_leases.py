"""The lease port's rules (`sco.ports.Leases` and `Membership`), once, over every
implementation:

- `SqlLeases` on SQLite and on PostgreSQL (the fleet-state database's tables);
- `KubernetesLeases` through the official client and a kubeconfig, over real HTTP to
  the test API server (`sco_harness.kube_api.KubeApi`), which refuses a replace that
  does not carry the current resourceVersion, as the real one does;
- the lab's twins: `KubeLeases` (Kubernetes' semantics) and `MemoryLeaseTable` (the
  database's).

Times are the callers' clocks, in whole seconds: Kubernetes keeps a Lease's duration
in whole seconds. Fencing (`claim_fence`) is fleet state's, and its rules live in
test_fleet_state.py.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sco.adapters.kubernetes.leases import KubernetesLeases, connect, lease_name
from sco.adapters.sqlstate.engine import migrate, open_engine
from sco.adapters.sqlstate.leases import SqlLeases
from sco.lab.twins.leases import KubeLeases, MemoryLeaseTable
from sco.ports import Lease, LeaseTable
from sco_harness.kube_api import KubeApi

TTL_S = 15
_namespaces = itertools.count(1)


@dataclass
class Implementation:
    """A lease table and how to reach it again, as another replica does."""

    open: Callable[[], LeaseTable]  # another replica's client on the same leases
    recreate: Callable[[str], None] | None = None  # Kubernetes kinds: delete a Lease


@pytest.fixture(scope="module")
def kube_api() -> Iterator[KubeApi]:
    api = KubeApi().start()
    yield api
    api.stop()


def _sql(kind: str) -> Callable[[pytest.FixtureRequest], Iterator[Implementation]]:
    def make(request: pytest.FixtureRequest) -> Iterator[Implementation]:
        engine = open_engine(request.getfixturevalue("database_url")(kind))
        migrate(engine)
        yield Implementation(lambda: SqlLeases(engine))
        engine.dispose()

    return make


def _kubernetes(request: pytest.FixtureRequest) -> Iterator[Implementation]:
    api: KubeApi = request.getfixturevalue("kube_api")
    tmp_path: Path = request.getfixturevalue("tmp_path")
    namespace = f"sco-{next(_namespaces)}"  # a test's Leases, apart from the others'
    kubeconfig = str(api.kubeconfig(tmp_path / "kubeconfig"))
    clients: list[KubernetesLeases] = []

    def open_() -> KubernetesLeases:
        clients.append(connect(namespace, kubeconfig))
        return clients[-1]

    def recreate(partition: str) -> None:
        api.delete("leases", namespace, lease_name(partition))

    yield Implementation(open_, recreate=recreate)
    for client in clients:
        client.api.api_client.close()


def _kube_twin(_request: pytest.FixtureRequest) -> Iterator[Implementation]:
    leases = KubeLeases()
    yield Implementation(lambda: leases, recreate=leases.recreate)


def _memory(_request: pytest.FixtureRequest) -> Iterator[Implementation]:
    table = MemoryLeaseTable()
    yield Implementation(lambda: table)


IMPLEMENTATIONS = {
    "sqlite": _sql("sqlite"),
    "postgresql": _sql("postgresql"),
    "kubernetes": _kubernetes,
    "kube-twin": _kube_twin,
    "memory": _memory,
}


# Where a rule holds for some implementations only, its test names them.
RACING = ["sqlite", "postgresql", "kubernetes"]  # clients of one store, racing
KUBERNETES_KINDS = ["kubernetes", "kube-twin"]


@pytest.fixture(params=list(IMPLEMENTATIONS))
def impl(request: pytest.FixtureRequest) -> Iterator[Implementation]:
    yield from IMPLEMENTATIONS[request.param](request)


@pytest.fixture
def leases(impl: Implementation) -> LeaseTable:
    return impl.open()


# ---------------------------------------------------------------- leases


def test_a_lease_has_one_holder(leases: LeaseTable) -> None:
    a = leases.acquire("p1", "alpha", TTL_S, now=100)
    assert a is not None
    assert (a.partition, a.holder, a.expires_at) == ("p1", "alpha", 115)
    assert a.token >= 1, "0 is no lease: fleet state lets it write only unleased partitions"
    assert leases.acquire("p1", "beta", TTL_S, now=110) is None
    assert leases.acquire("p1", "beta", TTL_S, now=115) is None, "held through its expiry"
    assert leases.leases() == [a]


def test_the_holder_extends_its_lease_with_the_same_token(leases: LeaseTable) -> None:
    a = leases.acquire("p1", "alpha", TTL_S, now=100)
    assert a is not None
    again = leases.acquire("p1", "alpha", TTL_S, now=110)
    assert again == Lease("p1", "alpha", a.token, 125)
    assert leases.leases() == [again]


def test_a_new_holder_gets_a_larger_token(leases: LeaseTable) -> None:
    a = leases.acquire("p1", "alpha", TTL_S, now=100)
    assert a is not None
    b = leases.acquire("p1", "beta", TTL_S, now=116)  # expired at 115: taken over
    assert b is not None
    assert (b.holder, b.expires_at) == ("beta", 131)
    assert b.token > a.token
    # A holder that let its lease run out and takes it again is a new holder too: it
    # may have missed what another wrote meanwhile.
    c = leases.acquire("p1", "beta", TTL_S, now=200)
    assert c is not None
    assert c.token > b.token
    assert leases.leases() == [c]


def test_renew_only_by_the_holder_with_its_token(leases: LeaseTable) -> None:
    a = leases.acquire("p1", "alpha", TTL_S, now=100)
    assert a is not None
    renewed = leases.renew(a, TTL_S, now=110)
    assert renewed == Lease("p1", "alpha", a.token, 125)
    assert leases.renew(Lease("p1", "beta", a.token, 125), TTL_S, now=111) is None
    assert leases.renew(Lease("p1", "alpha", a.token + 1, 125), TTL_S, now=111) is None
    assert leases.renew(Lease("p2", "alpha", a.token, 125), TTL_S, now=111) is None  # none
    assert leases.leases() == [renewed], "refused renewals change nothing"
    assert leases.renew(a, TTL_S, now=126) is None, "expired: lost, though nobody took it"
    b = leases.acquire("p1", "beta", TTL_S, now=127)
    assert b is not None
    assert leases.renew(a, TTL_S, now=128) is None, "taken: the old holder learns it lost"
    assert leases.leases() == [b]


def test_release_hands_back_with_no_holder_and_the_token_keeps_growing(
    leases: LeaseTable,
) -> None:
    a = leases.acquire("p1", "alpha", TTL_S, now=100)
    assert a is not None
    leases.release(a)
    [released] = leases.leases()
    assert (released.partition, released.holder) == ("p1", "")
    assert released.expires_at < 101, "expired at once"
    b = leases.acquire("p1", "beta", TTL_S, now=101)  # free well before a's TTL
    assert b is not None
    assert b.token > a.token
    leases.release(a)  # no longer a's: nothing happens
    leases.release(Lease("p1", "beta", b.token - 1, b.expires_at))  # not this token
    assert leases.leases() == [b]
    assert leases.acquire("p1", "alpha", TTL_S, now=102) is None


def test_expiry_lets_another_take_it(leases: LeaseTable) -> None:
    """A holder that dies without a word holds its partitions only until they expire."""
    for p in ("p1", "p2"):
        assert leases.acquire(p, "dead", TTL_S, now=100) is not None
    assert leases.acquire("p1", "alive", TTL_S, now=115) is None
    taken = [leases.acquire(p, "alive", TTL_S, now=116) for p in ("p1", "p2")]
    assert [x.holder if x else None for x in taken] == ["alive", "alive"]
    assert leases.leases() == taken


def test_every_partitions_lease_by_partition(leases: LeaseTable) -> None:
    for p in ("p3", "p1", "p2"):
        assert leases.acquire(p, f"r-{p}", TTL_S, now=100) is not None
    assert [(x.partition, x.holder) for x in leases.leases()] == [
        ("p1", "r-p1"),
        ("p2", "r-p2"),
        ("p3", "r-p3"),
    ]


@pytest.mark.parametrize("taken", ["free", "expired"])
@pytest.mark.parametrize("impl", RACING, indirect=True)
def test_racing_acquirers_get_one_lease(impl: Implementation, taken: str) -> None:
    """Replicas that race for the same lease, each with its own client: one wins, the
    others are told no (a lease never created: one insert or create wins; an expired
    one: one conditional update, or one replace with the current resourceVersion,
    wins). The twins are one process's objects, called one at a time: nothing races."""
    first = impl.open()
    before = first.acquire("p1", "old", TTL_S, now=0) if taken == "expired" else None
    racers = [impl.open() for _ in range(6)]
    start = threading.Barrier(len(racers))
    won: list[Lease] = []
    failed: list[BaseException] = []

    def race(k: int) -> None:
        start.wait()
        try:
            got = racers[k].acquire("p1", f"r{k}", TTL_S, now=100)
        except BaseException as e:  # reported below: a loser must lose cleanly
            failed.append(e)
            return
        if got is not None:
            won.append(got)

    threads = [threading.Thread(target=race, args=(k,)) for k in range(len(racers))]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert failed == []
    assert len(won) == 1, won
    if before is not None:
        assert won[0].token > before.token
    assert first.leases() == won


# ---------------------------------------------------------------- membership


def test_heartbeats_say_which_replicas_live(leases: LeaseTable) -> None:
    leases.heartbeat("b", TTL_S, now=100)
    leases.heartbeat("a", TTL_S, now=100)
    leases.heartbeat("a", TTL_S, now=110)
    assert leases.live_replicas(now=114) == ["a", "b"]
    assert leases.live_replicas(now=115) == ["a", "b"], "live through its expiry"
    assert leases.live_replicas(now=116) == ["a"]
    leases.heartbeat("b", TTL_S, now=120)  # back
    assert leases.live_replicas(now=121) == ["a", "b"]


def test_a_forgotten_replica_is_not_live(leases: LeaseTable) -> None:
    leases.heartbeat("a", TTL_S, now=100)
    leases.heartbeat("b", TTL_S, now=100)
    leases.forget_replica("a")
    leases.forget_replica("never-seen")
    assert leases.live_replicas(now=101) == ["b"]
    leases.heartbeat("a", TTL_S, now=102)
    assert leases.live_replicas(now=103) == ["a", "b"]


def test_replicas_and_partition_leases_are_apart(leases: LeaseTable) -> None:
    """A replica named like a partition neither holds nor hides its lease (Kubernetes
    keeps both as Leases of one namespace)."""
    leases.heartbeat("p1", TTL_S, now=100)
    assert leases.leases() == []
    lease = leases.acquire("p1", "r1", TTL_S, now=100)
    assert lease is not None
    assert leases.leases() == [lease]
    assert leases.live_replicas(now=101) == ["p1"]
    leases.forget_replica("p1")
    assert leases.leases() == [lease]


# ---------------------------------------------------------------- Kubernetes only


@pytest.mark.parametrize("impl", KUBERNETES_KINDS, indirect=True)
def test_a_recreated_kubernetes_lease_counts_from_one_again(impl: Implementation) -> None:
    """Kubernetes kinds only. The token is the Lease object's `leaseTransitions`: an
    operator (or a namespace recreated, or leases moved from the database) deletes it,
    and the next holder creates it at 1 again, below tokens already handed out. The
    database-kept leases keep their row, so their tokens never go back. Fleet state's
    fencing survives it: `claim_fence` puts the new holder above the largest token it
    saw (test_fleet_state.py)."""
    assert impl.recreate is not None
    leases = impl.open()
    for now, holder in ((100, "a"), (200, "b"), (300, "c")):
        assert leases.acquire("p1", holder, TTL_S, now) is not None
    impl.recreate("p1")
    assert leases.leases() == []
    again = leases.acquire("p1", "d", TTL_S, now=301)
    assert again == Lease("p1", "d", 1, 316)
