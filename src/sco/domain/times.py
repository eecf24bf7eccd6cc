"""How sco writes a moment for people: ISO 8601 in UTC, to the second
(`2026-12-03T22:06:11Z`). Epoch seconds stay in JSON and in the database."""

from __future__ import annotations

from datetime import UTC, datetime


def utc(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
