"""Batch workloads in the Standard Workload Format (SWF) of the Parallel Workloads
Archive: one job per line, 18 whitespace-separated fields, -1 where unknown, and
header comments starting with ';'.

Real logs are messy. Every job is either kept, perhaps amended, or left out, by
one of the rules below, and counted under the rule's name (`Workload.rules`);
reading never stops at a bad line.

Left out:
- `malformed`: not 18 numbers;
- `cancelled`: cancelled (status 5) before it ran;
- `no_run_time`: ran for 0 s or an unknown time (no work to place);
- `no_size`: neither the processors it asked for nor those it got are known;
- `wider_than_cluster`: needs more nodes than the cluster can ever have;
- `beyond_window`: submitted after the window asked for (`days`).
Kept, amended:
- `no_requested_time`: its time limit is unknown: its run time stands for it;
- `ran_past_request`: it ran longer than it asked for (the log says it did): its
  time limit is raised to its run time.

A job's node count is its processors (asked for; else given) over the
processors of a node, rounded up: `procs_per_node`, else the header's
MaxProcs / MaxNodes, else 1. The cluster's most nodes are `max_nodes`, else the
header's MaxNodes, else no limit (`Workload.max_nodes` is then its widest job).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

FIELDS = 18
CANCELLED = 5
LEFT_OUT = (
    "malformed",
    "cancelled",
    "no_run_time",
    "no_size",
    "wider_than_cluster",
    "beyond_window",
)
AMENDED = ("no_requested_time", "ran_past_request")


class WorkloadError(ValueError):
    """The file cannot be read as a workload at all (missing, or no job kept)."""


@dataclass(frozen=True, slots=True)
class BatchJob:
    job_id: int
    submit_s: float  # from the workload's first submission
    nodes: int
    run_s: float  # the work it needs, on all its nodes at once
    limit_s: float  # its time limit (what backfill plans with), >= run_s


@dataclass
class Workload:
    jobs: list[BatchJob]
    procs_per_node: int
    max_nodes: int = 0  # the cluster's most nodes (given, the header's, or the widest job)
    rules: Counter[str] = field(default_factory=Counter)  # rule name -> jobs it took
    lines: int = 0  # job lines read (comments and blank lines aside)

    @property
    def span_s(self) -> float:
        return max((j.submit_s for j in self.jobs), default=0.0)

    def summary(self) -> dict[str, int]:
        return {"jobs_read": self.lines, "jobs_kept": len(self.jobs), **dict(self.rules)}


def read_swf(
    path: Path,
    max_nodes: int | None = None,
    days: float | None = None,
    procs_per_node: int | None = None,
) -> Workload:
    """The jobs of an SWF file a cluster of at most `max_nodes` nodes could run, by
    submission time, from the first submission (shifted to 0)."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError as e:
        raise WorkloadError(f"{path}: {e.strerror or e}") from None
    if max_nodes is not None and max_nodes < 1:
        raise WorkloadError(f"--max-nodes: must be >= 1, got {max_nodes}")
    if procs_per_node is not None and procs_per_node < 1:
        raise WorkloadError(f"--procs-per-node: must be >= 1, got {procs_per_node}")
    if days is not None and days <= 0:
        raise WorkloadError(f"--days: must be > 0, got {days}")
    lines = text.splitlines()
    header = _header(lines)
    ppn = procs_per_node or _procs_per_node(header)
    cap = max_nodes or _int(header.get("maxnodes")) or None
    workload = Workload([], ppn)
    rows = list(_rows(lines, workload.rules))
    workload.lines = len(rows) + workload.rules["malformed"]
    first = min((r[1] for r in rows if r[1] >= 0), default=0.0)
    window = None if days is None else days * 86400.0
    for row in rows:
        job = _job(row, first, ppn, cap, window, workload.rules)
        if job is not None:
            workload.jobs.append(job)
    if not workload.jobs:
        raise WorkloadError(f"{path}: no job to replay ({_said(workload)})")
    workload.jobs.sort(key=lambda j: (j.submit_s, j.job_id))
    workload.max_nodes = cap or max(j.nodes for j in workload.jobs)
    return workload


def _said(w: Workload) -> str:
    counts = ", ".join(f"{k} {v}" for k, v in sorted(w.rules.items()))
    return f"{w.lines} job lines" + (f": {counts}" if counts else "")


def _header(lines: Iterable[str]) -> dict[str, str]:
    header: dict[str, str] = {}
    for line in lines:
        if not line.startswith(";"):
            continue
        key, sep, value = line[1:].partition(":")
        if sep:
            header[key.strip().lower()] = value.strip()
    return header


def _int(text: str | None) -> int:
    """A positive header number, or 0."""
    try:
        return max(0, int(text or ""))
    except ValueError:
        return 0


def _procs_per_node(header: dict[str, str]) -> int:
    procs, nodes = _int(header.get("maxprocs")), _int(header.get("maxnodes"))
    return max(1, procs // nodes) if procs and nodes else 1


def _rows(lines: Iterable[str], rules: Counter[str]) -> Iterable[list[float]]:
    for line in lines:
        text = line.strip()
        if not text or text.startswith(";"):
            continue
        parts = text.split()
        try:
            row = [float(p) for p in parts]
        except ValueError:
            rules["malformed"] += 1
            continue
        if len(row) != FIELDS or not all(math.isfinite(v) for v in row):
            rules["malformed"] += 1
            continue
        yield row


def _job(
    row: list[float],
    first: float,
    ppn: int,
    max_nodes: int | None,
    window: float | None,
    rules: Counter[str],
) -> BatchJob | None:
    submit, run, given, asked, limit, status = row[1], row[3], row[4], row[7], row[8], row[10]
    why = _left_out(submit, run, given, asked, status)
    if why:
        rules[why] += 1
        return None
    at = submit - first
    if window is not None and at > window:
        rules["beyond_window"] += 1
        return None
    nodes = math.ceil((asked if asked > 0 else given) / ppn)
    if max_nodes is not None and nodes > max_nodes:
        rules["wider_than_cluster"] += 1
        return None
    if limit <= 0:
        rules["no_requested_time"] += 1
        limit = run
    elif run > limit:
        rules["ran_past_request"] += 1
        limit = run
    return BatchJob(int(row[0]), at, nodes, run, limit)


def _left_out(submit: float, run: float, given: float, asked: float, status: float) -> str:
    if submit < 0:
        return "malformed"
    if status == CANCELLED and run <= 0:
        return "cancelled"
    if run <= 0:
        return "no_run_time"
    if asked <= 0 and given <= 0:
        return "no_size"
    return ""
