"""Fleet state's rows as they stand, read by an auditor (the swarm's invariant
checks), not by the control plane: every transition in the order written, every
instance's server and state."""

from __future__ import annotations

from sqlalchemy import select

from sco.adapters.sqlstate import schema as t
from sco.adapters.sqlstate.store import SqlFleetStore


def transitions(store: SqlFleetStore) -> list[tuple[str, str | None, str, str | None]]:
    """(instance, from_state, to_state, trigger) of every history row, oldest first."""
    h = t.instance_history.c
    q = select(h.instance_id, h.from_state, h.to_state, h.trigger).order_by(h.id)
    with store.engine.connect() as conn:
        return [(r[0], r[1], r[2], r[3]) for r in conn.execute(q)]


def lives(store: SqlFleetStore) -> list[tuple[str, str | None, str]]:
    """(instance, server_id, state) of every instance record."""
    i = t.instances.c
    with store.engine.connect() as conn:
        return [(r[0], r[1], r[2]) for r in conn.execute(select(i.id, i.server_id, i.state))]


def state_of_server(store: SqlFleetStore, server_id: str) -> str | None:
    """The state of the record that names `server_id`, if one does."""
    i = t.instances.c
    with store.engine.connect() as conn:
        state = conn.execute(select(i.state).where(i.server_id == server_id)).scalar()
    return str(state) if state is not None else None
