"""Slurm's own command-line tools, run with a cluster's `SLURM_CONF`.

Every call has a timeout; errors are typed by what the caller does next:
`SlurmUnavailable` (slurmctld cannot be reached, or a tool timed out: try again
later; a partition observing through it is degraded and acts on nothing),
`SlurmBadOutput` (a tool answered what cannot be read: the message names the
field), `SlurmRefused` (slurmctld refused the request; its message says why).

Slurm 22.05's JSON output ignores the tools' filters (`squeue --json` lists every
partition's jobs in every state): what sco asked for is picked out here. And with
slurmctld away, `sinfo --json` and `squeue --json` exit 0 with an empty list and
an error in the answer, and scontrol's job updates say "Unexpected message
received": both are SlurmUnavailable, as every other tool's "Unable to contact".
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sco.adapters.slurm.model import (
    Allocation,
    Job,
    SlurmBadOutput,
    SlurmNode,
    parse_allocations,
    parse_jobs,
    parse_nodes,
)


class SlurmError(Exception):
    """Base of what the Slurm tools raise."""


class SlurmUnavailable(SlurmError):
    """slurmctld cannot be reached now, or a tool did not answer in time."""


class SlurmRefused(SlurmError):
    """slurmctld refused the request."""


__all__ = [
    "ClusterTools",
    "SlurmBadOutput",
    "SlurmError",
    "SlurmRefused",
    "SlurmTools",
    "SlurmUnavailable",
]

# What the tools print when slurmctld is not there (scontrol's job updates print the
# second: a communication error's text).
_UNREACHABLE = (
    "Unable to contact slurm controller",
    "Unexpected message received",
    "Socket timed out",
    "Connection refused",
)

Runner = Callable[..., "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True, slots=True)
class ClusterTools:
    """Where a cluster's tools are and how they reach it."""

    name: str
    conf: Path | None = None  # SLURM_CONF; None: the tools' default
    bin_dir: Path | None = None  # where squeue, sinfo and scontrol are; None: PATH
    timeout_s: float = 10.0


class SlurmTools:
    def __init__(self, cluster: ClusterTools, run: Runner = subprocess.run) -> None:
        self.cluster = cluster
        self._run_fn = run
        self._env = dict(os.environ)
        if cluster.conf is not None:
            self._env["SLURM_CONF"] = str(cluster.conf)

    def _run(self, tool: str, *args: str) -> str:
        exe = str(self.cluster.bin_dir / tool) if self.cluster.bin_dir else tool
        try:
            done = self._run_fn(
                [exe, *args],
                capture_output=True,
                text=True,
                env=self._env,
                timeout=self.cluster.timeout_s,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise SlurmUnavailable(
                f"{self.cluster.name}: {tool} did not answer in {self.cluster.timeout_s:.0f}s"
            ) from None
        except FileNotFoundError:
            raise SlurmRefused(f"{self.cluster.name}: {exe} not found") from None
        if done.returncode != 0:
            err = (done.stderr or done.stdout or "").strip().splitlines()
            first = err[0] if err else f"exit status {done.returncode}"
            if any(mark in (done.stderr or "") for mark in _UNREACHABLE):
                raise SlurmUnavailable(f"{self.cluster.name}: {tool}: {first}")
            raise SlurmRefused(f"{self.cluster.name}: {tool}: {first}")
        return str(done.stdout)

    def _json(self, tool: str, *args: str) -> Any:
        out = self._run(tool, *args, "--json")
        try:
            doc = json.loads(out)
        except json.JSONDecodeError as e:
            raise SlurmBadOutput(f"{self.cluster.name}: {tool} --json: not JSON: {e}") from None
        errors = doc.get("errors") if isinstance(doc, dict) else None
        if errors and isinstance(errors, list):
            # What it could not load from slurmctld (away, or failing): nothing to read.
            raise SlurmUnavailable(
                f"{self.cluster.name}: {tool} --json: slurmctld answered nothing: "
                f"{str(errors[0])[:200]}"
            )
        return doc

    # ------------------------------------------------------------ reading

    def jobs(self, partitions: Sequence[str]) -> list[Job]:
        """Pending and running jobs of `partitions` (a job pending in several, one of
        them among `partitions`, counts)."""
        doc = self._json("squeue", "--partition", ",".join(partitions), "--states", "PD,R,CF,CG")
        wanted = set(partitions)
        return [
            j
            for j in parse_jobs(doc, f"{self.cluster.name}: squeue")
            if wanted.intersection(j.partition.split(","))
        ]

    def jobs_on(self, node: str) -> list[Job]:
        """Jobs allocated on `node` (squeue --nodelist also lists jobs that merely ask
        for it)."""
        doc = self._json("squeue", "--nodelist", node, "--states", "R,CF,CG")
        return [j for j in parse_jobs(doc, f"{self.cluster.name}: squeue") if node in j.nodes]

    def nodes(self) -> list[SlurmNode]:
        return parse_nodes(self._json("sinfo"), f"{self.cluster.name}: sinfo")

    def partitions(self) -> set[str]:
        return {line.strip().rstrip("*") for line in self._run("sinfo", "-h", "-o", "%R").split()}

    def allocations(
        self, partitions: Sequence[str], since: float, until: float
    ) -> list[Allocation]:
        """Every run of the jobs of `partitions` between `since` and `until`, from
        Slurm's accounting (slurmdbd); requeued runs included."""
        doc = self._json(
            "sacct", "--allusers", "--allocations", "--duplicates",
            "--partition", ",".join(partitions),
            "--starttime", _sacct_time(since), "--endtime", _sacct_time(until),
        )  # fmt: skip
        return parse_allocations(doc, f"{self.cluster.name}: sacct")

    def hostnames(self, hostlist: str) -> list[str]:
        """The node names of a Slurm hostlist (`scontrol show hostnames` for ranges)."""
        if "[" not in hostlist:
            return [h for h in hostlist.split(",") if h]
        return self._run("scontrol", "show", "hostnames", hostlist).split()

    # ------------------------------------------------------------ acting

    def drain(self, node: str, reason: str) -> None:
        self._run("scontrol", "update", f"nodename={node}", "state=DRAIN", f"reason={reason}")

    def requeue(self, job_ids: Sequence[int]) -> None:
        if job_ids:
            self._run("scontrol", "requeue", ",".join(str(j) for j in job_ids))

    def start_now(self, job_ids: Sequence[int]) -> None:
        """Pending jobs eligible at once (a requeue sets their begin time later)."""
        if job_ids:
            ids = ",".join(str(j) for j in job_ids)
            self._run("scontrol", "update", f"jobid={ids}", "StartTime=now")

    def delete_node(self, node: str) -> None:
        self._run("scontrol", "delete", f"nodename={node}")

    def down(self, node: str, reason: str) -> None:
        self._run("scontrol", "update", f"nodename={node}", "state=DOWN", f"reason={reason}")


def _sacct_time(t: float) -> str:
    """sacct reads local time without a zone; this process's zone is the tools' too."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(t))
