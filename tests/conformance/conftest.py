"""What the conformance suites share: empty fleet-state databases of each kind."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from sco.adapters.sqlstate.engine import sqlite_url

SQL_KINDS = ("sqlite", "postgresql")


@pytest.fixture
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """An empty database of a kind ("sqlite" or "postgresql"), by URL; PostgreSQL is the
    session's real server, started the first time a test asks for it."""
    made = iter(range(1_000_000))

    def make(kind: str) -> str:
        if kind == "sqlite":
            return sqlite_url(tmp_path / f"fleet{next(made)}.db")
        if kind == "postgresql":
            server = request.getfixturevalue("postgres")
            url: str = server.new_database()
            return url
        raise ValueError(f"no database of kind {kind!r}")

    return make
