"""The provider spec of placement_load.py: its JSON checked and normalised.

`validate(spec)` returns one record per provider (uuid, name, parent,
inventories with Placement's defaults filled in, traits, aggregates, usages,
consumer) or raises SpecError on anything Placement would refuse, before the
loader touches the database. See placement_load.py for the format.
"""

from __future__ import annotations

import sys
import uuid as uuidlib
from typing import Any

MAX_INT = 2147483647
SQL_SP_FLOAT_MAX = 3.40282e38
INVENTORY_DEFAULTS: dict[str, Any] = {
    "reserved": 0,
    "min_unit": 1,
    "max_unit": MAX_INT,
    "step_size": 1,
    "allocation_ratio": 1.0,
}
INT_FIELDS = {
    "total": 1,
    "reserved": 0,
    "min_unit": 1,
    "max_unit": 1,
    "step_size": 1,
}


class SpecError(Exception):
    pass


def _canon_uuid(value: Any, what: str) -> str:
    try:
        return str(uuidlib.UUID(str(value)))
    except ValueError:
        raise SpecError(f"{what}: not a UUID: {value!r}") from None


def validate(spec: Any) -> list[dict[str, Any]]:
    """Normalise the spec; raise SpecError on anything Placement would refuse."""
    if not isinstance(spec, list):
        raise SpecError("SPEC must be a JSON list of providers")
    out: list[dict[str, Any]] = []
    seen_uuid: set[str] = set()
    seen_name: set[str] = set()
    for i, p in enumerate(spec):
        where = f"provider #{i}"
        if not isinstance(p, dict) or "uuid" not in p:
            raise SpecError(f"{where}: needs an object with a 'uuid'")
        u = _canon_uuid(p["uuid"], where)
        where = f"provider {u}"
        name = str(p.get("name") or u)
        if len(name) > 200:
            raise SpecError(f"{where}: name longer than 200 characters")
        if u in seen_uuid:
            raise SpecError(f"{where}: duplicate uuid")
        if name in seen_name:
            raise SpecError(f"{where}: duplicate name {name!r}")
        seen_uuid.add(u)
        seen_name.add(name)
        parent = p.get("parent_provider_uuid")
        parent = _canon_uuid(parent, where) if parent else None
        if parent == u:
            raise SpecError(f"{where}: is its own parent")

        invs: dict[str, dict[str, Any]] = {}
        for rc, inv in (p.get("inventories") or {}).items():
            if not isinstance(inv, dict) or "total" not in inv:
                raise SpecError(f"{where}: inventory {rc} needs 'total'")
            extra = set(inv) - set(INT_FIELDS) - {"allocation_ratio"}
            if extra:
                raise SpecError(f"{where}: inventory {rc}: unknown fields {sorted(extra)}")
            full = dict(INVENTORY_DEFAULTS)
            full.update(inv)
            for field, lo in INT_FIELDS.items():
                v = full[field]
                if not isinstance(v, int) or isinstance(v, bool) or not lo <= v <= MAX_INT:
                    raise SpecError(
                        f"{where}: inventory {rc}.{field}={v!r} not an int in [{lo}, {MAX_INT}]"
                    )
            ratio = full["allocation_ratio"]
            if (
                not isinstance(ratio, (int, float))
                or isinstance(ratio, bool)
                or ratio > SQL_SP_FLOAT_MAX
            ):
                raise SpecError(f"{where}: inventory {rc}.allocation_ratio={ratio!r} invalid")
            full["allocation_ratio"] = float(ratio)
            if int((full["total"] - full["reserved"]) * full["allocation_ratio"]) < 0:
                raise SpecError(f"{where}: inventory {rc}: reserved exceeds capacity")
            invs[rc] = full

        usages: dict[str, int] = {}
        for rc, used in (p.get("usages") or {}).items():
            if not isinstance(used, int) or isinstance(used, bool) or not 0 <= used <= MAX_INT:
                raise SpecError(f"{where}: usage {rc}={used!r} not an int >= 0")
            if rc not in invs:
                raise SpecError(f"{where}: usage of {rc} without an inventory of it")
            if used == 0:  # placement does not store zero allocations
                continue
            inv = invs[rc]
            cap = int((inv["total"] - inv["reserved"]) * inv["allocation_ratio"])
            if used > cap:
                print(
                    f"placement_load: warning: {where}: {rc} usage {used} > capacity {cap}",
                    file=sys.stderr,
                )
            usages[rc] = used

        traits = sorted(set(p.get("traits") or []))
        aggs = sorted({_canon_uuid(a, f"{where} aggregate") for a in (p.get("aggregates") or [])})
        consumer = p.get("consumer_uuid")
        consumer = _canon_uuid(consumer, f"{where} consumer_uuid") if consumer else None
        out.append(
            {
                "uuid": u,
                "name": name,
                "parent": parent,
                "inventories": invs,
                "traits": traits,
                "aggregates": aggs,
                "usages": usages,
                "consumer": consumer,
            }
        )
    return out
