"""`sco status`: the fleet on one page, in the browser and as JSON (extra `status`).

Read from fleet state at each request, nothing cached:

- partitions: floor and target (as the latest plan saw them), what the plan wants
  on spot and on guaranteed capacity, what is ready by class, what is held by
  state, and an operator's intent (handback);
- pools: class, price, the latest score (hazard, survival, success ratio) and the
  exclusion in force with its reason;
- each partition's current plan: generation, notes, and per pool the target, what
  it holds, and what kept it out;
- the most recent lifecycle transitions, with their trigger and reason.

The module needs FastAPI and Jinja2 (the `status` extra): import it lazily.
`GET /` is the page (server-rendered with Jinja2, no JavaScript), `GET
/status.json` the same data; `/healthz` and `/readyz` answer for probes.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.templating import Jinja2Templates
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from sco.apps.happened import WINDOW_S, Happened, happened
from sco.apps.listen import name_process
from sco.assembly.state import Fleet
from sco.domain.lifecycle import State
from sco.domain.times import utc

TEMPLATES = Path(__file__).parent / "templates"
EVENTS = 50  # recent transitions shown


def status_of(store: Fleet, now: float, events: int = EVENTS) -> dict[str, Any]:
    """Everything the page shows, as plain data."""
    pools = {p.id: p for p in store.pools()}
    exclusions = store.exclusions()
    scores = store.latest_scores()
    names = sorted({*store.partitions(), *store.intents()})
    intents = store.intents()
    since = now - WINDOW_S
    lately = happened(store.history_since(since), since)
    partitions = []
    plans = []
    for name in names:
        plan = store.latest_plan(name)
        live = [i for i in store.instances(name) if i.is_live]
        ready = Counter(str(i.capacity_class) for i in live if i.state is State.READY)
        terms = dict(plan.terms) if plan else {}
        partitions.append(
            {
                "name": name,
                "floor_units": _int(terms.get("floor_units")),
                "target_units": _int(terms.get("target_units")),
                "plan_spot": sum(plan.spot.values()) if plan else 0,
                "plan_guaranteed": sum(plan.guaranteed.values()) if plan else 0,
                "ready_spot": ready.get("spot", 0),
                "ready_guaranteed": ready.get("guaranteed", 0),
                "held": dict(sorted(Counter(str(i.state) for i in live).items())),
                "intent": intents.get(name),
                "last_hour": (h := lately.get(name, Happened(since))).as_dict(),
                "last_hour_text": h.sentence(),
                "reclaims_last_hour": h.reclaims,
            }
        )
        if plan is not None:
            plans.append(
                {
                    "partition": name,
                    "generation": plan.generation,
                    "created_at": plan.created_at,
                    "notes": list(plan.notes),
                    "pools": [
                        {
                            "pool": pool,
                            "target": why.target,
                            "held": why.held,
                            "room": why.available,
                            "flags": list(why.flags),
                        }
                        for pool, why in sorted(plan.pools.items())
                    ],
                }
            )
    pool_rows = []
    for pid, pool in sorted(pools.items()):
        ex = exclusions.get(pid)
        sc = scores.get(pid)
        pool_rows.append(
            {
                "pool": pid,
                "class": str(pool.capacity_class),
                "price_per_h": pool.price_per_h,
                "hazard_per_h": sc.hazard_per_h if sc else None,
                "survival": sc.survival if sc else None,
                "success_ratio": sc.success_ratio if sc else None,
                "score": sc.value if sc else None,
                "scored_at": sc.computed_at if sc else None,
                "exclusion": str(ex.state) if ex is not None and ex.active(now) else None,
                "exclusion_until": ex.until if ex is not None and ex.active(now) else None,
                "exclusion_reason": ex.reason if ex is not None and ex.active(now) else "",
            }
        )
    contracts = [c for name in names for c in _contracts(store, name)]
    history = store.recent_history(events)
    servers = store.server_ids(r.instance_id for r in history)
    recent = [
        {
            "at": r.at,
            "partition": r.partition,
            "instance": r.instance_id,
            "server": servers.get(r.instance_id),
            "pool": r.pool,
            "from": r.from_state,
            "to": r.to_state,
            "trigger": r.trigger,
            "reason": r.reason,
        }
        for r in history
    ]
    return {
        "at": now,
        "partitions": partitions,
        "pools": pool_rows,
        "scored_at": max((s.computed_at for s in scores.values()), default=None),
        "plans": plans,
        "contracts": contracts,
        "events": recent,
    }


def _contracts(store: Fleet, partition: str) -> list[dict[str, Any]]:
    """What each node of the partition is told (not yet gone), and its agent's answer
    to that version; nodes that must leave first."""
    out = [
        {
            "partition": partition,
            "instance": c.instance_id,
            "server": c.server_id,
            "state": str(c.terms.state),
            "drain_by": c.terms.drain_by,
            "reclaim": c.terms.reclaim,
            "version": c.version,
            "ack": c.acked,
            "ack_at": c.ack_at if c.acked else None,
        }
        for c in store.contracts.of_partition(partition)
        if c.terms.state != "gone"
    ]
    return sorted(out, key=lambda c: (c["state"] != "leaving", c["instance"]))


def _int(v: float | None) -> int | None:
    return None if v is None else int(v)


def create_app(store: Fleet, clock: Callable[[], float]) -> FastAPI:
    """The FastAPI app; `clock()` is the wall clock in seconds."""
    app = FastAPI(title="sco status", docs_url=None, redoc_url=None)
    templates = Jinja2Templates(directory=str(TEMPLATES))
    templates.env.filters["when"] = _when
    templates.env.filters["num"] = _num

    @app.get("/", response_class=HTMLResponse)
    def page(request: Request) -> Any:
        return templates.TemplateResponse(request, "status.html", {"s": status_of(store, clock())})

    @app.get("/status.json")
    def data() -> Any:
        return JSONResponse(status_of(store, clock()))

    @app.get("/healthz", response_class=PlainTextResponse)
    def healthz() -> str:
        return "ok"

    registry = CollectorRegistry()
    name_process(registry, "status")

    @app.get("/metrics")
    def metrics() -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/readyz", response_class=PlainTextResponse)
    def readyz() -> Any:
        try:
            store.pools()
        except Exception as e:  # the database does not answer: not ready
            return PlainTextResponse(f"fleet state: {type(e).__name__}", status_code=503)
        return "ok"

    return app


def _when(t: float | None) -> str:
    return "—" if t is None else utc(t)


def _num(v: float | None, digits: int = 3) -> str:
    return "—" if v is None else f"{v:.{digits}g}"
