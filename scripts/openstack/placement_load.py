"""Bulk-load resource providers straight into OpenStack Placement's database.

Run with the Python of the Placement venv (it needs SQLAlchemy,
os_resource_classes, os_traits and the DB driver, e.g. pymysql):

    $SCO_OPENSTACK_VENV/bin/python placement_load.py DB_URL SPEC.json

DB_URL is an SQLAlchemy URL (sqlite:////abs/placement.sqlite,
mysql+pymysql://..., postgresql+psycopg2://...) or a plain path to an SQLite
file. An empty or missing database gets the schema first (this venv's
`placement-manage db sync`, ~1 s). Placement may be stopped or running: it has
no cross-request cache of what is loaded here.

SPEC.json is a list of providers:

    {"uuid": "...", "name": "...",                 # name defaults to uuid
     "parent_provider_uuid": "...",                # optional (nested RP)
     "inventories": {"VCPU": {"total": 64, "reserved": 0,
                              "allocation_ratio": 4.0, "min_unit": 1,
                              "max_unit": 64, "step_size": 1}, ...},
     "traits": ["CUSTOM_SPOT_CAPABLE", "COMPUTE_STATUS_DISABLED"],
     "aggregates": ["<aggregate uuid>"],
     "usages": {"VCPU": 4, "MEMORY_MB": 8192},     # optional
     "consumer_uuid": "..."}                       # optional, else uuid4

Inventory fields other than total default as in Placement's API (reserved 0,
min_unit 1, max_unit 2147483647, step_size 1, allocation_ratio 1.0). Usages
become one allocation per provider, owned by one consumer per provider, all
under one project and user (--project/--user, created if missing).

Everything is written in one transaction with executemany. Prints one JSON
line: {"providers": N, "allocations": A, "seconds": S}.

Placement internals this depends on (Placement 16.0.0, schema head
b5c396305c25 / 422ece571366):
  * tables and columns of placement/db/sqlalchemy/models.py (reflected here);
  * standard resource classes live in resource_classes with id = index in
    os_resource_classes.STANDARDS (what placement's _resource_classes_sync
    inserts at start-up); custom ones get max(id) + 1, at least 10000;
  * standard traits live in traits (placement's _trait_sync inserts the
    missing os_traits names at start-up; we do the same, so both orders work);
  * a root provider has root_provider_id = id and parent_provider_id NULL;
  * an allocation needs a consumers row (uuid, project_id, user_id,
    generation, consumer_type_id NULL = "unknown"); consumers point at
    projects/users by internal id, keyed by external_id;
  * generations: provider generation = number of non-empty sections among
    inventories, traits, aggregates, allocations (as if set through the API
    one PUT each); consumer generation 1 (created at 0, bumped on write).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid as uuidlib
from typing import Any

import os_resource_classes as orc
import os_traits
import sqlalchemy as sa
from placement_spec import SpecError, validate

MIN_CUSTOM_RC_ID = 10000
TABLES = [
    "resource_providers",
    "inventories",
    "resource_classes",
    "traits",
    "resource_provider_traits",
    "placement_aggregates",
    "resource_provider_aggregates",
    "projects",
    "users",
    "consumers",
    "allocations",
]
CHUNK = 500  # max bind parameters per IN (...) lookup


def _chunks(seq: list[Any]) -> list[list[Any]]:
    return [seq[i : i + CHUNK] for i in range(0, len(seq), CHUNK)]


def _name_map(conn: sa.Connection, table: sa.Table, key: str = "name") -> dict[str, int]:
    return {r[0]: r[1] for r in conn.execute(sa.select(table.c[key], table.c.id))}


def _sync_resource_classes(
    conn: sa.Connection, t: sa.Table, needed: set[str], now: datetime.datetime
) -> dict[str, int]:
    """Standard RCs as placement's _resource_classes_sync, plus needed custom ones."""
    have = _name_map(conn, t)
    std = [
        {"id": i, "name": n, "created_at": now}
        for i, n in enumerate(orc.STANDARDS)
        if n not in have
    ]
    if std:
        if conn.dialect.name == "mysql":
            # As placement: keep id 0 (VCPU) instead of "next auto value".
            conn.execute(sa.text("SET SESSION SQL_MODE='NO_AUTO_VALUE_ON_ZERO'"))
        conn.execute(t.insert(), std)
    custom = sorted(n for n in needed if n not in have and n not in orc.STANDARDS)
    for n in custom:
        if not orc.is_custom(n):
            raise SpecError(
                f"unknown resource class {n!r} (neither os_resource_classes standard nor CUSTOM_*)"
            )
    if custom:
        max_id = conn.execute(sa.select(sa.func.max(t.c.id))).scalar() or 0
        next_id = max(max_id + 1, MIN_CUSTOM_RC_ID)
        conn.execute(
            t.insert(),
            [{"id": next_id + i, "name": n, "created_at": now} for i, n in enumerate(custom)],
        )
    return _name_map(conn, t)


def _sync_traits(
    conn: sa.Connection, t: sa.Table, needed: set[str], now: datetime.datetime
) -> dict[str, int]:
    """Standard traits as placement's _trait_sync, plus needed custom ones."""
    have = _name_map(conn, t)
    std = set(os_traits.get_traits())
    for n in needed:
        if n not in std and not os_traits.is_custom(n):
            raise SpecError(f"unknown trait {n!r} (neither os_traits standard nor CUSTOM_*)")
    missing = sorted((std | needed) - set(have))
    if missing:
        conn.execute(t.insert(), [{"name": n, "created_at": now} for n in missing])
        have = _name_map(conn, t)
    return have


def _get_or_create(
    conn: sa.Connection, t: sa.Table, external_id: str, now: datetime.datetime
) -> int:
    row = conn.execute(sa.select(t.c.id).where(t.c.external_id == external_id)).first()
    if row:
        return int(row[0])
    conn.execute(t.insert(), [{"external_id": external_id, "created_at": now}])
    return int(conn.execute(sa.select(t.c.id).where(t.c.external_id == external_id)).scalar_one())


def _db_sync(db_url: str) -> None:
    """Create Placement's schema with this venv's `placement-manage db sync`."""
    manage = os.path.join(sys.prefix, "bin", "placement-manage")
    if not os.path.exists(manage):
        raise SpecError(f"{db_url}: no Placement schema, and no {manage} to create it")
    with tempfile.TemporaryDirectory() as d:
        conf = os.path.join(d, "placement.conf")
        with open(conf, "w") as f:
            f.write(f"[placement_database]\nconnection = {db_url.replace('%', '%%')}\n")
        r = subprocess.run(
            [manage, "--config-file", conf, "db", "sync"],
            check=False,
            capture_output=True,
            text=True,
        )
    if r.returncode != 0:
        raise SpecError(f"{db_url}: placement-manage db sync failed:\n{r.stderr[-2000:]}")


def load(db_url: str, providers: list[dict[str, Any]], project: str, user: str) -> int:
    connect_args = {"timeout": 60} if db_url.startswith("sqlite") else {}
    engine = sa.create_engine(db_url, connect_args=connect_args)
    present = set(sa.inspect(engine).get_table_names())
    if not present & {"resource_providers", "alembic_version"}:
        # Empty or new database: create the schema as placement.sh up would.
        print(f"placement_load: {db_url}: no schema yet, running db sync", file=sys.stderr)
        _db_sync(db_url)
    md = sa.MetaData()
    try:
        md.reflect(engine, only=TABLES)
    except sa.exc.InvalidRequestError as e:
        raise SpecError(f"{db_url}: incomplete Placement schema ({e})") from None
    tables = md.tables
    now = datetime.datetime.now(datetime.UTC).replace(tzinfo=None)  # naive UTC like oslo

    n_alloc = 0
    with engine.begin() as conn:
        rp = tables["resource_providers"]
        uuids = [p["uuid"] for p in providers]
        for chunk in _chunks(uuids):
            dup = conn.execute(sa.select(rp.c.uuid).where(rp.c.uuid.in_(chunk)).limit(1)).first()
            if dup:
                raise SpecError(f"provider {dup[0]} already exists in the database")

        rc_ids = _sync_resource_classes(
            conn,
            tables["resource_classes"],
            {rc for p in providers for rc in p["inventories"]},
            now,
        )
        trait_ids = _sync_traits(
            conn, tables["traits"], {tr for p in providers for tr in p["traits"]}, now
        )

        agg = tables["placement_aggregates"]
        agg_ids = _name_map(conn, agg, "uuid")
        new_aggs = sorted({a for p in providers for a in p["aggregates"]} - set(agg_ids))
        if new_aggs:
            conn.execute(agg.insert(), [{"uuid": a, "created_at": now} for a in new_aggs])
            agg_ids = _name_map(conn, agg, "uuid")

        # Providers: insert with NULL root, read the ids back, then set roots.
        def gen(p: dict[str, Any]) -> int:
            return sum(1 for k in ("inventories", "traits", "aggregates", "usages") if p[k])

        if providers:
            conn.execute(
                rp.insert(),
                [
                    {
                        "uuid": p["uuid"],
                        "name": p["name"],
                        "generation": gen(p),
                        "root_provider_id": None,
                        "parent_provider_id": None,
                        "created_at": now,
                    }
                    for p in providers
                ],
            )
        rp_ids: dict[str, int] = {}
        for chunk in _chunks(uuids):
            for u, i in conn.execute(sa.select(rp.c.uuid, rp.c.id).where(rp.c.uuid.in_(chunk))):
                rp_ids[u] = i

        # Parents: in the spec or already in the DB.
        parents = {p["uuid"]: p["parent"] for p in providers if p["parent"]}
        outside = sorted(set(parents.values()) - set(rp_ids))
        db_roots: dict[str, tuple[int, int]] = {}
        for chunk in _chunks(outside):
            for u, i, r in conn.execute(
                sa.select(rp.c.uuid, rp.c.id, rp.c.root_provider_id).where(rp.c.uuid.in_(chunk))
            ):
                db_roots[u] = (i, r)
        for u in outside:
            if u not in db_roots:
                raise SpecError(f"parent provider {u} is neither in the spec nor in the database")

        def root_of(u: str) -> int:
            seen = set()
            while u in parents:
                if u in seen:
                    raise SpecError(f"parent cycle through provider {u}")
                seen.add(u)
                u = parents[u]
            return rp_ids[u] if u in rp_ids else db_roots[u][1]

        def id_of(u: str) -> int:
            return rp_ids[u] if u in rp_ids else db_roots[u][0]

        # Roots: root_provider_id = id (the same UPDATE placement's
        # set_root_provider_ids online migration runs), limited to our rows.
        for chunk in _chunks([rp_ids[p["uuid"]] for p in providers if not p["parent"]]):
            conn.execute(rp.update().where(rp.c.id.in_(chunk)).values(root_provider_id=rp.c.id))
        if parents:
            conn.execute(
                rp.update()
                .where(rp.c.id == sa.bindparam("b_id"))
                .values(
                    root_provider_id=sa.bindparam("b_root"),
                    parent_provider_id=sa.bindparam("b_parent"),
                ),
                [
                    {"b_id": rp_ids[u], "b_root": root_of(u), "b_parent": id_of(par)}
                    for u, par in parents.items()
                ],
            )

        inv_rows = [
            {
                "resource_provider_id": rp_ids[p["uuid"]],
                "resource_class_id": rc_ids[rc],
                "created_at": now,
                **inv,
            }
            for p in providers
            for rc, inv in p["inventories"].items()
        ]
        if inv_rows:
            conn.execute(tables["inventories"].insert(), inv_rows)

        trait_rows = [
            {
                "resource_provider_id": rp_ids[p["uuid"]],
                "trait_id": trait_ids[tr],
                "created_at": now,
            }
            for p in providers
            for tr in p["traits"]
        ]
        if trait_rows:
            conn.execute(tables["resource_provider_traits"].insert(), trait_rows)

        agg_rows = [
            {
                "resource_provider_id": rp_ids[p["uuid"]],
                "aggregate_id": agg_ids[a],
                "created_at": now,
            }
            for p in providers
            for a in p["aggregates"]
        ]
        if agg_rows:
            conn.execute(tables["resource_provider_aggregates"].insert(), agg_rows)

        users_of = [p for p in providers if p["usages"]]
        if users_of:
            project_id = _get_or_create(conn, tables["projects"], project, now)
            user_id = _get_or_create(conn, tables["users"], user, now)
            consumers = []
            alloc_rows = []
            for p in users_of:
                c = p["consumer"] or str(uuidlib.uuid4())
                consumers.append(
                    {
                        "uuid": c,
                        "project_id": project_id,
                        "user_id": user_id,
                        "generation": 1,
                        "consumer_type_id": None,
                        "created_at": now,
                    }
                )
                for rc, used in p["usages"].items():
                    alloc_rows.append(
                        {
                            "resource_provider_id": rp_ids[p["uuid"]],
                            "consumer_id": c,
                            "resource_class_id": rc_ids[rc],
                            "used": used,
                            "created_at": now,
                        }
                    )
            conn.execute(tables["consumers"].insert(), consumers)
            conn.execute(tables["allocations"].insert(), alloc_rows)
            n_alloc = len(alloc_rows)
    engine.dispose()
    return n_alloc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("db_url", help="SQLAlchemy URL of Placement's DB, or a path to its SQLite file")
    ap.add_argument("spec", help="JSON file with the list of providers ('-' for stdin)")
    ap.add_argument(
        "--project", default="sco-placement-load", help="external project id owning the usages"
    )
    ap.add_argument(
        "--user", default="sco-placement-load", help="external user id owning the usages"
    )
    args = ap.parse_args(argv)

    t0 = time.monotonic()
    db_url = args.db_url if "://" in args.db_url else "sqlite:///" + os.path.abspath(args.db_url)
    try:
        if args.spec == "-":
            spec = json.load(sys.stdin)
        else:
            with open(args.spec) as f:
                spec = json.load(f)
        providers = validate(spec)
        n_alloc = load(db_url, providers, args.project, args.user)
    except json.JSONDecodeError as e:
        print(f"placement_load: {args.spec}: invalid JSON: {e}", file=sys.stderr)
        return 1
    except (SpecError, OSError) as e:
        print(f"placement_load: {e}", file=sys.stderr)
        return 1
    except sa.exc.SQLAlchemyError as e:  # e.g. a name that already exists
        print(
            f"placement_load: database error, nothing loaded: {str(e).splitlines()[0][:500]}",
            file=sys.stderr,
        )
        return 1
    print(
        json.dumps(
            {
                "providers": len(providers),
                "allocations": n_alloc,
                "seconds": round(time.monotonic() - t0, 3),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
