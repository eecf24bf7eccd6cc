"""A long-running command started while its database is away (not up yet, or a
Patroni failover) waits for it, backing off, for `state.start_wait_s`, rather than
exit: the store's opening, an event log in a database of its own, and a replica's
first writes. A one-shot command still answers at once."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy.exc import OperationalError

from sco.assembly import wiring
from sco.assembly.controllers import Controllers
from sco.assembly.settings import load
from sco.engine import builder
from sco_harness.builders import write_yaml


def test_a_long_running_command_waits_for_the_database_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (soak, loaded CI): a replica started while Patroni failed over exited 2
    at once ("session is read-only") and never joined; now it keeps trying for
    state.start_wait_s, backing off, and a one-shot command still answers at once."""
    settings = load(write_yaml(tmp_path / "sco.yaml", {"state": {
        "url": f"sqlite:///{tmp_path / 'state.sqlite'}", "start_wait_s": 30}}))  # fmt: skip
    real = wiring.SqlFleetStore
    now = [0.0]
    tries: list[float] = []
    up_after = [3]  # failed tries before the database answers

    def store(url: str, run_migrations: bool = True) -> object:
        tries.append(now[0])
        if len(tries) <= up_after[0]:
            raise OperationalError("connect", {}, Exception("session is read-only"))
        return real(url, run_migrations=run_migrations)

    def sleep(s: float) -> None:
        now[0] += s

    def clock() -> float:
        return now[0]

    monkeypatch.setattr(wiring, "SqlFleetStore", store)
    wiring.open_store(settings, patient=True, sleep=sleep, monotonic=clock).close()
    assert tries == [0.0, 1.0, 3.0, 7.0]  # backing off: 1, 2, 4 s

    tries.clear()
    with pytest.raises(wiring.StartError, match="session is read-only"):
        wiring.open_store(settings, sleep=sleep, monotonic=clock)
    assert len(tries) == 1  # a one-shot command tries once

    tries.clear()
    up_after[0] = 10**6
    started = now[0]
    with pytest.raises(wiring.StartError, match="cannot reach the database"):
        wiring.open_store(settings, patient=True, sleep=sleep, monotonic=clock)
    assert now[0] - started == 30.0  # gave up at state.start_wait_s, not before or after


def test_a_long_running_command_waits_for_its_own_event_log_database_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The twin of the wait above for a log in a database of its own (`events.url`): it
    was tried once, so a replica started while that database was away exited."""
    settings = load(write_yaml(tmp_path / "sco.yaml", {
        "state": {"url": f"sqlite:///{tmp_path / 'state.sqlite'}", "start_wait_s": 30},
        "events": {"url": f"sqlite:///{tmp_path / 'events.sqlite'}"},
    }))  # fmt: skip
    real = wiring.SqlEventLog.open
    now = [0.0]
    tries: list[float] = []

    def open_log(url: str) -> object:
        tries.append(now[0])
        if len(tries) <= 2:
            raise OperationalError("connect", {}, Exception("the system is starting up"))
        return real(url)

    def sleep(s: float) -> None:
        now[0] += s

    monkeypatch.setattr(wiring.SqlEventLog, "open", staticmethod(open_log))
    store = wiring.open_store(settings)
    try:
        events = wiring.open_events(
            settings, store, patient=True, sleep=sleep, monotonic=lambda: now[0]
        )
        events.close()
        assert tries == [0.0, 1.0, 3.0]
        tries.clear()
        with pytest.raises(wiring.StartError, match=r"events\.url: cannot reach the database"):
            wiring.open_events(settings, store, sleep=sleep, monotonic=lambda: now[0])
        assert len(tries) == 1  # a one-shot command tries once
    finally:
        store.close()


def test_a_replica_waits_for_the_database_failing_over_during_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression (soak, CI on d6d939f): a replica restarted just as Patroni's primary
    was killed opened fleet state, then its first write (the pools) met "terminating
    connection due to unexpected postmaster exit" and the process exited 1; the
    replicas never shared the partitions again. Its start now waits as the opening does."""
    settings = load(write_yaml(tmp_path / "sco.yaml", {"state": {
        "url": f"sqlite:///{tmp_path / 'state.sqlite'}", "start_wait_s": 30}}))  # fmt: skip
    now = [0.0]
    tries: list[float] = []
    down_for = [2]  # failed tries before the database answers
    made = object()

    def replica(*args: Any, **kwargs: Any) -> object:
        tries.append(now[0])
        if len(tries) <= down_for[0]:
            raise OperationalError("INSERT INTO pools", {}, Exception("postmaster exit"))
        return made

    def sleep(s: float) -> None:
        now[0] += s

    monkeypatch.setattr(builder, "replica", replica)
    provider = SimpleNamespace(
        excess=(), foreign_servers=dict, refused_total=0, held_credential=lambda: None
    )
    world = Controllers(settings, SimpleNamespace(), "", "", provider)  # type: ignore[arg-type]

    def start() -> object:
        runner, _ = world.replica(
            "r1", CollectorRegistry(), lambda r: None, sleep=sleep, monotonic=lambda: now[0]
        )
        return runner

    assert start() is made
    assert tries == [0.0, 1.0, 3.0]  # backing off: 1, 2 s

    tries.clear()
    down_for[0] = 10**6
    started = now[0]
    with pytest.raises(wiring.StartError, match=r"state\.url: cannot reach the database"):
        start()
    assert now[0] - started == 30.0  # gave up at state.start_wait_s
