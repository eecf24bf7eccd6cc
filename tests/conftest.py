"""Fixtures shared by several test modules."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sco.adapters.sqlstate.store import sqlite_url
from sco.testing import services
from sco.testing.postgres import PostgresServer


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM and SIGHUP end the session as Ctrl-C does, fixtures torn down (by
    default they kill pytest at once, and every service a fixture started stays up)."""
    services.install()


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """chDB runs one engine path per process: every test gets its own database in it."""
    return tmp_path_factory.mktemp("chdb")


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL for the session, started from the installed server binaries."""
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def fleet_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty fleet-state database: a SQLite file, then a PostgreSQL database."""
    if request.param == "sqlite":
        return sqlite_url(tmp_path / "fleet.db")
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.new_database()


_STARTED = time.time()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the artifacts tests kept this run (the status page's screenshot)."""
    folder = Path(__file__).resolve().parent.parent / "reports" / "test-artifacts"
    kept = sorted(p for p in folder.glob("*") if p.stat().st_mtime >= _STARTED)
    if kept:
        terminalreporter.write_sep("-", "test artifacts")
        for path in kept:
            terminalreporter.write_line(str(path))
