"""A delete whose sender died with it unsent: the next controller of the partition
sends it again at once, not at its record's timeout."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Executor, Future
from pathlib import Path
from typing import Any

from sco.adapters.demandfile.intake import FileDemandSource
from sco.domain.lifecycle import LIVE, State
from sco_harness.builders import write_yaml
from test_controller import World


class NeverRun(Executor):
    """Workers that never get to a call: the process stops with its calls queued (as
    `sco run` drops its unsent calls when it stops)."""

    def __init__(self) -> None:
        self.queued: list[Callable[[], Any]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.queued.append(lambda: fn(*args, **kwargs))
        return Future()


def test_a_delete_that_died_unsent_is_sent_by_the_next_controller(tmp_path: Path) -> None:
    # Regression (the swarm, seed 1902): a cycle moved a server over target to
    # TERMINATING and handed its delete to the workers; the replica was restarted
    # (a rolling upgrade) before a worker took it. The next leader read the record as
    # deleted already, planned around it and created its replacements; the server
    # lived on, counted by no plan, until the record's timeout five minutes later:
    # the partition held more spot units than its max_units.
    w = World(tmp_path, target=3)
    w.controller().cycle()  # three servers asked for and building
    assert [i.state for i in w.records()] == [State.CREATING] * 3
    fewer = write_yaml(
        tmp_path / "fewer.yaml",
        {"partitions": [{"name": "p1", "kind": "slurm", "target_units": 2, "max_units": 2}]},
    )
    w.demand = FileDemandSource.load(fewer, "traces", 0.0)
    w.at(10)
    dying = NeverRun()
    w.controller(calls=dying).cycle()  # one is over target: its delete waits, and dies
    assert len(dying.queued) == 1
    terminating = [i for i in w.records() if i.state is State.TERMINATING]
    assert len(terminating) == 1
    sid = terminating[0].server_id
    assert sid is not None
    assert not w.region.is_deleting(sid)

    w.at(30)  # long before the record's timeout
    w.controller().cycle()  # the next leader, a fresh process
    assert w.region.is_deleting(sid)
    held = [v for v in w.region.list("p1") if not w.region.is_deleting(v.server_id)]
    assert len(held) == 2  # within max_units
    assert sum(1 for i in w.records() if i.state in LIVE) == 2
