"""What bench/slurm_replay.py does to the Nova test stack as the trace plays:
each hall's spot capacity set in Placement, notices written, servers deleted."""

from __future__ import annotations

from typing import Any

from sco.adapters.openstack.resources import META_CLASS, META_RECLAIM_AT
from sco_harness.openstack_stack import NovaStack
from slurmreplaylib.slurmside import log


class Placement:
    """Each hall's spot capacity, as `reserved` CUSTOM_SPOT_SLOT on its computes."""

    RC = "CUSTOM_SPOT_SLOT"

    def __init__(self, stack: NovaStack) -> None:
        self.stack, self.api = stack, stack.conn.placement
        self.want: dict[str, int] = {}  # hall -> spot capacity
        self.rps = {
            h: self._get(f"/resource_providers?name={h}")["resource_providers"][0]["uuid"]
            for hosts in stack.halls.values() for h in hosts
        }  # fmt: skip

    def _get(self, path: str) -> Any:
        r = self.api.get(path, microversion="1.39")
        if r.status_code != 200:
            raise RuntimeError(f"placement GET {path}: HTTP {r.status_code}: {r.text[:200]}")
        return r.json()

    def apply(self, hall: str) -> None:
        """Spread the hall's capacity over its computes, those in use first."""
        hosts = self.stack.halls[hall]
        inv, used = {}, {}
        for h in hosts:
            inv[h] = self._get(f"/resource_providers/{self.rps[h]}/inventories/{self.RC}")
            used[h] = int(self._get(f"/resource_providers/{self.rps[h]}/usages")["usages"]
                          .get(self.RC, 0))  # fmt: skip
        left = self.want.get(hall, sum(i["total"] for i in inv.values()))
        cap = dict.fromkeys(hosts, 0)
        for h in sorted(hosts, key=lambda h: -used[h]):
            cap[h] = min(used[h], inv[h]["total"], left)
            left -= cap[h]
        for h in hosts:
            more = min(inv[h]["total"] - cap[h], left)
            cap[h], left = cap[h] + more, left - more
        for h in hosts:
            reserved = inv[h]["total"] - cap[h]
            if inv[h]["reserved"] != reserved:
                body = {**inv[h], "reserved": reserved}
                path = f"/resource_providers/{self.rps[h]}/inventories/{self.RC}"
                r = self.api.put(path, json=body, microversion="1.39")
                if r.status_code != 200:  # 409: Nova wrote it meanwhile: read it again
                    raise RuntimeError(f"placement: {h} reserved={reserved}: {r.status_code}")

    def set(self, want: dict[str, int]) -> Placement:
        self.want = dict(want)
        for hall in self.stack.halls:
            self.apply(hall)
        return self


def spot_servers(stack: NovaStack, hall: str, deleted: set[str]) -> list[dict[str, Any]]:
    return [
        s for s in stack.servers(tags="sco")
        if s.get("OS-EXT-AZ:availability_zone") == hall and s["id"] not in deleted
        and (s.get("metadata") or {}).get(META_CLASS) == "spot" and s.get("status") != "ERROR"
    ]  # fmt: skip


def notice(stack: NovaStack, sid: str, deadline: float) -> bool:
    r = stack.conn.compute.put(
        f"/servers/{sid}/metadata/{META_RECLAIM_AT}",
        json={"meta": {META_RECLAIM_AT: f"{deadline:.2f}"}}, microversion="2.90",
    )  # fmt: skip
    if r.status_code != 200:
        log(f"notice to {sid}: HTTP {r.status_code}")
    return r.status_code == 200


def delete(stack: NovaStack, sid: str, deleted: set[str]) -> None:
    deleted.add(sid)
    r = stack.conn.compute.delete(f"/servers/{sid}", microversion="2.90")
    if r.status_code not in (204, 404):
        log(f"reclaim of {sid}: HTTP {r.status_code}")
