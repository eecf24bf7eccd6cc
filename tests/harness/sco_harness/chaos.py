"""Checking a cloud against the fleet state after chaos (bench/chaos.py, tests)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from sqlalchemy import create_engine, text


def audit(url: str, servers: list[dict[str, Any]]) -> dict[str, int]:
    """duplicate_creates: servers beyond their request's records; leaked_servers:
    servers with no live record (by server id, or, for a create whose servers no
    listing has shown yet, a REQUESTED record of its request, which a controller
    adopts them by); lost_transitions: breaks in a history chain, or a record whose
    state is not its last history row."""
    engine = create_engine(url)
    with engine.connect() as c:
        records = c.execute(text("SELECT id, request_id, server_id, state FROM instances")).all()
        history = c.execute(
            text("SELECT instance_id, from_state, to_state FROM instance_history ORDER BY id")
        ).all()
    per_request = Counter(r.request_id for r in records)
    by_request = Counter(s["metadata"].get("sco:request") for s in servers)
    duplicates = sum(max(0, n - per_request.get(rid, 0)) for rid, n in by_request.items())
    live = {r.server_id for r in records if r.state not in ("gone",) and r.server_id}
    waiting = {r.request_id for r in records if r.state == "requested"}
    leaked = sum(
        1
        for s in servers
        if s["id"] not in live and s["metadata"].get("sco:request") not in waiting
    )
    last: dict[str, str] = {}
    breaks = 0
    for h in history:
        if h.from_state is not None and last.get(h.instance_id) != h.from_state:
            breaks += 1
        last[h.instance_id] = h.to_state
    breaks += sum(1 for r in records if last.get(r.id) != r.state)
    return {
        "duplicate_creates": duplicates,
        "leaked_servers": leaked,
        "lost_transitions": breaks,
        "records": len(records),
        "history_rows": len(history),
    }
