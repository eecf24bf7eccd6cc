"""The lab harness's own small rules: what `make lab` says when a process stops, and the
ports servers that restart in place are given."""

from __future__ import annotations

import socket

from sco_harness.lab_plane import first_stopped
from sco_harness.openstack_stack import steady_port

LOG = """\
03:26:28 world.1       | slurmctld: Running as primary controller
03:26:28 run-a.1       | run: waiting for the world
03:26:29 world.1       | slurmctld: fatal: slurm_init_msg_engine_port error Address already in use
03:26:29 system        | world.1 stopped (rc=1)
03:26:29 system        | sending SIGTERM to run-a.1 (pid 1790)
03:26:29 system        | run-a.1 stopped (rc=-15)
"""


def test_a_failed_start_names_the_process_that_stopped_first_with_its_last_lines() -> None:
    said = first_stopped(LOG).splitlines()
    assert said[-1] == "lab: first to stop: world.1 stopped (rc=1)"
    assert "Address already in use" in said[-2]
    assert not any("run-a.1" in line for line in said[:-1])  # only the culprit's lines


def test_a_start_where_nothing_stopped_says_so() -> None:
    assert first_stopped("03:26:28 world.1 | up\n") == "lab: no process stopped"


def test_a_steady_port_is_free_and_below_the_ephemeral_range() -> None:
    port = steady_port()
    assert 1024 < port < 32768  # no outgoing connection is given it by the kernel
    with socket.socket() as s:
        s.bind(("", port))  # free on every address, as slurmctld binds it


def test_steady_ports_given_out_are_never_given_again() -> None:
    """One service's several ports are picked before any is bound: they must differ."""
    ports = [steady_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
