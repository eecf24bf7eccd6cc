"""From `sco.yaml` to adapters: the one place each store, log and client is opened.

Each opener turns what cannot be reached into `StartError` with one line
naming the setting, so a command exits 2 before doing anything.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from sco.adapters.demandfile.intake import (
    DemandFileError,
    FileDemandSource,
    demand_of,
    read_demand_file,
)
from sco.adapters.sqlstate import Unreachable
from sco.adapters.sqlstate.eventlog import SqlEventLog
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.assembly.settings import Settings
from sco.engine.builder import NodeTokens
from sco.engine.leases import PairedLeases
from sco.engine.outbox import relay
from sco.ports import (
    EventLog,
    LeaseStore,
    TokenCourier,
    TokenLedger,
)

Relay = Callable[[], int]
if TYPE_CHECKING:  # an extra: imported when a command uses it
    from sco.adapters.clickhouse.history import ClickHouseHistory

log = logging.getLogger(__name__)
T = TypeVar("T")


class StartError(Exception):
    """Something named in the configuration or on the command line cannot be used."""


def open_store(
    settings: Settings,
    run_migrations: bool = True,
    patient: bool = False,
    sleep: Callable[[float], object] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> SqlFleetStore:
    """The fleet state. A `patient` opener (a long-running process) keeps trying for
    `state.start_wait_s`: a replica started while the database fails over, or before
    it is up, waits for it, as it would once running, rather than exit."""
    try:
        return patiently(
            lambda: SqlFleetStore(settings.state.url, run_migrations=run_migrations),
            "state.url",
            settings.state.start_wait_s if patient else 0.0,
            sleep,
            monotonic,
        )
    except ModuleNotFoundError as e:
        raise StartError(
            f"state.url: {e.name} is not installed (pip install 'sco[postgres]')"
        ) from None


def patiently(
    open_: Callable[[], T],
    field: str,
    wait_s: float,
    sleep: Callable[[float], object],
    monotonic: Callable[[], float],
) -> T:
    """`open_()`, tried again while its database is unreachable, for up to `wait_s`
    (backing off from 1 s to 10 s); then a StartError that names `field`."""
    deadline = monotonic() + wait_s
    pause_s = 1.0
    while True:
        try:
            return open_()
        except Unreachable as e:
            why = f"{field}: cannot reach the database: {_first_line(e)}"
            left = deadline - monotonic()
            if left <= 0:
                raise StartError(why) from None
            log.warning("%s; trying again for up to %.0f s (state.start_wait_s)", why, left)
            sleep(min(pause_s, left))
            pause_s = min(2 * pause_s, 10.0)


def _first_line(e: Unreachable) -> str:
    return str(e.orig).strip().splitlines()[0] if e.orig else type(e).__name__


@dataclass
class Events:
    """The event log as configured, how the outbox reaches it, and how to let it go."""

    log: EventLog
    relay: Relay  # move what the outbox holds into the log; returns how many
    close: Callable[[], None]
    kind: str


def open_events(
    settings: Settings,
    store: SqlFleetStore,
    patient: bool = False,
    sleep: Callable[[float], object] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> Events:
    """The event log as configured. A `patient` opener waits for a log in a database of
    its own (`events.url`) as `open_store` waits for fleet state."""
    cfg = settings.events
    if cfg.kind == "kafka":
        assert cfg.kafka is not None
        try:
            from sco.adapters.kafka.eventlog import KafkaEventLog
        except ModuleNotFoundError:
            raise StartError("events.kind kafka: pip install 'sco[kafka]'") from None
        k = cfg.kafka
        try:
            kafka = KafkaEventLog(
                k.brokers,
                k.librdkafka(),
                topic_prefix=k.topic_prefix,
                regions=_regions(settings, store),
                new_topic_partitions=k.new_topic_partitions,
                poll_timeout_s=0.5,
            )
        except (ValueError, Exception) as e:
            raise StartError(f"events.kafka: {type(e).__name__}: {e}") from None
        return Events(kafka, lambda: relay(store, kafka), kafka.close, "kafka")
    if cfg.url is None:
        shared = SqlEventLog(store.engine)
        return Events(shared, shared.absorb_outbox, lambda: None, "embedded")
    url = cfg.url
    wait_s = settings.state.start_wait_s if patient else 0.0
    own = patiently(lambda: SqlEventLog.open(url), "events.url", wait_s, sleep, monotonic)
    return Events(own, lambda: relay(store, own), own.close, "embedded")


def _regions(settings: Settings, store: SqlFleetStore) -> list[str] | None:
    """The regions whose topics consumers subscribe to by name (created if missing, so a
    consumer started before the first event does not wait for a metadata refresh to
    find its topic): configured, else the provider's, else those of the known pools;
    None subscribes to every topic with the prefix."""
    assert settings.events.kafka is not None
    if settings.events.kafka.regions:
        return settings.events.kafka.regions
    if settings.provider.region_file is not None:
        from sco.adapters.openstack.config import RegionFileError, load_region

        try:
            return [load_region(settings.provider.region_file).region]
        except RegionFileError as e:
            raise StartError(f"provider.region_file: {e}") from None
    regions = sorted({p.region for p in store.pools()})
    return regions or None


def open_history(settings: Settings, hold: bool = False) -> ClickHouseHistory:
    """Pool history in ClickHouse or chDB (`sco.adapters.clickhouse.ClickHouseHistory`);
    `hold`: a long-running process keeps chDB open between calls."""
    try:
        from sco.adapters.clickhouse.history import ClickHouseHistory, HistoryUnavailable
    except ModuleNotFoundError:
        raise StartError("history: pip install 'sco[history]'") from None
    h = settings.history
    try:
        return ClickHouseHistory(
            h.url,
            h.database,
            h.username,
            h.password.get_secret_value() if h.password else None,
            hold=hold,
        )
    except HistoryUnavailable as e:
        raise StartError(f"history.url: cannot reach pool history: {e}") from None
    except Exception as e:
        raise StartError(f"history.url: {type(e).__name__}: {str(e).splitlines()[0]}") from None


def open_leases(settings: Settings, store: SqlFleetStore) -> LeaseStore:
    """Partition leases and replica membership, in the database or as Kubernetes Leases;
    fencing in the database either way (its triggers refuse stale writes)."""
    from sco.adapters.sqlstate.leases import SqlLeases

    cfg = settings.leases
    fencing = SqlLeases(store.engine)
    if cfg.kind == "database":
        return fencing
    try:
        from sco.adapters.kubernetes.leases import connect
    except ModuleNotFoundError:
        raise StartError("leases.kind kubernetes: pip install 'sco[kubernetes]'") from None
    k = cfg.kubernetes
    try:
        return PairedLeases(connect(k.namespace, k.kubeconfig, k.context), fencing)
    except Exception as e:
        raise StartError(f"leases.kubernetes: {type(e).__name__}: {e}") from None


def demand(settings: Settings, region: str, start_s: float) -> FileDemandSource:
    """The static partitions, from `partitions` (demand: static) or `demand_file`."""
    try:
        if settings.demand_file is not None:
            return FileDemandSource(
                read_demand_file(settings.demand_file, region), start_s, str(settings.demand_file)
            )
        static = [p for p in settings.partitions if p.demand == "static"]
        return FileDemandSource(demand_of(static, region, "partitions"), start_s)
    except DemandFileError as e:
        raise StartError(str(e)) from None


def node_tokens(settings: Settings, ledger: TokenLedger, courier: TokenCourier) -> NodeTokens:
    """Node tokens for the partitions whose nodes run `sco agent`."""
    agents = frozenset(p.name for p in settings.partitions if p.agents)
    return NodeTokens(ledger, courier, settings.distributor.token_ttl_s, agents)


def require(settings: Settings, *fields: str, partitions: bool = False) -> None:
    """Fail when a setting a command needs is missing."""
    for dotted in fields:
        node: Any = settings
        for part in dotted.split("."):
            node = getattr(node, part)
        if node is None or node == []:
            raise StartError(f"{dotted}: not set (in sco.yaml, SCO_{_env(dotted)}, or a flag)")
    if partitions and not settings.partitions and settings.demand_file is None:
        raise StartError("partitions: none configured (partitions or demand_file)")


def _env(dotted: str) -> str:
    return "__".join(dotted.upper().split("."))
