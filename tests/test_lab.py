"""`make lab`: the local cloud and sco's control plane under a supervisor, up with one
command and gone with another (issue 28: the README's recipe failed as written, and
nothing tested it)."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from sco_harness.lab_plane import ports

NOVA_BASE = int(os.environ.get("SCO_TEST_LAB_OS_BASE_PORT", "19600"))
COMPONENTS = ["distributor", "history-load", "run", "run", "status", "watch"]


def _free_base() -> int:
    """The first of 11 consecutive free ports."""
    for base in range(19900, 30000, 20):
        if all(_free(base + i) for i in range(11)):
            return base
    raise RuntimeError("no 11 free ports in a row")


def _free(port: int) -> bool:
    """Nothing listens there (closed connections waiting out TIME_WAIT do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def _lab(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "sco_harness.lab", *args, "lab", "--base-port", str(NOVA_BASE)],
        cwd=tmp, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return str(r.read().decode())


def test_make_lab_brings_up_the_control_plane_and_lab_down_leaves_nothing(
    tmp_path: Path,
) -> None:
    base = _free_base()
    up = _lab(tmp_path, "up", "--http-base", str(base))
    folder = tmp_path / "lab"
    try:
        assert up.returncode == 0, up.stderr[-3000:] + up.stdout[-3000:]
        status = ports(base)["status"]
        assert f"lab: status page   http://127.0.0.1:{status}/" in up.stdout
        assert "lab: next          .venv/bin/sco explain --config lab/sco.yaml web" in up.stdout
        said = [
            re.search(r'sco_process_info\{component="([^"]+)"\}', _get(f"http://127.0.0.1:{p}/metrics"))
            for p in ports(base).values()
        ]  # fmt: skip
        assert sorted(m.group(1) for m in said if m) == COMPONENTS
        deadline = time.monotonic() + 120
        while True:  # the replicas plan both partitions
            page = json.loads(_get(f"http://127.0.0.1:{status}/status.json"))
            if {p["partition"] for p in page["plans"]} == {"batch", "web"}:
                break
            assert time.monotonic() < deadline, page
            time.sleep(1)
        # The README's recipe, with the relative config path that once failed.
        explained = subprocess.run(
            [sys.executable, "-m", "sco.apps.cli", "explain", "--config", "lab/sco.yaml", "web"],
            cwd=tmp_path, capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert explained.returncode == 0, explained.stderr
        assert "last hour:" in explained.stdout
        again = _lab(tmp_path, "up", "--http-base", str(base))  # refused: it runs
        assert again.returncode == 1
        assert "already up" in again.stderr
        log = (folder / "lab.log").read_text()
        for name in ("run-a", "run-b", "watch", "history", "distributor", "status"):
            assert re.search(rf"^\S+ {name}\.1 +\| ", log, re.M), (name, log[-2000:])
    finally:
        down = _lab(tmp_path, "down")
    assert down.returncode == 0, down.stderr
    left = subprocess.run(
        ["pgrep", "-af", str(folder)], capture_output=True, text=True, check=False
    )
    assert left.stdout == "", left.stdout
    busy = [p for p in range(base, base + 11) if not _free(p)]
    assert busy == [], busy
