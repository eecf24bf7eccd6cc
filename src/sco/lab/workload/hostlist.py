"""Slurm hostlists as scontrol expands them without asking slurmctld."""

from __future__ import annotations

import re

HOSTLIST_PARTS = re.compile(r"(?:[^,\[]|\[[^\]]*\])+")  # split at commas outside brackets
_RANGE = re.compile(r"^(.*?)\[([^\]]*)\](.*)$")


def expand(hostlist: str) -> list[str]:
    """`sco-a[08-10,12]x` -> sco-a08x, sco-a09x, sco-a10x, sco-a12x (widths kept)."""
    m = _RANGE.match(hostlist)
    if m is None:
        return [hostlist]
    head, ranges, tail = m.groups()
    out: list[str] = []
    for r in ranges.split(","):
        lo, _, hi = r.partition("-")
        for k in range(int(lo), int(hi or lo) + 1):
            out += [f"{head}{k:0{len(lo)}d}{rest}" for rest in expand(tail)]
    return out
