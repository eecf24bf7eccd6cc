"""Fleet state as the operator's commands reach it (`sco explain`, `sco pools`,
`sco status`, `sco handback`, `sco tokens rotate`, `sco config migrate`): through
its ports, by role, never the database adapter itself."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Protocol

from sco.adapters.sqlstate import DatabaseError
from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco.assembly.settings import Settings
from sco.assembly.wiring import StartError, open_store
from sco.ports import Contracts, FleetReads, FleetStore

__all__ = ["Fleet", "StateUnreadable", "open_fleet", "reading", "sqlite_url"]


class Fleet(FleetStore, FleetReads, Protocol):
    """Every role of fleet state an operator's command may use."""

    @property
    def contracts(self) -> Contracts: ...

    def schema_revision(self) -> str | None:
        """The schema revision the database stands at."""
        ...

    def close(self) -> None: ...


class StateUnreadable(StartError):
    """Fleet state cannot be read: no such file, or the database failed; the message
    names the option or setting it came from."""


def open_fleet(settings: Settings, run_migrations: bool = True, patient: bool = False) -> Fleet:
    """Fleet state as `state.url` says (StartError naming it when it cannot be reached;
    a `patient` opener waits `state.start_wait_s` for it)."""
    return open_store(settings, run_migrations=run_migrations, patient=patient)


@contextmanager
def reading(url: str, where: str = "--state") -> Iterator[Fleet]:
    """Fleet state at `url` opened to read (no schema change, no file created): a
    failure of the database, opening it or within the block, is `StateUnreadable`
    naming `where` (the option or setting the URL came from)."""
    path = url.removeprefix("sqlite:///").partition("?")[0]
    if url.startswith("sqlite:///") and not Path(path).is_file():  # opening creates it empty
        raise StateUnreadable(f"{where}: {path}: no such file")
    try:
        store = SqlFleetStore(url, run_migrations=False)
    except DatabaseError as e:
        raise StateUnreadable(f"{where}: cannot read fleet state: {type(e).__name__}") from e
    try:
        yield store
    except DatabaseError as e:
        raise StateUnreadable(f"{where}: cannot read fleet state: {type(e).__name__}") from e
    finally:
        store.close()
