"""Fixtures shared by several test modules."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """chDB runs one engine path per process: every test gets its own database in it."""
    return tmp_path_factory.mktemp("chdb")
