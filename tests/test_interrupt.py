"""Nothing is left running when a bench or a test session is interrupted (issue 17).

Each case starts, in a child process, something that brings up real services,
waits until they are up, signals the child once, waits for it to exit, and
then looks for what is left: any process seen during the run (a process whose
command line, working directory or environment names the run's folder, one
listening on the run's ports, a descendant of the child, or any process in the
session of one of those: gunicorn workers, Erlang's helpers), any process
naming the folder now, and the run's fixed ports still listening.

- SIGTERM (what `timeout`, `kill` and orchestrators send) to
  `bench/openstack_tier.py` while the Nova stack's computes are being added:
  MariaDB, RabbitMQ and epmd, every Nova service, Glance, Neutron, Placement.
- SIGINT to `bench/failover.py` while its Patroni cluster is starting: etcd,
  two Patroni and their PostgreSQL.
- SIGTERM to a pytest session holding the `postgres` session fixture.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOVA_BASE_PORT = int(os.environ.get("SCO_TEST_INTERRUPT_OS_BASE_PORT", "19540"))


def _session(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[4])  # state, ppid, pgrp, session


def _names(proc: psutil.Process, folder: str) -> bool:
    """Whether the process's command line, working directory or environment names `folder`."""
    with contextlib.suppress(psutil.Error):
        if folder in " ".join(proc.cmdline()):
            return True
    with contextlib.suppress(psutil.Error):
        if proc.cwd().startswith(folder):
            return True
    with contextlib.suppress(psutil.Error):
        return any(folder in v for v in proc.environ().values())
    return False


def _listening(ports: Iterable[int]) -> dict[int, int | None]:
    want = set(ports)
    return {
        c.laddr.port: c.pid
        for c in psutil.net_connections("inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port in want
    }


@dataclass
class Watch:
    """What a child process and its services are: every process seen, by (pid, start time)."""

    child: subprocess.Popen[bytes]
    ports: tuple[int, ...] = ()
    folders: list[str] = field(default_factory=list)
    seen: dict[int, tuple[float, str]] = field(default_factory=dict)

    def look(self) -> None:
        mine = {psutil.Process().pid, *(p.pid for p in psutil.Process().parents())}
        found: set[int] = set()
        with contextlib.suppress(psutil.Error):
            parent = psutil.Process(self.child.pid)
            found |= {parent.pid, *(p.pid for p in parent.children(recursive=True))}
        procs = list(psutil.process_iter())
        for p in procs:
            if any(_names(p, f) for f in self.folders):
                found.add(p.pid)
        found |= {pid for pid in _listening(self.ports).values() if pid}
        sessions = {s for s in map(_session, found) if s is not None}
        sessions -= {_session(pid) for pid in mine}
        found |= {p.pid for p in procs if _session(p.pid) in sessions}
        for pid in found - mine:
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                self.seen.setdefault(pid, (p.create_time(), " ".join(p.cmdline())))

    def until(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            self.look()
            if ready():
                return
            if self.child.poll() is not None:
                raise AssertionError(f"the child exited ({self.child.returncode}) before {what}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no {what} after {timeout_s:.0f} s")
            time.sleep(0.3)

    def alive(self) -> list[str]:
        out = []
        for pid, (started, cmd) in sorted(self.seen.items()):
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if p.create_time() == started and p.status() != psutil.STATUS_ZOMBIE:
                    out.append(f"{pid} {cmd[:200]}")
        return out

    def left(self) -> list[str]:
        """What is still there: processes seen, processes naming a folder, ports listening."""
        named = [
            f"{p.pid} names the run's folder: {' '.join(p.cmdline())[:200]}"
            for p in psutil.process_iter()
            if p.pid != os.getpid() and any(_names(p, f) for f in self.folders)
        ]
        ports = [
            f"port {port} listening (pid {pid})" for port, pid in _listening(self.ports).items()
        ]
        return self.alive() + named + ports

    def kill_left(self) -> None:
        """The test's own leftovers, so a failure does not leave them to the next run."""
        for pid, (started, _) in self.seen.items():
            with contextlib.suppress(psutil.Error):
                p = psutil.Process(pid)
                if p.create_time() == started:
                    p.kill()
        for p in psutil.process_iter():
            if p.pid != os.getpid() and any(_names(p, f) for f in self.folders):
                with contextlib.suppress(psutil.Error):
                    p.kill()


def _interrupt(watch: Watch, sig: signal.Signals, log: Path) -> int:
    """Signal the child, wait for it, and give orphans a moment to be reaped."""
    watch.look()
    watch.child.send_signal(sig)
    try:
        code = watch.child.wait(timeout=240)
    except subprocess.TimeoutExpired:
        # SIGABRT makes the child's faulthandler (on: see `_start`) write where every
        # thread of it is stuck into its log, for the failure message.
        watch.child.send_signal(signal.SIGABRT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            watch.child.wait(timeout=10)
        watch.child.kill()
        raise AssertionError(
            f"still running 240 s after {sig.name}; processes: {watch.alive()}\n{_tail(log, 80)}"
        ) from None
    deadline = time.monotonic() + 60  # a loaded machine reaps slowly; done sooner if so
    while watch.left() and time.monotonic() < deadline:
        time.sleep(0.5)
    return code


def _tail(log: Path, lines: int = 40) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])


def _start(
    args: list[str], log: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    # A session of its own, as a shell gives a job: the signal reaches the child only.
    # SIGINT as a terminal's Ctrl-C finds it: a suite started in the background by a
    # shell without job control (`make test &`, as CI and a loaded run may be) ignores
    # SIGINT, its children inherit that, and Python then never raises KeyboardInterrupt.
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-c", _INTERRUPTIBLE, *args],
            cwd=ROOT,
            env=dict(os.environ) | {"PYTHONFAULTHANDLER": "1"} | (env or {}),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


# Runs the child in its place (same pid) with SIGINT back at its default: an ignored
# signal stays ignored across exec, a default one lets Python install its handler.
_INTERRUPTIBLE = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


def test_a_child_takes_sigint_even_when_the_suite_ignores_it(tmp_path: Path) -> None:
    """Regression: under `make test &` every SIGINT test signalled a child that ignored
    it (a bench left running 240 s after SIGINT, on a loaded run and in CI)."""
    log = tmp_path / "handler.log"
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        child = _start(["-c", "import signal; print(signal.getsignal(signal.SIGINT))"], log)
    finally:
        signal.signal(signal.SIGINT, before)
    assert child.wait(timeout=60) == 0
    assert "default_int_handler" in log.read_text(), log.read_text()


def test_sigterm_stops_the_nova_stack_of_a_bench(tmp_path: Path) -> None:
    folder = tmp_path / "work"
    log = tmp_path / "bench.log"
    child = _start(
        ["bench/openstack_tier.py", "--servers", "2", "--providers", "20", "--repeats", "1",
         "--workdir", str(folder)],
        log,
        {"SCO_BENCH_OS_BASE_PORT": str(NOVA_BASE_PORT)},
    )  # fmt: skip
    watch = Watch(child, tuple(range(NOVA_BASE_PORT, NOVA_BASE_PORT + 8)), [str(folder)])
    try:

        def computes_starting() -> bool:
            return any(
                "nova-compute" in cmd and str(folder) in cmd for _, cmd in watch.seen.values()
            )

        watch.until(computes_starting, 900, "nova-compute started")
        time.sleep(1.0)
        code = _interrupt(watch, signal.SIGTERM, log)
        left = watch.left()
        assert not left, "left running after SIGTERM:\n" + "\n".join(left) + "\n" + _tail(log)
        assert code == 128 + signal.SIGTERM, _tail(log)
        assert len(watch.seen) > 15, sorted(c for _, c in watch.seen.values())
    finally:
        watch.kill_left()


def test_sigint_stops_a_half_started_patroni_cluster(tmp_path: Path) -> None:
    log = tmp_path / "bench.log"
    # Writing for an hour after the failover: the bench ends only by the signal, however
    # slow the machine (with 5 s, and issue 25's loaded run even with 120 s, a slow look
    # at the processes found it finished and the signal landed on nothing).
    watch = Watch(_start(["bench/failover.py", "--after-s", "3600"], log))
    try:

        def patroni_folder() -> bool:
            for _, cmd in watch.seen.values():
                if cmd.startswith("etcd ") and "--data-dir" in cmd:
                    data = cmd.split("--data-dir", 1)[1].split()[0]
                    watch.folders = [str(Path(data).parent)]
                    return True
            return False

        watch.until(patroni_folder, 900, "etcd started")

        def postgres_running() -> bool:
            return any("postgres" in c and "-D" in c for _, c in watch.seen.values())

        watch.until(postgres_running, 120, "a Patroni PostgreSQL running")
        code = _interrupt(watch, signal.SIGINT, log)
        left = watch.left()
        assert not left, "left running after SIGINT:\n" + "\n".join(left) + "\n" + _tail(log)
        assert code != 0, _tail(log)
    finally:
        watch.kill_left()


def test_sigterm_tears_down_a_pytest_sessions_fixtures(tmp_path: Path) -> None:
    inner = tmp_path / "test_hold.py"
    inner.write_text(
        "import time\n\n\n"
        "def test_hold(postgres):\n"
        "    print(f'READY {postgres.folder} {postgres.port}', flush=True)\n"
        "    time.sleep(600)\n"
    )
    log = tmp_path / "pytest.log"
    # The project's conftest, as a plugin: its fixtures and its hooks.
    args = ["-m", "pytest", "-p", "conftest", "-s", "-q", "-c", os.devnull, "--rootdir",
            str(tmp_path), "-p", "no:cacheprovider", str(inner)]  # fmt: skip
    path = os.pathsep.join(filter(None, [str(ROOT / "tests"), os.environ.get("PYTHONPATH")]))
    watch = Watch(_start(args, log, {"PYTHONPATH": path}))
    try:

        def ready() -> bool:
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith("READY "):
                    _, folder, port = line.split()
                    watch.folders, watch.ports = [folder], (int(port),)
                    return True
            return False

        watch.until(ready, 600, "the postgres fixture up")
        watch.look()
        assert any("postgres" in cmd for _, cmd in watch.seen.values()), watch.seen
        code = _interrupt(watch, signal.SIGTERM, log)
        left = watch.left()
        assert not left, "left running after SIGTERM:\n" + "\n".join(left) + "\n" + _tail(log)
        assert code == pytest.ExitCode.INTERRUPTED, _tail(log)
    finally:
        watch.kill_left()
