"""Fleet state's rows and the domain values they hold, both ways."""

from __future__ import annotations

import json
from typing import Any

from sco.domain.events import LifecycleEvent
from sco.domain.instances import Change, Instance
from sco.domain.lifecycle import State
from sco.domain.pools import CapacityClass, Pool
from sco.domain.signals import Exclusion, ExclusionState, PoolScore
from sco.ports import HistoryRow, Reservation

SCORE_FIELDS = (
    "hazard_per_h",
    "exposure_h",
    "reclaims",
    "survival",
    "success_ratio",
    "attempts",
    "ready_p50_s",
    "ready_n",
    "headroom",
    "headroom_n",
    "value",
    "why",
)


def history_row(r: Any) -> HistoryRow:
    return HistoryRow(
        instance_id=r.instance_id,
        partition=r.partition,
        pool=r.pool,
        at=r.at,
        from_state=r.from_state,
        to_state=r.to_state,
        trigger=r.trigger,
        reason=r.reason,
        code=r.code,
    )


def transition_row(ch: Change) -> dict[str, Any]:
    """The history row of one recorded transition."""
    return {
        "instance_id": ch.after.id,
        "partition": ch.after.partition,
        "pool": ch.after.pool,
        "at": ch.at,
        "from_state": ch.before.state.value if ch.before else None,
        "to_state": ch.after.state.value,
        "trigger": ch.trigger.value if ch.trigger else None,
        "reason": ch.reason,
        "code": ch.code or None,
    }


def score_body(sc: PoolScore) -> dict[str, Any]:
    return {f: getattr(sc, f) for f in SCORE_FIELDS}


def score_of(r: Any) -> PoolScore:
    body = json.loads(r.body)
    return PoolScore(pool=r.pool, generation=r.generation, computed_at=r.computed_at, **body)


def exclusion_row(e: Exclusion) -> dict[str, Any]:
    return {
        "pool": e.pool,
        "state": e.state.value,
        "since": e.since,
        "until": e.until,
        "cooldown_s": e.cooldown_s,
        "last_crossing": e.last_crossing,
        "reason": e.reason,
        "version": e.version,
    }


def exclusion_of_row(r: dict[str, Any]) -> Exclusion:
    return Exclusion(**{**r, "state": ExclusionState(r["state"])})


def exclusion_of(r: Any) -> Exclusion:
    return exclusion_of_row(dict(r._mapping))


def outbox_row(e: LifecycleEvent) -> dict[str, Any]:
    return {"event_id": e.event_id, "pool": e.pool, "payload": e.dumps()}


def pool_row(p: Pool) -> dict[str, Any]:
    return {
        "region": p.region,
        "hall": p.hall,
        "flavor": p.flavor,
        "aggregate": p.aggregate,
        "capacity_class": p.capacity_class.value,
        "units_per_instance": p.units_per_instance,
        "price_per_h": p.price_per_h,
        "notice_s": p.notice_s,
        "cold_start_s": p.cold_start_s,
    }


def pool_of(r: Any) -> Pool:
    return Pool(
        region=r.region,
        hall=r.hall,
        flavor=r.flavor,
        capacity_class=CapacityClass(r.capacity_class),
        units_per_instance=r.units_per_instance,
        price_per_h=r.price_per_h,
        aggregate=r.aggregate,
        notice_s=float(r.notice_s),
        cold_start_s=r.cold_start_s,
    )


def instance_row(i: Instance) -> dict[str, Any]:
    return {
        "id": i.id,
        "partition": i.partition,
        "pool": i.pool,
        "capacity_class": i.capacity_class.value,
        "units": i.units,
        "state": i.state.value,
        "version": i.version,
        "request_id": i.request_id,
        "plan_generation": i.plan_generation,
        "created_at": i.created_at,
        "state_since": i.state_since,
        "server_id": i.server_id,
        "ready_at": i.ready_at,
        "drain_by": i.drain_by,
        "notice_deadline": i.notice_deadline,
        "reason": i.reason,
    }


def instance_of(r: Any) -> Instance:
    return Instance(
        id=r.id,
        partition=r.partition,
        pool=r.pool,
        capacity_class=CapacityClass(r.capacity_class),
        units=r.units,
        state=State(r.state),
        version=r.version,
        request_id=r.request_id,
        plan_generation=r.plan_generation,
        created_at=r.created_at,
        state_since=r.state_since,
        server_id=r.server_id,
        ready_at=r.ready_at,
        drain_by=r.drain_by,
        notice_deadline=r.notice_deadline,
        reason=r.reason,
    )


def reservation_row(r: Reservation) -> dict[str, Any]:
    return {
        "request_id": r.request_id,
        "pool": r.pool,
        "partition": r.partition,
        "count": r.count,
        "created_at": r.created_at,
        "expires_at": r.expires_at,
    }


def reservation_of(r: Any) -> Reservation:
    return Reservation(
        request_id=r.request_id,
        pool=r.pool,
        partition=r.partition,
        count=r.count,
        created_at=r.created_at,
        expires_at=r.expires_at,
    )
