"""Fixtures shared by several test modules."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from sco.adapters.sqlstate.engine import sqlite_url
from sco_harness import services
from sco_harness.openstack_stack import NovaStack, echo
from sco_harness.postgres import PostgresServer

# The halls of the Nova test stack the OpenStack, Slurm, Kubernetes, contract and
# security tiers share: two computes each, four spot slots a compute.
NOVA_HALLS = {"hall-a": ["a1", "a2"], "hall-b": ["b1", "b2"]}
NOVA_SLOTS = 4


def pytest_configure(config: pytest.Config) -> None:
    """SIGTERM and SIGHUP end the session as Ctrl-C does, fixtures torn down (by
    default they kill pytest at once, and every service a fixture started stays up).
    The commands the tests run keep their independent runs in their own process
    (`SCO_WORKERS=1`) unless a test asks for more: the suite already runs on every
    core, and workers of workers only slowed the service tests beside them."""
    services.install()
    os.environ.setdefault("SCO_WORKERS", "1")


# The modules on the shared Nova stack. Under xdist they are one unit of work on one
# worker (the session starts one stack there), begun first: it is the longest.
NOVA_MODULES = frozenset(
    {
        "test_benches_services.py",
        "test_contracts_e2e.py",
        "test_kubernetes_e2e.py",
        "test_openstack_nova.py",
        "test_provider.py",  # tests/conformance/: the provider suite's Nova half
        "test_security.py",
        "test_slurm.py",
    }
)


def _on_stack(nodeid: str) -> bool:
    return Path(nodeid.split("::", 1)[0]).name in NOVA_MODULES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules on the shared Nova stack run one after another: first under xdist,
    so the longest unit of work starts at once; last in a plain run, so none of the
    other tests (some with Nova stacks of their own) runs beside the stack."""
    for item in items:
        if "nova_stack" in getattr(item, "fixturenames", ()) and not _on_stack(item.nodeid):
            raise pytest.UsageError(
                f"{item.nodeid} uses the shared Nova stack: list its module in NOVA_MODULES"
            )
    first = bool(os.environ.get("PYTEST_XDIST_WORKER"))
    order = {id(item): n for n, item in enumerate(items)}
    items.sort(key=lambda i: (_on_stack(i.nodeid) != first, order[id(i)]))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed test on the shared Nova stack carries what of the stack died, if any."""
    report = yield
    values = getattr(item, "funcargs", {})
    stack = values.get("nova_stack") or values.get("stack")
    if report.failed and isinstance(stack, NovaStack):
        died = stack.diagnosis()
        if died:
            report.sections.append(("the shared Nova stack", died))
    return report


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist hands out whole modules, and the Nova stack's modules as one."""
    from xdist.scheduler import LoadScopeScheduling

    class ByModule(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return "nova-stack" if _on_stack(nodeid) else nodeid.split("::", 1)[0]

    return ByModule(config, log)


def _load_bench(name: str) -> ModuleType:
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    # Registered first: dataclasses resolve string annotations through sys.modules.
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def bench() -> Callable[[str], ModuleType]:
    """A program of bench/ as a module: the tiers whose services a bench needs run its
    measure at a smoke size on their own services."""
    return _load_bench


@pytest.fixture(scope="session")
def chdb_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """chDB runs one engine path per process: every test gets its own database in it."""
    return tmp_path_factory.mktemp("chdb")


@pytest.fixture(scope="session")
def kafka_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Kafka-protocol broker for the session (tansu, in memory): its bootstrap
    address. Fails, never skips, when it cannot start; tests keep to topics of their own."""
    from sco_harness.kafka_broker import TansuBroker

    try:
        broker = TansuBroker(tmp_path_factory.mktemp("tansu")).start()
    except RuntimeError as e:
        pytest.fail(str(e))
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL for the session, started from the installed server binaries."""
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def nova_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NovaStack]:
    """One Nova test stack for the session (starting one takes most of a minute)."""
    port = int(os.environ.get("SCO_TEST_OS_BASE_PORT", "18800"))
    s = NovaStack(tmp_path_factory.mktemp("nova"), port, NOVA_HALLS, NOVA_SLOTS)
    started = time.monotonic()
    try:
        s.up()
        echo(f"nova stack ready in {time.monotonic() - started:.1f} s")
        yield s
    finally:
        s.down()


@pytest.fixture(scope="module")
def stack(nova_stack: NovaStack) -> Iterator[NovaStack]:
    """The shared Nova stack, empty for the module and left empty after it. A stack one
    of whose services died under an earlier module is said so and started again: the
    failure stays that module's, and what died is in the log."""
    died = nova_stack.revive()
    if died:
        echo(f"the shared Nova stack was started again:{died}")
    nova_stack.clear()
    yield nova_stack
    nova_stack.clear()


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
