"""A port that cannot be had stops a command at start with exit 2 and one line naming
the setting and who holds the port (issue 28: `sco watch` exited 1, `sco status` 3
after "Application startup complete", a second `sco run` said only "address
already in use")."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from sco.adapters.sqlstate.engine import sqlite_url
from sco.adapters.sqlstate.store import SqlFleetStore
from sco_harness.openstack_stack import free_port
from sco_harness.services import answered

HOLD = "address already in use"


def sco(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sco.apps.cli", *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


@pytest.fixture
def state(tmp_path: Path) -> str:
    path = tmp_path / "state.sqlite"
    SqlFleetStore(sqlite_url(path)).close()
    return str(path)


@pytest.fixture
def watching(state: str) -> Iterator[int]:
    """`sco watch` serving its /metrics on a port of its own; yields the port."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sco.apps.cli", "watch", "--state", state, "--port", str(port)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        metrics = answered(f"http://127.0.0.1:{port}/metrics", proc).decode()
        assert 'sco_process_info{component="watch"} 1.0' in metrics
        yield port
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def refused(*args: str) -> tuple[str, str]:
    """A command that must stop at start with exit 2: (its last line, all it said)."""
    out = sco(*args)
    assert out.returncode == 2, out.stderr
    return out.stderr.strip().splitlines()[-1], out.stderr


def test_the_same_command_twice_is_named(state: str, watching: int) -> None:
    said, _ = refused("watch", "--state", state, "--port", str(watching))
    assert said == (
        f"sco: error: http.watch_port: cannot listen on 0.0.0.0:{watching}: {HOLD}: "
        "another sco watch is already running on this port"
    )


def test_another_sco_command_on_the_port_is_named(state: str, watching: int) -> None:
    said, everything = refused("status", "--state", state, "--port", str(watching))
    assert said == (
        f"sco: error: http.status_port: cannot listen on 127.0.0.1:{watching}: {HOLD}: "
        "sco watch listens there; give each sco process its own port"
    )
    assert "startup complete" not in everything


def test_a_port_held_by_another_program(state: str) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        for args, key in (
            (("watch", "--port", str(port)), "http.watch_port"),
            (("status", "--port", str(port)), "http.status_port"),
        ):
            said, _ = refused(*args, "--state", state)
            assert said.startswith(f"sco: error: {key}: cannot listen on "), said
            assert said.endswith(f":{port}: {HOLD} (by a program other than sco, or one that "
                                 "does not answer)"), said  # fmt: skip
